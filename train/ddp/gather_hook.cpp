// top-k and 1-bit (train/ddp/compression_hook.h): fixed-size messages through the codecs of
// comm/compress/, one all-gather, error-feedback residuals and momentum correction per parameter.
#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <unordered_map>
#include <vector>

#include "comm/collectives.h"
#include "comm/compress/momentum_correction.h"
#include "comm/compress/sign.h"
#include "comm/compress/topk.h"
#include "common/error.h"
#include "train/ddp/compression_parts.h"

namespace shoal::train::ddp::compression {

namespace {

using compress::Codec;
using compress::CompressionSpec;

// Error-feedback residuals (and momentum correction's velocities) kept per parameter (the
// element range each parameter has in a bucket), so DDP's rebuild of the bucket layout carries
// them over instead of dropping them.
class Residuals {
 public:
  // The residual of a bucket of the current layout: a flat float tensor as long as its buffer,
  // holding what earlier layouts had for each of its parameters (zeros for new ones).
  torch::Tensor forBucket(const GradBucket& bucket) {
    auto residual = torch::zeros({bucket.buffer.numel()}, torch::kFloat32);
    for (size_t k = 0; k < bucket.params.size(); ++k) {
      Slot& slot = slots_[bucket.params[k]];
      if (slot.flat.defined()) {
        residual.narrow(0, bucket.offsets[k], bucket.numels[k])
            .copy_(slot.flat.narrow(0, slot.offset, bucket.numels[k]));
      }
      slot = {residual, bucket.offsets[k], bucket.numels[k]};
    }
    return residual;
  }

  // Views of every parameter's values, as `key` (CommHook::viewState).
  void viewTo(const std::string& key, HookState& state) const {
    for (const auto& [param, slot] : slots_) {
      state.tensors.push_back(
          {key, param, /*perRank=*/true, slot.flat.narrow(0, slot.offset, slot.numel)});
    }
  }
  // InvalidArgument unless t holds one of these parameters' values.
  void check(const HookState::Tensor& t, const std::string& hook) const {
    auto it = slots_.find(t.param);
    if (it == slots_.end()) {
      SHOAL_THROW(InvalidArgument, "{}: a saved {} for parameter {}, which it has no bucket for",
                  hook, t.key, t.param);
    }
    if (t.data.scalar_type() != torch::kFloat32 || t.data.dim() != 1 ||
        t.data.numel() != it->second.numel) {
      SHOAL_THROW(InvalidArgument, "{}: the saved {} of parameter {} holds {} elements, it has {}",
                  hook, t.key, t.param, t.data.numel(), it->second.numel);
    }
  }
  // Every parameter's values to zero (what a new hook starts with).
  void zero() {
    for (auto& [param, slot] : slots_) slot.flat.narrow(0, slot.offset, slot.numel).zero_();
  }
  // Into the bucket it lies in now (check() first).
  void load(const HookState::Tensor& t) {
    const Slot& slot = slots_.at(t.param);
    slot.flat.narrow(0, slot.offset, slot.numel).copy_(t.data);
  }

