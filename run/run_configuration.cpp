#include "run/run_configuration.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <map>
#include <optional>

#include "common/encryption.h"
#include "run/launcher.h"

namespace shoal::run {

namespace {

using nlohmann::json;

bool isNameChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_';
}

template <typename T>
json orNull(const std::optional<T>& v) {
  return v ? json(*v) : json(nullptr);
}

json orNull(const std::string& s) {
  return s.empty() ? json(nullptr) : json(s);
}

}  // namespace

bool isSecretName(std::string_view name) {
  std::string upper(name);
  std::transform(upper.begin(), upper.end(), upper.begin(),
                 [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  if (upper.ends_with("_FILE")) return false;
  static constexpr std::array<std::string_view, 6> kWords = {"SECRET", "PASSWORD", "PASSWD",
                                                             "TOKEN",  "KEY",      "CREDENTIAL"};
  return std::any_of(kWords.begin(), kWords.end(),
                     [&](std::string_view w) { return upper.find(w) != std::string::npos; });
}

std::string redactArgument(std::string_view argument) {
  // The name before each '=' is the run of name characters that ends there, so that "-xNAME=",
  // "--env=NAME=" and "NAME=" all find NAME.
  for (size_t eq = argument.find('='); eq != std::string_view::npos;
       eq = argument.find('=', eq + 1)) {
    size_t from = eq;
    while (from > 0 && isNameChar(argument[from - 1])) --from;
    if (isSecretName(argument.substr(from, eq - from))) {
      return fmt::format("{}{}", argument.substr(0, eq + 1), kRedacted);
    }
  }
  return std::string(argument);
}

json jobConfiguration(const LaunchOptions& o, const std::vector<std::string>& environment) {
  std::map<std::string, std::string> shoalVariables;
  for (const std::string& entry : environment) {
    const size_t eq = entry.find('=');
    if (eq != std::string::npos && entry.starts_with("SHOAL_")) {
      shoalVariables[entry.substr(0, eq)] = entry.substr(eq + 1);
    }
  }
  for (const auto& [name, value] : o.env) {
    if (name.starts_with("SHOAL_")) shoalVariables[name] = value;
  }
  const auto backend = shoalVariables.find("SHOAL_BACKEND");
  json env = json::object();
  for (const auto& [name, value] : shoalVariables) {
    env[name] = isSecretName(name) ? std::string(kRedacted) : value;
  }
  json arguments = json::array();
  for (const std::string& a : o.arguments) arguments.push_back(redactArgument(a));
  json hosts = json::array();
  for (const HostSlots& h : o.hosts) hosts.push_back(fmt::format("{}:{}", h.host, h.slots));
  return {{"arguments", std::move(arguments)},
          {"ranks", o.ranks},
          {"servers", o.servers},
          {"ps_replicas", o.psReplicas},
          {"ps_replacements", o.psReplacements},
          {"hosts", std::move(hosts)},
          {"elastic", orNull(o.elastic)},
          {"max_restarts", o.maxRestarts},
          {"timeout_s", orNull(o.opTimeoutSeconds)},
          {"time_limit_s", orNull(o.timeLimitSeconds)},
          {"grace_s", o.graceSeconds},
          {"store", orNull(o.storeUrl)},
          {"encrypt", std::string(toString(o.encrypt))},
          {"trace", orNull(o.tracePath)},
          {"trace_events", o.traceEvents},
          {"flight_dir", orNull(o.flightDir)},
          {"flight_events", o.flightEvents},
          {"output_dir", orNull(o.outputDir)},
          {"host_discovery_script", orNull(o.hostDiscoveryScript)},
          {"join_file", orNull(o.joinFile)},
          {"backend", backend != shoalVariables.end() ? backend->second : "native"},
          {"environment", std::move(env)}};
}

}  // namespace shoal::run
