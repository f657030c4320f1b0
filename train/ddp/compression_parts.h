// What the gradient-compression hooks (train/ddp/compression_hook.h) share, and how the factory
// makes each: one codec family per file (cast_hook.cpp, gather_hook.cpp, powersgd_hook.cpp).
// Internal to train/ddp/.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "comm/compress/spec.h"
#include "comm/group.h"
#include "comm/work.h"
#include "train/ddp/comm_hook.h"

namespace shoal::train::ddp::compression {

// Note [Warm-up and the step of a bucket]
// Every rank starts its buckets in the same order, bucket 0 first, once per synchronized step
// (CommHook's contract), so bucket 0's start() counts steps on every rank alike. Whether a
// step is compressed is decided there and remembered per bucket until its finish(): all
// buckets of a step, and start() and finish() of one bucket, agree.
class StepCounter {
 public:
  explicit StepCounter(int64_t warmup) : warmup_(warmup) {}
  // Called by start(): whether this bucket's step is compressed.
  bool compressed(const GradBucket& bucket) {
    if (bucket.index == 0) ++step_;
    return step_ > warmup_;
  }
  // Steps counted so far (HookState::steps).
  int64_t steps() const { return step_; }
  void setSteps(int64_t steps) { step_ = steps; }

 private:
  int64_t warmup_;
  int64_t step_ = 0;
};

// InvalidArgument, naming `hook`, unless `state` was exported by a hook of its kind.
void checkKind(const CommHook& hook, const HookState& state);

bool isFloat32(const GradBucket& bucket);

// The bucket averaged as it is: one all-reduce (the warm-up, buckets that are not float32).
std::shared_ptr<comm::Work> plainAverage(comm::Group& group, GradBucket& bucket);

// fp16 / bf16 casts (cast_hook.cpp); `half` is DataType::kFloat16 or kBFloat16.
std::shared_ptr<CommHook> castHook(DataType half, int64_t warmupSteps);
// top-k and 1-bit: fixed-size messages, one all-gather, error feedback (gather_hook.cpp).
std::shared_ptr<CommHook> gatherHook(const compress::CompressionSpec& spec);
// PowerSGD (powersgd_hook.cpp).
std::shared_ptr<CommHook> powerSgdHook(const compress::CompressionSpec& spec);

}  // namespace shoal::train::ddp::compression
