#include "run/failure_blame.h"

#include <sys/wait.h>

#include <algorithm>
#include <tuple>
#include <utility>

#include "common/error.h"

namespace shoal::run {

Blame blameFailure(const std::vector<RankFailure>& failures, const std::vector<RankStop>& stops) {
  if (failures.empty()) SHOAL_THROW(InvalidArgument, "blameFailure: no failure to blame");
  auto failed = [&](int rank) {
    return std::any_of(failures.begin(), failures.end(),
                       [rank](const RankFailure& f) { return f.rank == rank; });
  };
  // A remote rank killed by a signal exits through ssh with 128 + the signal.
  auto order = [&](const RankFailure& f) {
    const bool signalled =
        WIFSIGNALED(f.status) || (WIFEXITED(f.status) && !f.local && WEXITSTATUS(f.status) > 128);
    const bool victim = f.cause >= 0 && f.cause != f.rank && failed(f.cause);
    return std::make_tuple(signalled ? 0 : 1, victim ? 1 : 0, f.rank);
  };
  Blame b;
  auto earliest = failures.front().at;
  for (size_t i = 0; i < failures.size(); ++i) {
    if (order(failures[i]) < order(failures[b.firstFailed])) b.firstFailed = i;
    earliest = std::min(earliest, failures[i].at);
  }
  for (size_t i = 0; i < stops.size(); ++i) {
    if (stops[i].since <= earliest && (!b.stopped || stops[i].since < stops[*b.stopped].since)) {
      b.stopped = i;
    }
  }
  return b;
}

}  // namespace shoal::run
