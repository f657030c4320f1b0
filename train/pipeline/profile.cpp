#include "train/pipeline/profile.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <utility>

#include "common/error.h"

namespace shoal::train::pipeline {
namespace {

using Clock = std::chrono::steady_clock;

double msSince(Clock::time_point start, Clock::time_point end) {
  return std::chrono::duration<double, std::milli>(end - start).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// Puts back, at scope exit (normal or by exception), what running layers in training mode may
// change: the buffers' values and the CPU generator's state.
class RestoreModelState {
 public:
  explicit RestoreModelState(torch::nn::Module& net) {
    torch::NoGradGuard noGrad;
    for (const torch::Tensor& b : net.buffers()) {
      buffers_.push_back(b);
      saved_.push_back(b.clone());
    }
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    rng_ = gen.get_state();
  }
  ~RestoreModelState() {
    torch::NoGradGuard noGrad;
    for (size_t i = 0; i < buffers_.size(); ++i) buffers_[i].copy_(saved_[i]);
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(rng_);
  }
  RestoreModelState(const RestoreModelState&) = delete;
  RestoreModelState& operator=(const RestoreModelState&) = delete;

 private:
  std::vector<torch::Tensor> buffers_, saved_;
  torch::Tensor rng_;
};

}  // namespace

std::vector<LayerProfile> profileLayers(torch::nn::Sequential& net,
                                        const torch::Tensor& sampleMicroBatch, int repeats,
                                        int warmups) {
  if (net.is_empty() || net->size() == 0) {
    SHOAL_THROW(InvalidArgument, "profileLayers: the model has no layers");
  }
  if (!sampleMicroBatch.defined()) {
    SHOAL_THROW(InvalidArgument, "profileLayers: undefined sample micro-batch");
  }
  if (!sampleMicroBatch.device().is_cpu()) {
    SHOAL_THROW(InvalidArgument, "profileLayers: the sample is on {}; only CPU times are measured",
                sampleMicroBatch.device().str());
  }
  if (repeats < 1) SHOAL_THROW(InvalidArgument, "profileLayers: repeats = {}, need >= 1", repeats);
  if (warmups < 0) SHOAL_THROW(InvalidArgument, "profileLayers: warmups = {}, need >= 0", warmups);

  RestoreModelState restore(*net);
  torch::AutoGradMode gradOn(true);
  const auto children = net->named_children();
  const size_t n = net->size();

  // Note [Profiling in sweeps]
  // Layers are timed in the order training runs them: a forward sweep through every layer,
  // then a backward sweep in reverse, each layer on its own graph (its input detached) so its
  // forward and backward can be timed alone. Timing one layer many times in a row instead
  // keeps its weights in cache, which training never does: on the residual MLP at micro-batch
  // 128 that made a 784-wide first layer look dearer than 2 blocks and cut 14% off the
  // balance of the measured stages.
  struct Layer {
    torch::nn::AnyModule module;
    std::vector<torch::Tensor> wrt;          // its input (if a gradient is needed), parameters
    size_t parameterGrads = 0;               // the first wrt entries that are parameters
    std::vector<torch::Tensor> accumulated;  // where its parameter gradients add up
    std::vector<double> forwardMs, backwardMs, totalMs;
  };
  std::vector<Layer> layers;
  std::vector<LayerProfile> profile(n);
  size_t index = 0;
  for (torch::nn::AnyModule& module : *net) {
    Layer l{module, {}, 0, {}, {}, {}, {}};
    profile[index].name = children[index].key();
    for (const torch::Tensor& param : module.ptr()->parameters()) {
      profile[index].parameters += param.numel();
      if (param.requires_grad()) {
        l.wrt.push_back(param);
        l.accumulated.push_back(torch::zeros_like(param));
      }
    }
    l.parameterGrads = l.wrt.size();
    layers.push_back(std::move(l));
    ++index;
  }
  for (int r = 0; r < warmups + repeats; ++r) {
    std::vector<torch::Tensor> inputs(n), outputs(n);
    std::vector<double> forward(n), backward(n);
    torch::Tensor x = sampleMicroBatch;
    for (size_t i = 0; i < n; ++i) {
      // The first layer's input is the data, whose gradient nobody computes; every later
      // layer's is an activation whose gradient a pipeline sends back.
      inputs[i] = x.detach();
      if (i > 0 && inputs[i].is_floating_point()) inputs[i].requires_grad_(true);
      const auto t0 = Clock::now();
      outputs[i] = layers[i].module.forward(inputs[i]);
      forward[i] = msSince(t0, Clock::now());
      x = outputs[i];
    }
    torch::Tensor gradOut;
    for (size_t i = n; i-- > 0;) {
      Layer& l = layers[i];
      std::vector<torch::Tensor> wrt = l.wrt;
      if (inputs[i].requires_grad()) wrt.push_back(inputs[i]);
      const auto t0 = Clock::now();
      if (outputs[i].requires_grad()) {
        // The last layer gets ones, as from a loss; the others what the next layer sent back.
        if (!gradOut.defined()) gradOut = torch::ones_like(outputs[i]);
        auto grads = torch::autograd::grad({outputs[i]}, wrt, {gradOut}, /*retain_graph=*/false,
                                           /*create_graph=*/false, /*allow_unused=*/true);
        for (size_t k = 0; k < l.parameterGrads; ++k) {
          if (grads[k].defined()) l.accumulated[k].add_(grads[k]);
        }
        gradOut =
            inputs[i].requires_grad() && grads.back().defined() ? grads.back() : torch::Tensor();
      } else {
        gradOut = torch::Tensor();
      }
      backward[i] = msSince(t0, Clock::now());
      if (gradOut.defined() && i > 0 && !gradOut.sizes().equals(outputs[i - 1].sizes())) {
        gradOut = torch::Tensor();
      }
    }
    if (r < warmups) continue;
    for (size_t i = 0; i < n; ++i) {
      layers[i].forwardMs.push_back(forward[i]);
      layers[i].backwardMs.push_back(backward[i]);
      layers[i].totalMs.push_back(forward[i] + backward[i]);
    }
    if (r == warmups + repeats - 1) {
      for (size_t i = 0; i < n; ++i) {
        profile[i].outputBytes =
            outputs[i].numel() * static_cast<int64_t>(outputs[i].element_size());
        profile[i].outputShape = outputs[i].sizes().vec();
      }
    }
  }
  for (size_t i = 0; i < n; ++i) {
    profile[i].forwardMs = median(layers[i].forwardMs);
    profile[i].backwardMs = median(layers[i].backwardMs);
    profile[i].ms = median(layers[i].totalMs);
  }
  return profile;
}

std::vector<LayerInfo> toLayerInfo(const std::vector<LayerProfile>& profile) {
  std::vector<LayerInfo> layers;
  layers.reserve(profile.size());
  for (const LayerProfile& p : profile) {
    layers.push_back(LayerInfo{p.name, p.parameters, p.ms, p.outputBytes});
  }
  return layers;
}

}  // namespace shoal::train::pipeline
