// Small pieces shared by the gradient machinery of DDP's reducer and ZeRO: hooks around a
// parameter's AccumulateGrad node, and tensors that alias part of a flat buffer.
#pragma once

#include <torch/csrc/autograd/function_hook.h>
#include <torch/torch.h>

#include <algorithm>
#include <functional>
#include <utility>
#include <vector>

namespace shoal::train {

// Runs before a parameter's AccumulateGrad node: the gradient is not in .grad yet.
class BeforeAccumulate : public torch::autograd::FunctionPreHook {
 public:
  explicit BeforeAccumulate(std::function<void()> fn) : fn_(std::move(fn)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& grads) override {
    fn_();
    return grads;
  }

 private:
  std::function<void()> fn_;
};

// Runs after it: .grad holds the accumulated gradient.
class AfterAccumulate : public torch::autograd::FunctionPostHook {
 public:
  explicit AfterAccumulate(std::function<void()> fn) : fn_(std::move(fn)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    fn_();
    return outputs;
  }

 private:
  std::function<void()> fn_;
};

// A contiguous tensor of `sizes` over buffer's storage from element `offset`, without autograd's
// view tracking: libtorch 1.13's Optimizer::zero_grad() calls detach_() on every gradient, which
// autograd refuses for a view ("Can't detach views in-place"); a plain alias of the storage is
// not a view to autograd. It follows the storage: if the storage's memory is replaced (ZeRO-3
// frees and re-allocates a unit's parameters), the alias sees the new memory.
inline torch::Tensor aliasOf(const torch::Tensor& buffer, int64_t offset, c10::IntArrayRef sizes) {
  std::vector<int64_t> strides(sizes.size(), 1);
  for (size_t d = sizes.size(); d-- > 1;)
    strides[d - 1] = strides[d] * std::max<int64_t>(sizes[d], 1);
  return torch::empty({0}, buffer.options())
      .set_(buffer.storage(), buffer.storage_offset() + offset, sizes, strides);
}

}  // namespace shoal::train
