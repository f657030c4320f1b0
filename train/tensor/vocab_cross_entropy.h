// Cross-entropy over logits split by vocabulary (Megatron-LM's vocab-parallel cross-entropy):
// the full logits are never gathered. Each rank holds the logits of its vocabulary slice; the
// ranks agree on each token's maximum logit, its sum of exponentials and its target's logit
// through three all-reduces of one number per token, so the exchange is O(tokens), not
// O(tokens x vocabulary). Backward is local: softmax minus the one-hot target on each slice.
//
// Contract: collective over tg.group in forward (see regions.h); none in backward. Shapes:
// logits [..., slice] with `vocabStart` the first vocabulary id of this rank's slice, targets
// int64 [...] in [0, vocabulary); returns each token's loss [...] (float, the logits' type
// promoted to float). InvalidArgument for shapes that do not match.
#pragma once

#include <torch/torch.h>

#include "train/tensor/tensor_group.h"

namespace shoal::train::tensor {

torch::Tensor vocabParallelCrossEntropy(const torch::Tensor& localLogits,
                                        const torch::Tensor& targets, int64_t vocabStart,
                                        const TensorGroup& tg);

}  // namespace shoal::train::tensor