 private:
  struct Slot {
    torch::Tensor flat;  // the bucket residual it lies in (kept alive for the next layout)
    int64_t offset = 0;
    int64_t numel = 0;
  };
  std::unordered_map<size_t, Slot> slots_;
};

// The scale a 1-bit message starts with (comm/compress/sign.h).
float signScale(const uint8_t* message) {
  float scale;
  std::memcpy(&scale, message, sizeof(scale));
  return scale;
}

// Note [Dense parameters]
// With spec dense=N the message is cut by parameter: each parameter of at most N elements is
// sent whole (float32), each larger one is encoded on its own (its own top-k of
// ceil(D * numel), its own 1-bit scale). A small tensor costs little whole, while a codec's
// share of it can be too little to train it: a 10-class output layer of 30 K weights, alone in a
// 25 MiB bucket, had 1% of its weights (about 300) sent per step. A dense parameter has no
// error feedback (nothing is held back) and, with momentum, is heavy-ball SGD (Note [Momentum
// in the hook]). Without dense=N the whole bucket is one encoded segment.
struct Segment {
  int64_t offset = 0;  // in the bucket
  int64_t numel = 0;
  bool dense = false;
  size_t k = 0;      // top-k: elements sent
  size_t bytes = 0;  // of the message
};

struct GatherState : BucketState {
  std::vector<Segment> segments;  // Note [Dense parameters]; message order
  torch::Tensor residual;         // with momentum correction, the accumulation of velocities
  torch::Tensor velocity;         // momentum correction's (spec momentum > 0), else undefined
  std::vector<uint8_t> message;   // this rank's
  std::vector<uint8_t> gathered;  // every rank's, rank order
  bool compressed = false;
};

// out[i] += weight * (float i of `bytes`), the floats unaligned in a message.
void addFloats(const uint8_t* bytes, size_t n, float weight, float* out) {
  for (size_t i = 0; i < n; ++i) {
    float v;
    std::memcpy(&v, bytes + i * sizeof(float), sizeof(v));
    out[i] += weight * v;
  }
}

// Note [Momentum in the hook]
// With spec momentum m > 0 the hook applies SGD's momentum before compression
// (comm/compress/momentum_correction.h) and the optimizer must have none. So that every step
// of every element has the momentum, what is sent whole (the warm-up, buckets that are not
// float32, dense parameters) sends the velocity u = m u + g and keeps it: heavy-ball SGD
// exactly, as the optimizer's buffer would have done. The velocity, like the residual, is kept
// per parameter, and in float32 whatever the bucket's dtype.
//
// A codec whose message has the same size on every rank for a bucket: encoded, all-gathered,
// and every rank's message decoded into the average.
class GatherHook : public CommHook {
 public:
  GatherHook(CompressionSpec spec) : spec_(spec), steps_(spec.warmupSteps) {}

  std::unique_ptr<BucketState> makeState(comm::Group&, const GradBucket& bucket) override {
    auto s = std::make_unique<GatherState>();
    if (isFloat32(bucket)) {
      s->residual = residuals_.forBucket(bucket);
      if (spec_.denseElements == 0) {
        s->segments.push_back(segment(0, bucket.buffer.numel(), false));
      } else {
        for (size_t k = 0; k < bucket.params.size(); ++k) {
          s->segments.push_back(segment(bucket.offsets[k], bucket.numels[k],
                                        bucket.numels[k] <= spec_.denseElements));
        }
      }
      size_t bytes = 0;
      for (const Segment& seg : s->segments) bytes += seg.bytes;
      s->message.resize(bytes);
    }
    if (spec_.momentum > 0) s->velocity = velocities_.forBucket(bucket);
    return s;
  }

  std::shared_ptr<comm::Work> start(comm::Group& group, GradBucket& bucket) override {
    auto& s = bucket.stateAs<GatherState>();
    s.compressed = steps_.compressed(bucket) && isFloat32(bucket);
    if (!s.compressed) {
      if (s.velocity.defined()) sendVelocity(s, bucket);  // Note [Momentum in the hook]
      return plainAverage(group, bucket);
    }
    const float* grad = bucket.buffer.data_ptr<float>();
    float* residual = s.residual.data_ptr<float>();
    float* velocity = s.velocity.defined() ? s.velocity.data_ptr<float>() : nullptr;
    uint8_t* at = s.message.data();
    for (const Segment& seg : s.segments) {
      encode(seg, grad + seg.offset, residual + seg.offset,
             velocity != nullptr ? velocity + seg.offset : nullptr, at);
      at += seg.bytes;
    }
    // Note [Non-finite gradients]
    // An inf or NaN gradient (a loss-scaling overflow step, which the scaler then skips) would
    // stay in the residual (and the velocity) and poison every later step: they start over
    // instead. Top-k sends a NaN or inf before any finite value, dense parameters send it as
    // it is; the 1-bit scale is not finite, which the receivers turn into NaN gradients
    // (finish()), so every rank sees the overflow, as with the plain average.
    if (!torch::isfinite(bucket.buffer).all().item<bool>()) {
      s.residual.zero_();
      if (s.velocity.defined()) s.velocity.zero_();
    }
    s.gathered.resize(s.message.size() * static_cast<size_t>(group.size()));
    return comm::allgatherAsync(group, s.message.data(), s.gathered.data(), s.message.size(),
                                DataType::kUInt8);
  }

