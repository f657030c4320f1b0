// fp16 / bf16: the bucket cast to 16 bits, averaged in that type (each addition in float32).
#include <fmt/format.h>

#include <vector>

#include "comm/collectives.h"
#include "comm/compress/half_cast.h"
#include "common/error.h"
#include "train/ddp/compression_parts.h"

namespace shoal::train::ddp::compression {

namespace {

using compress::Codec;
using compress::CompressionSpec;

struct CastState : BucketState {
  std::vector<uint16_t> wire;
  bool compressed = false;
};

class CastHook : public CommHook {
 public:
  CastHook(DataType half, int64_t warmup) : half_(half), steps_(warmup) {}

  std::unique_ptr<BucketState> makeState(comm::Group&, const GradBucket&) override {
    return std::make_unique<CastState>();
  }

  std::shared_ptr<comm::Work> start(comm::Group& group, GradBucket& bucket) override {
    auto& s = bucket.stateAs<CastState>();
    s.compressed = steps_.compressed(bucket) && isFloat32(bucket);
    if (!s.compressed) return plainAverage(group, bucket);
    const auto n = static_cast<size_t>(bucket.buffer.numel());
    s.wire.resize(n);
    compress::encodeHalf(half_, bucket.buffer.data_ptr<float>(), s.wire.data(), n);
    // The average is taken in the 16-bit type, each addition in float32 (common/reduce.h).
    return comm::allreduceAsync(group, s.wire.data(), n, half_, ReduceOp::kAvg);
  }

  void finish(comm::Group&, GradBucket& bucket) override {
    auto& s = bucket.stateAs<CastState>();
    if (!s.compressed) return;
    compress::decodeHalf(half_, s.wire.data(), bucket.buffer.data_ptr<float>(), s.wire.size());
  }

  std::string name() const override { return fmt::format("{} all-reduce", stateKind()); }

  std::string stateKind() const override { return half_ == DataType::kFloat16 ? "fp16" : "bf16"; }

  // Only the warm-up's count: the casts keep nothing else.
  std::optional<HookState> viewState() const override {
    HookState state;
    state.kind = stateKind();
    state.steps = steps_.steps();
    return state;
  }

  void importState(const HookState& state) override {
    checkKind(*this, state);
    if (!state.tensors.empty()) {
      SHOAL_THROW(InvalidArgument, "{}: a saved state with {} tensors (it keeps none)", name(),
                  state.tensors.size());
    }
    steps_.setSteps(state.steps);
  }

 private:
  DataType half_;
  StepCounter steps_;
};

}  // namespace

std::shared_ptr<CommHook> castHook(DataType half, int64_t warmupSteps) {
  return std::make_shared<CastHook>(half, warmupSteps);
}

}  // namespace shoal::train::ddp::compression
