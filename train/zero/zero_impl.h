// ZeroDataParallel's internals, shared by its files (zero.cpp: sharding, gradients, the step;
// zero_checkpoint.cpp: sharded checkpoints). Not a public header.
#pragma once

#include <torch/torch.h>

#include <algorithm>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/collectives.h"
#include "train/optim/layer_map.h"
#include "train/tensor_types.h"
#include "train/zero/zero.h"

namespace shoal::train::zero {

class StateSource;  // zero_checkpoint.cpp

// Note [Spare blocks]
// Stages 2-3 allocate and free a unit's full parameters and full gradients every step, blocks of
// tens of MiB in a few sizes, interleaved with the engine's and autograd's own. glibc keeps such
// blocks in its heap once freed (its mmap threshold rises to the largest block freed), where
// the mix of sizes fragments it: resident memory grew by about the model's size per step and
// capped the largest model stage 3 could train. Keeping a few freed blocks of each size for the
// next unit of that size makes the working set steady. They are reported as spareBytes.
class SpareBlocks {
 public:
  static constexpr size_t kPerSize = 2;
  at::DataPtr take(size_t bytes, c10::Allocator& allocator) {
    auto it = blocks_.find(bytes);
    if (it == blocks_.end() || it->second.empty()) return allocator.allocate(bytes);
    at::DataPtr p = std::move(it->second.back());
    it->second.pop_back();
    return p;
  }
  void give(size_t bytes, at::DataPtr p) {
    auto& list = blocks_[bytes];
    if (bytes > 0 && p.get() != nullptr && list.size() < kPerSize) list.push_back(std::move(p));
  }
  int64_t bytes() const {
    int64_t n = 0;
    for (auto& [size, list] : blocks_) n += static_cast<int64_t>(size * list.size());
    return n;
  }

 private:
  std::map<size_t, std::vector<at::DataPtr>> blocks_;
};

// The same for gradient buffers (tensors of one dtype, by element count).
class SpareTensors {
 public:
  torch::Tensor zeros(int64_t numel, const torch::TensorOptions& options) {
    for (size_t i = 0; i < spare_.size(); ++i) {
      if (spare_[i].numel() == numel && spare_[i].dtype() == options.dtype()) {
        torch::Tensor t = std::move(spare_[i]);
        spare_.erase(spare_.begin() + static_cast<std::ptrdiff_t>(i));
        return t.zero_();
      }
    }
    return torch::zeros({numel}, options);
  }
  void give(torch::Tensor t) {
    if (t.defined() && spare_.size() < 2 * SpareBlocks::kPerSize) spare_.push_back(std::move(t));
  }
  int64_t bytes() const {
    int64_t n = 0;
    for (auto& t : spare_) n += t.numel() * static_cast<int64_t>(t.element_size());
    return n;
  }

 private:
  std::vector<torch::Tensor> spare_;
};

struct Unit {
  std::vector<size_t> params;    // indices into Impl::params
  std::vector<int64_t> offsets;  // each parameter's first element in the unit
  int64_t numel = 0;             // elements of the parameters
  int64_t padded = 0;            // numel rounded up to a multiple of N
  int64_t shard = 0;             // padded / N: this rank's part
  torch::Tensor flat;            // the full parameters (compute dtype); the module's alias it
  bool gathered = true;
  std::shared_ptr<comm::Work> gatherWork;  // stage 3: an all-gather in flight
  torch::Tensor gatherSend;                // its source, while it runs (a cast master)
  torch::Tensor fullGrad;  // the full gradients being accumulated (stage 1: always there)
  torch::Tensor lowGrad;   // a bf16/fp16 module's reduce-scatter target, while it runs
  torch::Tensor master;    // this rank's shard of the parameters: what the optimizer steps
  size_t pending = 0;      // parameters without their gradient this iteration
  bool started = false;
  std::shared_ptr<comm::Work> reduceWork;
  std::unique_ptr<ddp::GradBucket> hookBucket;  // stage 1 with ZeroOptions::commHook
  bool hookStarted = false;                     // its start() ran, finish() has not
};

struct ZeroDataParallel::Impl {
  std::shared_ptr<torch::nn::Module> module;
  torch::nn::Sequential sequential{nullptr};
  std::shared_ptr<comm::Group> group;
  ZeroOptions options;
  int rank = 0, size = 1;
  std::vector<torch::Tensor> params;
  std::vector<std::string> names;
  std::vector<torch::Tensor> buffers;
  std::vector<Unit> units;  // reduction order (Note [Shard units])
  std::vector<size_t> unitOf;
  std::vector<int64_t> offsetOf;
  std::vector<char> arrived;   // per parameter, this iteration
  std::vector<int> childUnit;  // stage 3: Sequential child -> unit, -1 without parameters
  torch::ScalarType computeType = torch::kFloat;
  torch::ScalarType masterType = torch::kFloat;
  bool mixed = false;  // the module computes in bf16/fp16; the masters are fp32
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;
  std::vector<uintptr_t> postHookKeys;
  size_t nextToStart = 0;
  SpareBlocks spare;           // freed full parameters (stage 3)
  SpareTensors spareGrads;     // freed full gradients (stages 2-3)
  std::deque<Unit*> inFlight;  // reductions started and not yet completed
  bool sync = true;            // of the iteration in progress
  std::exception_ptr hookFailure;
  std::shared_ptr<bool> alive = std::make_shared<bool>(true);

  Impl(std::shared_ptr<torch::nn::Module> m, torch::nn::Sequential seq,
       std::shared_ptr<comm::Group> g, ZeroOptions o);
  ~Impl();

  void buildUnits();
  LayerMap layerMap() const;
  void shardUnits();
  void registerHooks();
  DataType wireType() const { return toShoalType(computeType); }
  // The pieces of the unit's parameters this rank's shard holds: parameter `param`'s elements
  // [paramOffset, paramOffset + count) are the shard's [shardOffset, shardOffset + count).
  struct Held {
    size_t param;
    int64_t shardOffset, paramOffset, count;
  };
  std::vector<Held> heldPieces(const Unit& u) const {
    std::vector<Held> out;
    const int64_t base = rank * u.shard;
    for (size_t k = 0; k < u.params.size(); ++k) {
      const int64_t begin = u.offsets[k], end = begin + params[u.params[k]].numel();
      const int64_t first = std::max(begin, base), last = std::min(end, base + u.shard);
      if (first < last) out.push_back({u.params[k], first - base, first - begin, last - first});
    }
    return out;
  }
  torch::Tensor shardOf(const torch::Tensor& full, const Unit& u) const {
    return full.narrow(0, rank * u.shard, u.shard);
  }

  // Stage 3 (zero_gather.cpp).
  void allocateFlat(Unit& u);
  void freeFlat(Unit& u);
  void startGather(Unit& u);
  void ensureGathered(size_t unit);
  void release(Unit& u);
  void gatherForBackward(size_t unit);

  void onGradient(size_t param);
  void startReady();
  void startReduce(Unit& u);
  void completeReduce(Unit& u);
  void finishIteration();
  std::exception_ptr drain() noexcept;
  void resetIteration();
  double clipGradients();
  void gatherAfterStep();

  // zero_checkpoint.cpp: this rank's state as pieces named as a sharded checkpoint names them,
  // and loading it back from a source opened on every rank (collective).
  std::vector<FlatPiece> statePieces(bool withBuffers, int64_t& optimizerStep) const;
  void loadFrom(const std::string& what, const std::function<const StateSource&()>& open);
};

}  // namespace shoal::train::zero
