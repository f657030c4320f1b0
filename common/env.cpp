#include "common/env.h"

#include <cstdlib>

#include "common/error.h"

namespace shoal {

namespace {

std::optional<std::string> get(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

double parsePositiveDouble(const char* name, const std::string& v) {
  char* end = nullptr;
  double d = std::strtod(v.c_str(), &end);
  if (end == v.c_str() || *end != '\0' || !(d > 0)) {
    SHOAL_THROW(InvalidArgument, "{}='{}': expected a positive number of seconds", name, v);
  }
  return d;
}

size_t parseBytes(const char* name, const std::string& v) {
  char* end = nullptr;
  unsigned long long n = std::strtoull(v.c_str(), &end, 10);
  if (end == v.c_str() || *end != '\0' || n < 4096 || n > (1ull << 32)) {
    SHOAL_THROW(InvalidArgument, "{}='{}': expected a byte count between 4096 and 4294967296", name,
                v);
  }
  return static_cast<size_t>(n);
}

LogLevel parseLogLevel(const std::string& v) {
  if (v == "error") return LogLevel::kError;
  if (v == "warn") return LogLevel::kWarn;
  if (v == "info") return LogLevel::kInfo;
  if (v == "debug") return LogLevel::kDebug;
  SHOAL_THROW(InvalidArgument, "SHOAL_LOG_LEVEL='{}': expected error, warn, info or debug", v);
}

}  // namespace

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

EnvConfig readEnvConfig() {
  EnvConfig c;
  if (auto v = get("SHOAL_TIMEOUT")) c.timeoutSeconds = parsePositiveDouble("SHOAL_TIMEOUT", *v);
  if (auto v = get("SHOAL_TRANSPORT")) {
    try {
      c.transport = parseTransportKind(*v);
    } catch (const InvalidArgument& e) {
      SHOAL_THROW(InvalidArgument, "SHOAL_TRANSPORT: {}", e.what());
    }
  }
  if (auto v = get("SHOAL_ALLREDUCE_ALGORITHM")) c.allreduceAlgorithm = *v;
  c.secret = get("SHOAL_SECRET");
  c.secretFile = get("SHOAL_SECRET_FILE");
  c.listenAddress = get("SHOAL_ADDR");
  if (auto v = get("SHOAL_BACKEND")) {
    if (*v != "native" && *v != "mpi") {
      SHOAL_THROW(InvalidArgument, "SHOAL_BACKEND='{}': expected native or mpi", *v);
    }
    c.backend = *v;
  }
  if (auto v = get("SHOAL_SHM_RING_BYTES")) c.shmRingBytes = parseBytes("SHOAL_SHM_RING_BYTES", *v);
  if (auto v = get("SHOAL_LOG_LEVEL")) c.logLevel = parseLogLevel(*v);
  return c;
}

std::string describe(const EnvConfig& c) {
  return fmt::format(
      "backend={} timeout={}s transport={} allreduce_algorithm={} addr={} shm_ring_bytes={} "
      "secret={}",
      c.backend, c.timeoutSeconds, toString(c.transport), c.allreduceAlgorithm,
      c.listenAddress.value_or("auto"), c.shmRingBytes,
      c.secret ? "SHOAL_SECRET" : (c.secretFile ? "SHOAL_SECRET_FILE" : "generated"));
}

}  // namespace shoal
