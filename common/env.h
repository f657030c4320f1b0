// The one place that reads SHOAL_* configuration variables. Every other component takes typed
// options; this file maps the documented variables (README, "Configuration") onto them. (What
// a launcher tells a rank about itself is read by run/rendezvous.h.)
//
// The variables, what each accepts, and its default:
//   SHOAL_TIMEOUT              seconds, a finite number in [0.001, 1000000]          60
//   SHOAL_TRANSPORT            auto | tcp | shm                                     auto
//   SHOAL_ALLREDUCE_ALGORITHM  a name comm/ knows (checked by GroupOptions::from)   auto
//   SHOAL_SECRET               the job secret, any non-empty text (never logged)    generated
//   SHOAL_SECRET_FILE          a file holding it                                    -
//   SHOAL_ADDR                 the address this rank listens on and advertises      see below
//   SHOAL_BACKEND              native | mpi                                         native
//   SHOAL_SHM_RING_BYTES       an integer in [4096, 4294967296]                     4194304
//   SHOAL_LOG_LEVEL            error | warn | info | debug                          warn
//   SHOAL_ENCRYPT              0 | off | 1 | on | auto (common/encryption.h)         auto
//   SHOAL_TRACE                a folder: each rank writes trace.rank<R>.json there   off
//   SHOAL_TRACE_EVENTS         spans each rank keeps, an integer in [1, 16777216]     100000
//   SHOAL_FLIGHT_DIR           a folder: each rank's flight recorder, flight.rank<R>  off
//   SHOAL_FLIGHT_EVENTS        operations each recorder keeps, in [1, 1048576]         4096
//
// A variable that is set is checked, whatever its value: an empty value is an error (not
// "unset"), and so are trailing garbage, NaN, infinities and out-of-range numbers. Each error is
// one line naming the variable, its value and what it accepts (InvalidArgument).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "common/encryption.h"
#include "common/log.h"
#include "common/trace.h"

namespace shoal {

enum class TransportKind { kAuto, kTcp, kShm };

struct EnvConfig {
  double timeoutSeconds = 60.0;                    // SHOAL_TIMEOUT
  TransportKind transport = TransportKind::kAuto;  // SHOAL_TRANSPORT = auto | tcp | shm
  std::string allreduceAlgorithm = "auto";         // SHOAL_ALLREDUCE_ALGORITHM
  std::optional<std::string> secret;               // SHOAL_SECRET (never logged)
  std::optional<std::string> secretFile;           // SHOAL_SECRET_FILE
  // SHOAL_ADDR: the address this rank listens on and advertises. Unset: 127.0.0.1 on one host;
  // across hosts, shoal::init() picks the address that routes to the store.
  std::optional<std::string> listenAddress;
  std::string backend = "native";       // SHOAL_BACKEND = native | mpi
  size_t shmRingBytes = 4u << 20;       // SHOAL_SHM_RING_BYTES, per direction per pair
  LogLevel logLevel = LogLevel::kWarn;  // SHOAL_LOG_LEVEL = error | warn | info | debug
  // SHOAL_ENCRYPT: TLS on TCP links and store connections; auto encrypts what crosses hosts.
  EncryptMode encrypt = EncryptMode::kAuto;
  // SHOAL_TRACE: the timeline (README "Timeline"): every group records its operations, and
  // shoal::init()'s world writes <traceDir>/trace.rank<R>.json when it goes. Unset: no tracing.
  std::optional<std::string> traceDir;
  size_t traceEvents = kDefaultTraceEvents;  // SHOAL_TRACE_EVENTS: the ring's capacity per rank
  // SHOAL_FLIGHT_DIR: the flight recorder (README "Flight recorder"): shoal::init() keeps the
  // last flightEvents operations of every group in <flightDir>/flight.rank<R>, a file that
  // survives the process. Unset: none.
  std::optional<std::string> flightDir;
  size_t flightEvents = 4096;  // SHOAL_FLIGHT_EVENTS
};

inline constexpr double kMinTimeoutSeconds = 0.001;
// Far beyond any job, and far below where a deadline (int64 nanoseconds on the steady clock,
// about 292 years) would overflow into the past.
inline constexpr double kMaxTimeoutSeconds = 1e6;

// A variable's value: nullopt when it is not set at all; an empty string when it is set empty.
using EnvReader = std::function<std::optional<std::string>(const std::string& name)>;

// The process environment as an EnvReader.
EnvReader processEnvReader();

// Reads and validates the environment (by default, the process's). A malformed value throws
// InvalidArgument naming the variable and what it accepts; nothing is silently defaulted.
EnvConfig readEnvConfig();
EnvConfig readEnvConfig(const EnvReader& env);

// SHOAL_ENCRYPT alone (auto when unset), checked like readEnvConfig checks it: for the launcher,
// which hosts the store but runs no rank and so reads no other variable of this table.
EncryptMode readEncryptMode(const EnvReader& env);

// One line describing the resolved values (the secret shown only as set / not set).
std::string describe(const EnvConfig& config);

std::string_view toString(TransportKind kind);
TransportKind parseTransportKind(std::string_view name);

// The one number parser for configuration (variables and command-line flags). `what` names the
// setting in the error ("SHOAL_TIMEOUT", "--batch"). The whole text must be the number: no
// leading or trailing space or garbage, no empty text; parseNumber also refuses NaN and
// infinities. Out of [min, max] is an error too. Throws InvalidArgument, one line:
//   "--batch='-5': expected an integer from 1 to 1048576".
int64_t parseInteger(std::string_view what, std::string_view text, int64_t min, int64_t max);
double parseNumber(std::string_view what, std::string_view text, double min, double max);

}  // namespace shoal
