// A stand-in training program for the sweep tests: no model, one JSON line per "epoch".
//
//   sweep_fake_trainer --x X --y Y --epochs E --metrics FILE
//                      [--fail-above T]          exit 3 before any epoch when x > T
//                      [--trial N --gate FILE --gate-from K [--ready FILE2]]
//                                                trials N >= K wait (up to 60 s) for FILE to
//                                                exist before their first epoch, having
//                                                created FILE2 (they are waiting)
//                      [--hang-below S]          after epoch 1, hang (until killed) when the
//                                                final score would be below S
//                      [--trial N --hang-trials LIST]
//                                                trial N, when in the comma-separated LIST,
//                                                reports epoch 1 and then hangs until killed
//                      [--ignore-term 1]         ignore SIGTERM (only SIGKILL stops it)
//                      [--placements FILE]       every rank appends one line: trial, SHOAL_RANK,
//                                                the host its (fake) ssh was given
//                                                (SHOAL_TEST_SSH_HOST, else "local"),
//                                                SHOAL_LOCAL_RANK, SHOAL_NUM_HOSTS,
//                                                SHOAL_SWEEP_SLOTS ("-" when unset)
//                      [--trial N --meet DIR --meet-count C]
//                                                trials N < C create DIR/N, then wait (up to
//                                                60 s) until DIR holds C such files: they ran
//                                                at the same time
//
// Under `shoal run -n K` only rank 0 (SHOAL_RANK unset or 0) writes the metrics, as a real
// trainer does.
//
// Its "score" at epoch e is 1 - (x - 0.3)^2 - (y + 0.2)^2 - 0.1 * (E - e) / E: every curve
// rises to its final value and keeps its rank at every epoch, so the best trial is known.
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

int main(int argc, char** argv) {
  double x = 0, y = 0, failAbove = 1e300, hangBelow = -1e300;
  bool ignoreTerm = false;
  int epochs = 3, trial = 0, gateFrom = 1 << 30;
  int meetCount = 0;
  std::string metrics, gate, ready, hangTrials, placements, meet;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const char* value = argv[i + 1];
    if (flag == "--x") {
      x = std::atof(value);
    } else if (flag == "--y") {
      y = std::atof(value);
    } else if (flag == "--epochs") {
      epochs = std::atoi(value);
    } else if (flag == "--metrics") {
      metrics = value;
    } else if (flag == "--fail-above") {
      failAbove = std::atof(value);
    } else if (flag == "--hang-below") {
      hangBelow = std::atof(value);
    } else if (flag == "--hang-trials") {
      hangTrials = std::string(",") + value + ",";
    } else if (flag == "--ignore-term") {
      ignoreTerm = std::atoi(value) != 0;
    } else if (flag == "--trial") {
      trial = std::atoi(value);
    } else if (flag == "--gate") {
      gate = value;
    } else if (flag == "--ready") {
      ready = value;
    } else if (flag == "--placements") {
      placements = value;
    } else if (flag == "--meet") {
      meet = value;
    } else if (flag == "--meet-count") {
      meetCount = std::atoi(value);
    } else if (flag == "--gate-from") {
      gateFrom = std::atoi(value);
    } else {
      std::fprintf(stderr, "sweep_fake_trainer: unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  if (ignoreTerm) signal(SIGTERM, SIG_IGN);
  const auto env = [](const char* name, const char* otherwise) {
    const char* v = std::getenv(name);
    return std::string(v != nullptr ? v : otherwise);
  };
  const bool rank0 = env("SHOAL_RANK", "0") == "0";
  if (!placements.empty()) {
    const std::string line = std::to_string(trial) + " " + env("SHOAL_RANK", "0") + " " +
                             env("SHOAL_TEST_SSH_HOST", "local") + " " +
                             env("SHOAL_LOCAL_RANK", "0") + " " + env("SHOAL_NUM_HOSTS", "1") +
                             " " + env("SHOAL_SWEEP_SLOTS", "-") + "\n";
    FILE* f = std::fopen(placements.c_str(), "a");  // one short write: lines do not interleave
    if (f == nullptr) return 4;
    std::fputs(line.c_str(), f);
    std::fclose(f);
  }
  if (!meet.empty() && trial < meetCount && rank0) {
    std::fclose(std::fopen((meet + "/" + std::to_string(trial)).c_str(), "w"));
    // A test helper's wait, bounded: the sweep under test is what must never sleep.
    for (int i = 0; i < 3000; ++i) {
      int present = 0;
      for (int t = 0; t < meetCount; ++t) {
        present += access((meet + "/" + std::to_string(t)).c_str(), F_OK) == 0;
      }
      if (present == meetCount) break;
      const timespec ts{0, 20'000'000};
      nanosleep(&ts, nullptr);
    }
  }
  if (x > failAbove) {
    std::fprintf(stderr, "sweep_fake_trainer: x=%g diverged\n", x);
    return 3;
  }
  if (!gate.empty() && trial >= gateFrom) {
    if (!ready.empty()) std::fclose(std::fopen(ready.c_str(), "w"));
    // A test helper's wait, bounded: the sweep under test is what must never sleep.
    for (int i = 0; i < 3000 && access(gate.c_str(), F_OK) != 0; ++i) {
      const timespec t{0, 20'000'000};
      nanosleep(&t, nullptr);
    }
  }
  if (!rank0) {
    std::printf("rank %s of trial %d: done\n", env("SHOAL_RANK", "0").c_str(), trial);
    return 0;
  }
  FILE* out = std::fopen(metrics.c_str(), "a");
  if (out == nullptr) return 4;
  const double final = 1 - (x - 0.3) * (x - 0.3) - (y + 0.2) * (y + 0.2);
  const bool hangs =
      final < hangBelow || hangTrials.find("," + std::to_string(trial) + ",") != std::string::npos;
  for (int e = 1; e <= epochs; ++e) {
    std::fprintf(out, "{\"epoch\": %d, \"score\": %.17g}\n", e,
                 final - 0.1 * (epochs - e) / epochs);
    std::fflush(out);
    if (e == 1 && hangs) {
      for (;;) pause();  // a slow trial: stopped by ASHA or a time limit
    }
  }
  std::fclose(out);
  std::printf("trained x=%g y=%g\n", x, y);
  return 0;
}
