// Hierarchical all-reduce, for a group spread over several hosts with the same number of ranks
// on each (HostLayout::uniform()): the slow links between hosts carry each byte once per
// direction instead of the flat ring's 2(n-1)/n per rank.
//
// With L ranks per host and H hosts, rank (host h, local index j):
// 1. Reduce-scatter inside the host (a ring over shared memory): the buffer is cut into L
//    blocks and local index j ends up holding block (j+1) mod L summed over its host.
// 2. All-reduce of that block across hosts, a ring over the H ranks with local index j: each
//    host's L ranks work on disjoint blocks at once, so every one of them drives its own share
//    of the host's link. Its reduce-scatter's last step completes the sum over every rank
//    (and divides an average: Note [Average in the last step] in algorithms.h).
// 3. All-gather inside the host: every rank gets the other L-1 blocks.
// Cross-host bytes sent per host: 2(H-1)/H of the buffer, against the flat ring's 2(n-1)/n
// (a ring that visits each host's ranks in a row leaves each host once, through one rank,
// which sends that much). For 2 hosts x 2 ranks: 1.0 against 1.5 buffers.
// The three phases run one after the other, each pipelined in segments (allreduce_ring.cpp).
// Frames of the phases use disjoint step ranges, so no frame of one is taken for another's.
#include "comm/native/algorithms.h"
#include "comm/native/native_engine.h"

namespace shoal::comm::algo {

namespace {
// Step ranges of the three phases: far above what any ring of the phase uses.
constexpr uint32_t kPhaseSteps = 1u << 24;
}  // namespace

void allreduceHierarchical(OpContext& ctx, void* data, size_t count) {
  const HostLayout& layout = ctx.engine().hosts();
  const auto& mine = layout.ranks[static_cast<size_t>(layout.host)];
  const int perHost = static_cast<int>(mine.size());
  RingSpan local{mine, layout.local};
  RingSpan across;
  for (const auto& host : layout.ranks)
    across.members.push_back(host[static_cast<size_t>(layout.local)]);
  across.me = layout.host;

  ringAllreduceParts(ctx, local, data, count, kRingReduceScatter, false, 0);
  const int block = (layout.local + 1) % perHost;
  const size_t esize = elementSize(static_cast<DataType>(ctx.base().dtype));
  ringAllreduceParts(
      ctx, across, static_cast<uint8_t*>(data) + blockBegin(count, perHost, block) * esize,
      blockSize(count, perHost, block), kRingReduceScatter | kRingAllgather, true, kPhaseSteps);
  ringAllreduceParts(ctx, local, data, count, kRingAllgather, false, 2 * kPhaseSteps);
}

HostLayout hostLayout(const std::vector<std::string>& hostOfRank, int rank) {
  HostLayout layout;
  std::vector<std::string> names;
  for (int p = 0; p < static_cast<int>(hostOfRank.size()); ++p) {
    size_t h = 0;
    while (h < names.size() && names[h] != hostOfRank[static_cast<size_t>(p)]) ++h;
    if (h == names.size()) {
      names.push_back(hostOfRank[static_cast<size_t>(p)]);
      layout.ranks.emplace_back();
    }
    if (p == rank) {
      layout.host = static_cast<int>(h);
      layout.local = static_cast<int>(layout.ranks[h].size());
    }
    layout.ranks[h].push_back(p);
  }
  return layout;
}

bool HostLayout::uniform() const {
  if (ranks.size() < 2 || ranks[0].size() < 2) return false;
  for (const auto& host : ranks) {
    if (host.size() != ranks[0].size()) return false;
  }
  return true;
}

}  // namespace shoal::comm::algo
