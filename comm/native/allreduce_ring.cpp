// Ring all-reduce: a reduce-scatter followed by an all-gather around the ring r → r+1.
//
// The buffer is cut into n blocks (sizes differ by at most one element) and each block into
// the same number of segments of about kSegmentBytes.
// - Reduce-scatter, n-1 steps: at step s rank r sends block (r-s) to r+1 and receives block
//   (r-s-1) from r-1, reducing it into its own copy as the bytes arrive. After the last step
//   rank r holds block (r+1) reduced over all ranks (an average divided by n in that last
//   step's reduction: Note [Average in the last step] in comm/algorithms.h).
// - All-gather, n-1 steps: at step s rank r sends block (r+1-s) and receives block (r-s),
//   overwriting its copy with the final values.
// Segment k of a block is forwarded as soon as segment k of the previous step has arrived, so
// the ring is pipelined: while segment k+1 still arrives from the left, segment k already
// leaves to the right, and reduction runs inside the receive.
// Each rank sends and receives 2(n-1)/n of the buffer: bandwidth-optimal for large messages;
// latency grows with 2(n-1) steps, which is why small messages go to recursive doubling.
//
// The same code runs a ring over some of the group's ranks (RingSpan), one half at a time if
// asked: the hierarchical all-reduce's rings inside a host and across hosts.
#include <numeric>
#include <vector>

#include "comm/native/algorithms.h"
#include "common/reduce.h"

namespace shoal::comm::algo {

namespace {
constexpr size_t kSegmentBytes = 1 << 20;
}

void ringAllreduceParts(OpContext& ctx, const RingSpan& ring, void* data, size_t count, int parts,
                        bool completes, uint32_t firstStep) {
  const int n = static_cast<int>(ring.members.size()), r = ring.me;
  if (n <= 1) return;
  const auto type = static_cast<DataType>(ctx.base().dtype);
  const size_t esize = elementSize(type);
  auto* bytes = static_cast<uint8_t*>(data);
  const int right = ring.members[(r + 1) % n], left = ring.members[(r + n - 1) % n];
  auto mod = [n](int x) { return ((x % n) + n) % n; };

  const size_t segElems = std::max<size_t>(1, kSegmentBytes / esize);
  const size_t maxBlock = blockSize(count, n, 0);
  const int nseg = static_cast<int>(std::max<size_t>(1, (maxBlock + segElems - 1) / segElems));
  auto segment = [&](int block, int k, size_t* offset) {
    size_t bsize = blockSize(count, n, block);
    *offset = (blockBegin(count, n, block) + blockBegin(bsize, nseg, k)) * esize;
    return blockSize(bsize, nseg, k) * esize;
  };

  std::vector<transport::Transfer> batch;
  batch.reserve(static_cast<size_t>(4 * (n - 1) * nseg));
  std::vector<int> lastRecv(static_cast<size_t>(nseg), -1);
  for (int phase = 0; phase < 2; ++phase) {
    if (!(parts & (phase == 0 ? kRingReduceScatter : kRingAllgather))) continue;
    for (int s = 0; s < n - 1; ++s) {
      const int sendBlock = phase == 0 ? mod(r - s) : mod(r + 1 - s);
      const int recvBlock = phase == 0 ? mod(r - s - 1) : mod(r - s);
      const uint32_t step = firstStep + static_cast<uint32_t>(((phase * (n - 1)) + s) * nseg);
      for (int k = 0; k < nseg; ++k) {
        size_t off;
        size_t len = segment(sendBlock, k, &off);
        batch.push_back(ctx.send(right, step + k, bytes + off, len));
        batch.back().after = lastRecv[k];
      }
      for (int k = 0; k < nseg; ++k) {
        size_t off;
        size_t len = segment(recvBlock, k, &off);
        if (phase == 1) {
          batch.push_back(ctx.recv(left, step + k, bytes + off, len));
        } else if (s == n - 2 && completes) {
          // This rank completes the block: kAvg divides here (Note [Average in the last step]).
          batch.push_back(ctx.recvReduceFinal(left, step + k, bytes + off, len));
        } else {
          batch.push_back(ctx.recvReduce(left, step + k, bytes + off, len));
        }
        lastRecv[k] = static_cast<int>(batch.size() - 1);
      }
    }
  }
  ctx.run(batch);
}

void allreduceRing(OpContext& ctx, void* data, size_t count) {
  RingSpan ring;
  ring.members.resize(static_cast<size_t>(ctx.size()));
  std::iota(ring.members.begin(), ring.members.end(), 0);
  ring.me = ctx.rank();
  ringAllreduceParts(ctx, ring, data, count, kRingReduceScatter | kRingAllgather, true, 0);
}

}  // namespace shoal::comm::algo
