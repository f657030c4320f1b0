// The "configuration" of a run record (run/run_directory.h, README "Run directories"): what
// the job was started with, for the dashboard and `shoal report` to show, never holding a
// secret.
//
//   arguments    `shoal run`'s own arguments as given (before the program)
//   ranks, servers, ps_replicas, ps_replacements, hosts, elastic, max_restarts, timeout_s,
//   time_limit_s, grace_s, store, encrypt, trace, trace_events, flight_dir, flight_events,
//   output_dir, host_discovery_script, join_file
//                the launcher's options (null where not given)
//   backend      SHOAL_BACKEND as the ranks get it ("native" when unset)
//   environment  every SHOAL_* variable the job was started with: the launcher's environment,
//                then -x's (the later wins), as an object NAME -> value
//
// Note [Redaction]: a variable whose name says it holds a secret (SECRET, PASSWORD, PASSWD,
// TOKEN, KEY or CREDENTIAL in it, any case; not one ending in _FILE, which names a file) has
// its value written as kRedacted, in the environment and in an argument NAME=VALUE (-x
// SHOAL_SECRET=..., --env=SHOAL_SECRET=...) alike. What the launcher makes itself (the job
// secret it generates, SHOAL_RANK and the like) is not the configuration and is not written.
//
// Pure functions of their inputs; thread-safe.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace shoal::run {

struct LaunchOptions;

inline constexpr std::string_view kRedacted = "<redacted>";

// Note [Redaction]: whether the variable `name` holds a secret.
bool isSecretName(std::string_view name);

// The argument with the value of a secret NAME=VALUE in it replaced by kRedacted; else as is.
std::string redactArgument(std::string_view argument);

// The configuration object for `options`, with `environment` the launcher's own ("NAME=value"
// entries, as environ holds them).
nlohmann::json jobConfiguration(const LaunchOptions& options,
                                const std::vector<std::string>& environment);

}  // namespace shoal::run
