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
  std::vector<LayerProfile> profile;
  profile.reserve(net->size());
  torch::Tensor input = sampleMicroBatch;
  size_t index = 0;
  for (torch::nn::AnyModule& layer : *net) {
    LayerProfile p;
    p.name = children[index].key();
    ++index;
    std::vector<torch::Tensor> wrt;  // what backward computes gradients of
    for (const torch::Tensor& param : layer.ptr()->parameters()) {
      p.parameters += param.numel();
      if (param.requires_grad()) wrt.push_back(param);
    }
    const size_t parameterGrads = wrt.size();
    torch::Tensor x = input.detach();
    // The first layer's input is the data, whose gradient nobody computes; every later layer's
    // is an activation whose gradient a pipeline sends back.
    if (index > 1 && x.is_floating_point()) {
      x.requires_grad_(true);
      wrt.push_back(x);
    }
    // Where the parameter gradients accumulate, as backward adds each micro-batch's into .grad.
    std::vector<torch::Tensor> accumulated;
    for (size_t i = 0; i < parameterGrads; ++i) accumulated.push_back(torch::zeros_like(wrt[i]));

    std::vector<double> forwardMs, backwardMs, totalMs;
    torch::Tensor y, gradOut;
    for (int r = 0; r < warmups + repeats; ++r) {
      const auto t0 = Clock::now();
      y = layer.forward(x);
      const auto t1 = Clock::now();
      if (y.requires_grad()) {
        // Made once, outside the timings: the gradient a next stage would send.
        if (!gradOut.defined()) gradOut = torch::ones_like(y);
        auto grads = torch::autograd::grad({y}, wrt, {gradOut}, /*retain_graph=*/false,
                                           /*create_graph=*/false, /*allow_unused=*/true);
        for (size_t i = 0; i < parameterGrads; ++i) {
          if (grads[i].defined()) accumulated[i].add_(grads[i]);
        }
      }
      const auto t2 = Clock::now();
      if (r < warmups) continue;
      forwardMs.push_back(msSince(t0, t1));
      backwardMs.push_back(msSince(t1, t2));
      totalMs.push_back(msSince(t0, t2));
    }
    p.forwardMs = median(forwardMs);
    p.backwardMs = median(backwardMs);
    p.ms = median(totalMs);
    p.outputBytes = y.numel() * static_cast<int64_t>(y.element_size());
    p.outputShape = y.sizes().vec();
    profile.push_back(std::move(p));
    input = y.detach();
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
