#include "run/server_loss.h"

#include <fmt/format.h>

namespace shoal::run {

ServerLossPolicy::ServerLossPolicy(int workers, int servers, int replicas, int maxReplacements)
    : workers_(workers),
      servers_(servers),
      replicas_(replicas),
      maxReplacements_(maxReplacements) {}

std::optional<ServerLossPolicy::Verdict> ServerLossPolicy::failed(int rank) {
  const int s = rank - workers_;
  if (replicas_ != 2 || s < 0 || s >= servers_) return std::nullopt;
  const int next = (s + 1) % servers_, previous = (s + servers_ - 1) % servers_;
  Verdict v;
  if (lost_.count(next) || lost_.count(previous)) {
    lost_.insert(s);
    v.bothCopiesLost = true;
    v.message = fmt::format(
        "server {} failed before it: a shard lost both copies, the workers "
        "will fail",
        lost_.count(next) ? next : previous);
    return v;
  }
  lost_.insert(s);
  std::string replacement;
  if (replacements_ < maxReplacements_) {
    v.replacement = ++replacements_;
    replacing_[rank] = v.replacement;
    replacement =
        fmt::format("; starting a replacement ({} of {})", v.replacement, maxReplacements_);
  }
  v.message =
      fmt::format("the workers go on with its shard's backup on server {}{}", next, replacement);
  return v;
}

int ServerLossPolicy::replacementOf(int rank) const {
  const auto it = replacing_.find(rank);
  return it == replacing_.end() ? 0 : it->second;
}

}  // namespace shoal::run
