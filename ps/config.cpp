#include "ps/config.h"

#include <sstream>

#include "common/error.h"

namespace shoal::ps {

Mode parseMode(std::string_view name) {
  if (name.rfind("ps-", 0) == 0) name.remove_prefix(3);
  if (name == "sync") return Mode::kSync;
  if (name == "async") return Mode::kAsync;
  if (name == "ssp") return Mode::kSsp;
  SHOAL_THROW(InvalidArgument, "parameter-server mode '{}': expected sync, async or ssp", name);
}

std::string_view toString(Mode mode) {
  switch (mode) {
    case Mode::kSync:
      return "sync";
    case Mode::kAsync:
      return "async";
    case Mode::kSsp:
      return "ssp";
  }
  return "invalid";
}

LrSchedule TrainingConfig::schedule(int workers) const {
  const bool sync = mode == Mode::kSync;
  return LrSchedule(optimizer.lr, sync ? workers : 1, sync && linearScaling, warmupSteps,
                    totalSteps);
}

std::string TrainingConfig::toText() const {
  return fmt::format(
      "mode={} staleness={} optimizer={} lr={:.17g} momentum={:.17g} weight_decay={:.17g} "
      "linear_scaling={} warmup={} total={}",
      toString(mode), staleness, toString(optimizer.kind), optimizer.lr, optimizer.momentum,
      optimizer.weightDecay, linearScaling ? 1 : 0, warmupSteps, totalSteps);
}

TrainingConfig TrainingConfig::parse(std::string_view text) {
  TrainingConfig c;
  std::istringstream in{std::string(text)};
  std::string item;
  int seen = 0;
  while (in >> item) {
    auto eq = item.find('=');
    if (eq == std::string::npos) SHOAL_THROW(ProtocolError, "malformed setting '{}'", item);
    const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    try {
      if (key == "mode")
        c.mode = parseMode(value);
      else if (key == "staleness")
        c.staleness = std::stoi(value);
      else if (key == "optimizer")
        c.optimizer.kind = parseOptimizer(value);
      else if (key == "lr")
        c.optimizer.lr = std::stod(value);
      else if (key == "momentum")
        c.optimizer.momentum = std::stod(value);
      else if (key == "weight_decay")
        c.optimizer.weightDecay = std::stod(value);
      else if (key == "linear_scaling")
        c.linearScaling = value == "1";
      else if (key == "warmup")
        c.warmupSteps = std::stoll(value);
      else if (key == "total")
        c.totalSteps = std::stoll(value);
      else
        SHOAL_THROW(ProtocolError, "unknown setting '{}'", key);
    } catch (const std::logic_error&) {
      SHOAL_THROW(ProtocolError, "malformed setting '{}'", item);
    }
    ++seen;
  }
  if (seen != 9) SHOAL_THROW(ProtocolError, "training settings '{}' are incomplete", text);
  c.validate();
  return c;
}

void TrainingConfig::validate() const {
  // Layer-wise optimizers need whole-layer norms; a server holds slices of layers and applies
  // elementwise kernels (ps/server_optimizer.h), which do not implement AdamW's decoupled decay.
  if (optimizer.kind == OptimizerKind::kLamb || optimizer.kind == OptimizerKind::kLars) {
    SHOAL_THROW(InvalidArgument,
                "the parameter server does not support {} (layer-wise); use sgd, adam or rmsprop",
                toString(optimizer.kind));
  }
  if (optimizer.kind == OptimizerKind::kAdamW) {
    SHOAL_THROW(InvalidArgument,
                "the parameter server does not support adamw (its kernels have no decoupled "
                "weight decay); use sgd, adam or rmsprop");
  }
  SHOAL_CHECK(optimizer.lr > 0, "parameter server: learning rate {} must be positive",
              optimizer.lr);
  SHOAL_CHECK(optimizer.momentum >= 0 && optimizer.momentum < 1,
              "parameter server: momentum {} must be in [0, 1)", optimizer.momentum);
  SHOAL_CHECK(optimizer.weightDecay >= 0, "parameter server: weight decay {} must be >= 0",
              optimizer.weightDecay);
  SHOAL_CHECK(staleness >= 0, "parameter server: staleness {} must be >= 0", staleness);
  SHOAL_CHECK(warmupSteps >= 0 && totalSteps >= 0, "parameter server: warm-up {} / total {}",
              warmupSteps, totalSteps);
}

}  // namespace shoal::ps
