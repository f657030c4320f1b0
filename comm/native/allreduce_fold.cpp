// The power-of-two fold shared by recursive doubling and Rabenseifner: see Note [Power-of-two
// fold] in comm/native/algorithms.h.
//
// Step 0: for r < 2e, even r sends its whole buffer (B bytes) to r + 1, which reduces it in.
// Step rounds + 1: r + 1 sends the result (B bytes) back to r. Ranks >= 2e do neither.
#include <vector>

#include "comm/native/algorithms.h"

namespace shoal::comm::algo {

PowerOfTwoFold powerOfTwoFold(const OpContext& ctx) {
  const int n = ctx.size(), r = ctx.rank();
  PowerOfTwoFold f;
  while (f.p * 2 <= n) {
    f.p *= 2;
    ++f.logp;
  }
  f.extra = n - f.p;
  if (r >= 2 * f.extra) {
    f.vrank = r - f.extra;
  } else if (r % 2 == 1) {
    f.vrank = r / 2;
  }
  return f;
}

PowerOfTwoFold foldIn(OpContext& ctx, void* data, size_t bytes, uint32_t rounds) {
  PowerOfTwoFold f = powerOfTwoFold(ctx);
  const int r = ctx.rank();
  if (r >= 2 * f.extra) return f;
  std::vector<transport::Transfer> batch;
  if (f.vrank < 0) {
    // Folded out: hand the buffer over; the result comes back into it once the partner is done.
    batch.push_back(ctx.send(r + 1, 0, data, bytes));
    batch.push_back(ctx.recv(r + 1, rounds + 1, data, bytes));
    batch.back().after = 0;
  } else {
    batch.push_back(ctx.recvReduce(r - 1, 0, data, bytes));
  }
  ctx.run(batch);
  return f;
}

void foldOut(OpContext& ctx, const PowerOfTwoFold& f, void* data, size_t bytes, uint32_t rounds) {
  const int r = ctx.rank();
  if (r >= 2 * f.extra || f.vrank < 0) return;
  std::vector<transport::Transfer> batch;
  batch.push_back(ctx.send(r - 1, rounds + 1, data, bytes));
  ctx.run(batch);
}

}  // namespace shoal::comm::algo
