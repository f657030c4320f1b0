// The one place that reads SHOAL_* configuration variables. Every other component takes typed
// options; this file maps the documented variables (README, "Configuration") onto them. (What
// a launcher tells a rank about itself is read by run/rendezvous.h.)
#pragma once

#include <optional>
#include <string>

#include "common/log.h"

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
};

// Reads and validates the environment. A malformed value throws InvalidArgument naming the
// variable and what it accepts; nothing is silently defaulted.
EnvConfig readEnvConfig();

// One line describing the resolved values (the secret shown only as set / not set).
std::string describe(const EnvConfig& config);

std::string_view toString(TransportKind kind);
TransportKind parseTransportKind(std::string_view name);

}  // namespace shoal
