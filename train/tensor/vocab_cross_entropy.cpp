#include "train/tensor/vocab_cross_entropy.h"

#include <string>

#include "common/error.h"
#include "train/tensor/regions.h"

namespace shoal::train::tensor {
namespace {

struct VocabParallelCrossEntropy : torch::autograd::Function<VocabParallelCrossEntropy> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& logits,
                               const torch::Tensor& targets, int64_t vocabStart,
                               const TensorGroup& tg) {
    torch::Tensor x = logits.to(torch::kFloat32);
    torch::Tensor maxLogit = std::get<0>(x.max(-1));
    allreduceInPlace(maxLogit, tg, ReduceOp::kMax);
    torch::Tensor shifted = x - maxLogit.unsqueeze(-1);

    const int64_t width = x.size(-1);
    torch::Tensor outside = (targets < vocabStart) | (targets >= vocabStart + width);
    torch::Tensor local = (targets - vocabStart).masked_fill(outside, 0);
    torch::Tensor targetLogit =
        shifted.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0);
    allreduceInPlace(targetLogit, tg);

    torch::Tensor exp = shifted.exp();
    torch::Tensor sumExp = exp.sum(-1);
    allreduceInPlace(sumExp, tg);

    ctx->save_for_backward({exp.div_(sumExp.unsqueeze(-1)), local, outside});
    ctx->saved_data["type"] = static_cast<int64_t>(logits.scalar_type());
    return sumExp.log() - targetLogit;
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    auto saved = ctx->get_saved_variables();
    torch::Tensor grad = saved[0];  // softmax over the full vocabulary, this rank's columns
    torch::Tensor oneHot = torch::zeros_like(grad).scatter_(-1, saved[1].unsqueeze(-1), 1.0);
    oneHot.masked_fill_(saved[2].unsqueeze(-1), 0.0);
    grad = (grad - oneHot) * grads[0].unsqueeze(-1);
    const auto type = static_cast<torch::ScalarType>(ctx->saved_data["type"].toInt());
    return {grad.to(type), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor vocabParallelCrossEntropy(const torch::Tensor& localLogits,
                                        const torch::Tensor& targets, int64_t vocabStart,
                                        const TensorGroup& tg) {
  if (targets.scalar_type() != torch::kInt64 ||
      localLogits.sizes().slice(0, localLogits.dim() - 1) != targets.sizes()) {
    SHOAL_THROW(InvalidArgument,
                "vocabulary-parallel cross-entropy: logits {} do not match int64 targets {}",
                c10::str(localLogits.sizes()), c10::str(targets.sizes()));
  }
  return VocabParallelCrossEntropy::apply(localLogits, targets, vocabStart, tg);
}

}  // namespace shoal::train::tensor
