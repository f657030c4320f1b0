#include "common/env.h"

#include <charconv>
#include <cmath>
#include <cstdlib>

#include "common/error.h"
#include "common/flight_recorder.h"

namespace shoal {

namespace {

// A set variable's value; an empty one is refused here, once for every variable, because
// "SHOAL_TIMEOUT=" silently meaning the default hides a broken script.
std::optional<std::string> get(const EnvReader& env, const char* name) {
  auto v = env(name);
  if (v && v->empty()) {
    SHOAL_THROW(InvalidArgument, "{} is set but empty: give it a value or unset it", name);
  }
  return v;
}

LogLevel parseLogLevel(const std::string& v) {
  if (v == "error") return LogLevel::kError;
  if (v == "warn") return LogLevel::kWarn;
  if (v == "info") return LogLevel::kInfo;
  if (v == "debug") return LogLevel::kDebug;
  SHOAL_THROW(InvalidArgument, "SHOAL_LOG_LEVEL='{}': expected error, warn, info or debug", v);
}

}  // namespace

int64_t parseInteger(std::string_view what, std::string_view text, int64_t min, int64_t max) {
  int64_t n = 0;
  const char* first = text.data();
  const char* last = text.data() + text.size();
  if (!text.empty() && *first == '+') ++first;  // "+5" is as clear as "5"
  auto [end, ec] = std::from_chars(first, last, n);
  if (text.empty() || ec != std::errc() || end != last || n < min || n > max) {
    SHOAL_THROW(InvalidArgument, "{}='{}': expected an integer from {} to {}", what, text, min,
                max);
  }
  return n;
}

double parseNumber(std::string_view what, std::string_view text, double min, double max) {
  double d = 0;
  const char* first = text.data();
  const char* last = text.data() + text.size();
  if (!text.empty() && *first == '+') ++first;
  // from_chars reads "inf" and "nan" too; isfinite refuses them, and the range check (written
  // so that NaN fails it) refuses the rest.
  auto [end, ec] = std::from_chars(first, last, d);
  if (text.empty() || ec != std::errc() || end != last || !std::isfinite(d) || !(d >= min) ||
      !(d <= max)) {
    SHOAL_THROW(InvalidArgument, "{}='{}': expected a finite number from {} to {}", what, text, min,
                max);
  }
  return d;
}

std::string_view toString(TransportKind kind) {
  switch (kind) {
    case TransportKind::kAuto:
      return "auto";
    case TransportKind::kTcp:
      return "tcp";
    case TransportKind::kShm:
      return "shm";
  }
  return "invalid";
}

TransportKind parseTransportKind(std::string_view v) {
  if (v == "auto") return TransportKind::kAuto;
  if (v == "tcp") return TransportKind::kTcp;
  if (v == "shm") return TransportKind::kShm;
  SHOAL_THROW(InvalidArgument, "transport '{}': expected auto, tcp or shm", v);
}

EnvReader processEnvReader() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

EnvConfig readEnvConfig() {
  return readEnvConfig(processEnvReader());
}

EnvConfig readEnvConfig(const EnvReader& env) {
  EnvConfig c;
  if (auto v = get(env, "SHOAL_TIMEOUT")) {
    c.timeoutSeconds = parseNumber("SHOAL_TIMEOUT", *v, kMinTimeoutSeconds, kMaxTimeoutSeconds);
  }
  if (auto v = get(env, "SHOAL_TRANSPORT")) {
    try {
      c.transport = parseTransportKind(*v);
    } catch (const InvalidArgument& e) {
      SHOAL_THROW(InvalidArgument, "SHOAL_TRANSPORT: {}", e.what());
    }
  }
  if (auto v = get(env, "SHOAL_ALLREDUCE_ALGORITHM")) c.allreduceAlgorithm = *v;
  c.secret = get(env, "SHOAL_SECRET");
  c.secretFile = get(env, "SHOAL_SECRET_FILE");
  c.listenAddress = get(env, "SHOAL_ADDR");
  if (auto v = get(env, "SHOAL_BACKEND")) {
    if (*v != "native" && *v != "mpi") {
      SHOAL_THROW(InvalidArgument, "SHOAL_BACKEND='{}': expected native or mpi", *v);
    }
    c.backend = *v;
  }
  if (auto v = get(env, "SHOAL_SHM_RING_BYTES")) {
    c.shmRingBytes =
        static_cast<size_t>(parseInteger("SHOAL_SHM_RING_BYTES", *v, 4096, int64_t{1} << 32));
  }
  if (auto v = get(env, "SHOAL_LOG_LEVEL")) c.logLevel = parseLogLevel(*v);
  c.encrypt = readEncryptMode(env);
  c.traceDir = get(env, "SHOAL_TRACE");
  if (auto v = get(env, "SHOAL_TRACE_EVENTS")) {
    c.traceEvents = static_cast<size_t>(
        parseInteger("SHOAL_TRACE_EVENTS", *v, 1, static_cast<int64_t>(kMaxTraceEvents)));
  }
  c.flightDir = get(env, "SHOAL_FLIGHT_DIR");
  if (auto v = get(env, "SHOAL_FLIGHT_EVENTS")) {
    c.flightEvents = static_cast<size_t>(
        parseInteger("SHOAL_FLIGHT_EVENTS", *v, 1, static_cast<int64_t>(kMaxFlightEvents)));
  }
  return c;
}

EncryptMode readEncryptMode(const EnvReader& env) {
  auto v = get(env, "SHOAL_ENCRYPT");
  if (!v) return EncryptMode::kAuto;
  try {
    return parseEncryptMode(*v);
  } catch (const InvalidArgument& e) {
    SHOAL_THROW(InvalidArgument, "SHOAL_ENCRYPT={}", e.what());
  }
}

std::string describe(const EnvConfig& c) {
  return fmt::format(
      "backend={} timeout={}s transport={} allreduce_algorithm={} addr={} shm_ring_bytes={} "
      "encrypt={} trace={} flight={} secret={}",
      c.backend, c.timeoutSeconds, toString(c.transport), c.allreduceAlgorithm,
      c.listenAddress.value_or("auto"), c.shmRingBytes, toString(c.encrypt),
      c.traceDir ? fmt::format("{} ({} spans per rank)", *c.traceDir, c.traceEvents) : "off",
      c.flightDir ? fmt::format("{} ({} operations per rank)", *c.flightDir, c.flightEvents)
                  : "off",
      c.secret ? "SHOAL_SECRET" : (c.secretFile ? "SHOAL_SECRET_FILE" : "generated"));
}

}  // namespace shoal
