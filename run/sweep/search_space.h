// A sweep's configuration (`shoal sweep CONFIG.json`): the search space over the training
// program's flags, the program's command, the metric to optimise and the sweep's budget.
//
//   {
//     "command": ["build/fashion_mnist", "--epochs", "3", "--threads", "1"],
//     "metric": "test_accuracy", "direction": "max",
//     "trials": 20, "parallel": 2, "ranks_per_trial": 1,
//     "trial_time_limit": 120, "time_limit": 900,
//     "algorithm": "tpe", "seed": 1, "tpe": {"multivariate": true},
//     "early_stopping": {"type": "asha", "min_epochs": 1, "reduction_factor": 3,
//                        "max_epochs": 3},
//     "parameters": {
//       "lr":        {"type": "log_uniform", "low": 1e-4, "high": 0.1},
//       "batch":     {"type": "choice", "values": [32, 64, 128]},
//       "optimizer": {"type": "choice", "values": ["sgd", "adam"]},
//       "hidden":    {"type": "int", "low": 32, "high": 256, "log": true}
//     }
//   }
//
// Parameter kinds: uniform and log_uniform (reals in [low, high]), int (integers in [low, high],
// "log": true to sample on a log scale) and choice (any JSON scalars). A parameter reaches the
// program as `FLAG VALUE` appended to the command (FLAG is "flag", default "--NAME"), or, when a
// word of the command contains "{NAME}", in its place. "{metrics}" (the trial's metrics file,
// appended as `--metrics FILE` when the command names no "{metrics}"), "{trial}" (the trial's
// number) and "{trial_dir}" are substituted too.
//
// Time limits are seconds. "trial_time_limit" bounds each trial (default kDefaultTrialTimeLimit;
// 0: none, only when asked for); "time_limit" the whole sweep (default: none).
//
// Parsing is strict: an unknown key, a wrong type, low >= high, a log range not above zero or an
// empty choice is an InvalidArgument of one line naming the key ("parameters.lr.low: ...").
// Stateless and thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace shoal::run::sweep {

enum class ParamKind { kUniform, kLogUniform, kInt, kChoice };

struct Parameter {
  std::string name;
  ParamKind kind = ParamKind::kUniform;
  double low = 0, high = 0;          // reals and ints (ints hold whole numbers)
  bool log = false;                  // log_uniform, or an int with "log": true
  std::vector<std::string> choices;  // choice: each value as JSON text ("64", "\"adam\"")
  std::string flag;                  // "--NAME" unless given; empty: only as "{NAME}"
  int gridPoints = 5;                // values of a real (or wide int) range in a grid search
};

// One point of the space: a value per parameter, in the order of SweepConfig::parameters. A
// choice holds the index of its value.
using Assignment = std::vector<double>;

enum class Direction { kMaximize, kMinimize };
enum class Algorithm { kGrid, kRandom, kTpe };

struct EarlyStopping {
  bool enabled = false;  // "type": "asha" (else "none")
  int minEpochs = 1;     // the first rung
  int reductionFactor = 3;
  int maxEpochs = 0;  // a full trial's epochs: no rung at or beyond (required with asha)
};

struct TpeSettings {
  int startupTrials = 8;  // random trials before the model is used
  int candidates = 24;    // samples drawn from l(x) per suggestion
  double gamma = 0.1;     // the good fraction of the history (Optuna's default)
  // One joint density over all parameters (tpe_multivariate.h; the default: better on every
  // benchmark there but a separable one, where it ties) instead of one per parameter
  // (tpe_search.h).
  bool multivariate = true;
};

// A trial's wall-time limit when the configuration names none: generous for the minutes-long
// trials a sweep is for, yet a hung trial (a rank stuck in a collective, a deadlock in a data
// loader) no longer holds its slot until the sweep's own limit, or for ever without one.
// "trial_time_limit": 0 (or --trial-time-limit 0) lifts it.
inline constexpr double kDefaultTrialTimeLimit = 3600;
// The longest time limit accepted (a trial's or the sweep's), seconds.
inline constexpr double kMaxSeconds = 30 * 24 * 3600.0;

struct SweepConfig {
  std::vector<std::string> command;  // the program and its fixed arguments (a template)
  std::vector<Parameter> parameters;
  std::string metric;
  Direction direction = Direction::kMaximize;
  int trials = 20;
  int parallel = 1;
  int ranksPerTrial = 1;
  bool viaLauncher = true;  // "launcher": "shoal" (default) or "direct" (ranks 1)
  std::optional<double> trialTimeLimit = kDefaultTrialTimeLimit;  // seconds; nullopt: none
  std::optional<double> timeLimit;                                // seconds, the whole sweep
  double graceSeconds = 5;  // SIGTERM, then SIGKILL after this
  Algorithm algorithm = Algorithm::kTpe;
  uint64_t seed = 0;
  EarlyStopping earlyStopping;
  TpeSettings tpe;
  std::vector<std::pair<std::string, std::string>> env;  // set for every trial
};

// Config files are small; a larger one is refused before it is read.
inline constexpr uint64_t kMaxConfigBytes = 1 << 20;

// Parses and validates the JSON text. InvalidArgument (one line, naming the key) otherwise.
SweepConfig parseSweepConfig(std::string_view text);

// The text of the file at `path`, at most kMaxConfigBytes (checked before reading).
// InvalidArgument naming the file otherwise.
std::string readSweepConfigText(const std::string& path);

std::string_view toString(Algorithm a);
Algorithm parseAlgorithm(std::string_view name);  // "grid" | "random" | "tpe"

// True when `a` is better than `b` in `direction` (NaN is never better).
bool isBetter(Direction direction, double a, double b);

// The value as the program receives it: a choice's string without quotes, an int without a
// decimal point, a real in the shortest form that reads back the same.
std::string formatParameter(const Parameter& p, double value);

// The value for people (tables, progress lines): reals to 6 significant digits.
std::string displayParameter(const Parameter& p, double value);

// The value as JSON text (journal, best.json): a choice's JSON, else a number.
std::string parameterJson(const Parameter& p, double value);

// The inverse of parameterJson for values read back (journal): nullopt when the value does not
// belong to the parameter's range or choices.
std::optional<double> parseParameterJson(const Parameter& p, std::string_view json);

// True when every value lies in its parameter's range (ints whole, choices valid indices).
bool fits(const SweepConfig& config, const Assignment& a);

// The trial's argv (without any launcher): the command with its placeholders substituted and
// the parameters' flags appended (see the top of this file).
std::vector<std::string> trialCommand(const SweepConfig& config, const Assignment& a, int trial,
                                      const std::string& trialDir, const std::string& metricsFile);

// Internal coordinates for the samplers: log for log-scaled parameters; ints widened by half a
// step each side so every integer gets an equal share. toInternal(fromInternal(x)) rounds.
std::pair<double, double> internalRange(const Parameter& p);
double toInternal(const Parameter& p, double value);
double fromInternal(const Parameter& p, double x);  // clamped to the range, ints rounded

}  // namespace shoal::run::sweep