  void finish(comm::Group& group, GradBucket& bucket) override {
    auto& s = bucket.stateAs<GatherState>();
    if (!s.compressed) return;
    const auto n = static_cast<size_t>(bucket.buffer.numel());
    float* out = bucket.buffer.data_ptr<float>();
    // Elements outside every segment (ZeRO's padding, with dense=N) stay 0.
    std::fill(out, out + n, 0.0f);
    const float weight = 1.0f / static_cast<float>(group.size());
    for (int r = 0; r < group.size(); ++r) {
      const uint8_t* at = s.gathered.data() + s.message.size() * static_cast<size_t>(r);
      for (const Segment& seg : s.segments) {
        const auto numel = static_cast<size_t>(seg.numel);
        float* into = out + seg.offset;
        if (seg.dense) {
          addFloats(at, numel, weight, into);
        } else if (spec_.codec == Codec::kTopK) {
          compress::topkAccumulate(at, seg.k, weight, into, numel);
        } else if (!std::isfinite(signScale(at))) {
          // Note [Non-finite gradients]
          std::fill(out, out + n, std::numeric_limits<float>::quiet_NaN());
          return;
        } else {
          compress::signAccumulate(at, numel, weight, into);
        }
        at += seg.bytes;
      }
    }
  }

  std::string name() const override { return fmt::format("{} all-gather", spec_.toString()); }

  std::string stateKind() const override {
    return std::string(spec_.codec == Codec::kTopK ? "topk" : "onebit") +
           (spec_.momentum > 0 ? "+momentum" : "");
  }

  // The residuals and velocities, whatever the density or the dense threshold (they change
  // what is sent, not what the state means).
  std::optional<HookState> viewState() const override {
    HookState state;
    state.kind = stateKind();
    state.steps = steps_.steps();
    residuals_.viewTo("residual", state);
    velocities_.viewTo("velocity", state);
    return state;
  }

  void importState(const HookState& state) override {
    checkKind(*this, state);
    for (const auto& t : state.tensors) slotsOf(t).check(t, name());
    residuals_.zero();
    velocities_.zero();
    for (const auto& t : state.tensors) slotsOf(t).load(t);
    steps_.setSteps(state.steps);
  }

 private:
  Residuals& slotsOf(const HookState::Tensor& t) {
    if (t.key == "residual") return residuals_;
    if (t.key == "velocity" && spec_.momentum > 0) return velocities_;
    SHOAL_THROW(InvalidArgument, "{}: a saved '{}' it does not keep", name(), t.key);
  }

  Segment segment(int64_t offset, int64_t numel, bool dense) const {
    Segment seg{offset, numel, dense, 0, 0};
    const auto n = static_cast<size_t>(numel);
    if (dense) {
      seg.bytes = n * sizeof(float);
    } else if (spec_.codec == Codec::kTopK) {
      seg.k = compress::topkCount(n, spec_.density);
      seg.bytes = compress::topkMessageBytes(seg.k);
    } else {
      seg.bytes = compress::signMessageBytes(n);
    }
    return seg;
  }

  // One segment's message at `at` (seg.bytes); `velocity` null without momentum.
  void encode(const Segment& seg, const float* grad, float* residual, float* velocity,
              uint8_t* at) const {
    const auto n = static_cast<size_t>(seg.numel);
    const auto m = static_cast<float>(spec_.momentum);
    if (seg.dense) {
      if (velocity != nullptr) compress::momentumUpdate(grad, velocity, n, m);
      std::memcpy(at, velocity != nullptr ? velocity : grad, n * sizeof(float));
    } else if (spec_.codec == Codec::kTopK) {
      if (velocity != nullptr) {
        compress::topkEncodeWithMomentum(grad, velocity, residual, n, seg.k, m, at);
      } else {
        compress::topkEncode(grad, residual, n, seg.k, at);
      }
    } else if (velocity != nullptr) {
      compress::signEncodeWithMomentum(grad, velocity, residual, n, m, at);
    } else {
      compress::signEncode(grad, residual, n, at);
    }
  }

  // An uncompressed step with momentum (Note [Momentum in the hook]): u = m u + g, and the
  // bucket's gradients become u for the plain average.
  void sendVelocity(GatherState& s, GradBucket& bucket) const {
    torch::NoGradGuard noGrad;
    s.velocity.mul_(spec_.momentum).add_(bucket.buffer);
    bucket.buffer.copy_(s.velocity);
    // Note [Non-finite gradients]: the velocity starts over, the buffer carries the overflow.
    if (!torch::isfinite(s.velocity).all().item<bool>()) s.velocity.zero_();
  }

  CompressionSpec spec_;
  StepCounter steps_;
  Residuals residuals_;
  Residuals velocities_;
};

}  // namespace

std::shared_ptr<CommHook> gatherHook(const CompressionSpec& spec) {
  return std::make_shared<GatherHook>(spec);
}

}  // namespace shoal::train::ddp::compression
