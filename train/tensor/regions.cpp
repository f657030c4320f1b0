#include "train/tensor/regions.h"

#include <chrono>
#include <utility>
#include <vector>

#include "comm/collectives.h"
#include "common/error.h"
#include "train/tensor_types.h"

namespace shoal::train::tensor {

Slice sliceOf(int64_t total, int rank, int ranks) {
  SHOAL_CHECK(ranks >= 1 && rank >= 0 && rank < ranks, "sliceOf: rank {} of {}", rank, ranks);
  const int64_t base = total / ranks;
  const int64_t extra = total % ranks;
  return {rank * base + std::min<int64_t>(rank, extra), base + (rank < extra ? 1 : 0)};
}

namespace {

// The autograd graph keeps the group alive until backward ran: a capsule in the node's saved
// data (custom autograd functions can save only IValues).
struct GroupCapsule : torch::CustomClassHolder {
  explicit GroupCapsule(TensorGroup g) : tg(std::move(g)) {}
  TensorGroup tg;
};

void save(torch::autograd::AutogradContext* ctx, const TensorGroup& tg) {
  ctx->saved_data["tg"] = c10::IValue::make_capsule(c10::make_intrusive<GroupCapsule>(tg));
}

const TensorGroup& load(torch::autograd::AutogradContext* ctx) {
  auto holder = ctx->saved_data["tg"].toCapsule();
  return static_cast<GroupCapsule*>(holder.get())->tg;
}

enum class Pass { kForward, kBackward };

// Times and counts one collective on the group.
template <typename Fn>
void counted(const TensorGroup& tg, Pass pass, bool allreduce, int64_t bytes, Fn&& fn) {
  const auto start = std::chrono::steady_clock::now();
  fn();
  CommCounters& c = *tg.counters;
  c.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  c.bytes += bytes;
  if (!allreduce) {
    ++c.allgathers;
  } else if (pass == Pass::kForward) {
    ++c.forwardAllreduces;
  } else {
    ++c.backwardAllreduces;
  }
}

torch::Tensor allreduced(const torch::Tensor& x, const TensorGroup& tg, Pass pass,
                         ReduceOp op = ReduceOp::kSum) {
  torch::Tensor out = x.contiguous().clone();
  counted(tg, pass, true, out.nbytes(), [&] {
    comm::allreduce(*tg.group, out.data_ptr(), out.numel(), toShoalType(out.scalar_type()), op);
  });
  return out;
}

void requireDivisible(const torch::Tensor& x, const TensorGroup& tg, const char* what) {
  SHOAL_CHECK(x.dim() >= 1, "{}: a tensor with no dimensions", what);
  if (x.size(-1) % tg.size() != 0) {
    SHOAL_THROW(InvalidArgument,
                "{}: last dimension {} does not divide over {} tensor-parallel ranks", what,
                x.size(-1), tg.size());
  }
}

// All-gather of equal slices along the last dimension.
torch::Tensor gathered(const torch::Tensor& x, const TensorGroup& tg, Pass pass) {
  torch::Tensor local = x.contiguous();
  std::vector<int64_t> shape = {tg.size()};
  for (int64_t s : local.sizes()) shape.push_back(s);
  torch::Tensor all = torch::empty(shape, local.options());
  counted(tg, pass, false, all.nbytes(), [&] {
    comm::allgather(*tg.group, local.data_ptr(), all.data_ptr(), local.numel(),
                    toShoalType(local.scalar_type()));
  });
  return torch::cat(all.unbind(0), -1);
}

torch::Tensor ownSlice(const torch::Tensor& x, const TensorGroup& tg) {
  const int64_t width = x.size(-1) / tg.size();
  return x.narrow(-1, tg.rank() * width, width).contiguous();
}

struct CopyToRegion : torch::autograd::Function<CopyToRegion> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const TensorGroup& tg) {
    save(ctx, tg);
    return x.view_as(x);
  }
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    return {allreduced(grads[0], load(ctx), Pass::kBackward), torch::Tensor()};
  }
};

struct ReduceFromRegion : torch::autograd::Function<ReduceFromRegion> {
  static torch::Tensor forward(torch::autograd::AutogradContext*, const torch::Tensor& x,
                               const TensorGroup& tg) {
    return allreduced(x, tg, Pass::kForward);
  }
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext*,
                                               torch::autograd::tensor_list grads) {
    return {grads[0], torch::Tensor()};
  }
};

struct GatherFromRegion : torch::autograd::Function<GatherFromRegion> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const TensorGroup& tg) {
    save(ctx, tg);
    return gathered(x, tg, Pass::kForward);
  }
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    return {ownSlice(grads[0], load(ctx)), torch::Tensor()};
  }
};

struct ScatterToRegion : torch::autograd::Function<ScatterToRegion> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const TensorGroup& tg) {
    save(ctx, tg);
    return ownSlice(x, tg);
  }
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    return {gathered(grads[0], load(ctx), Pass::kBackward), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor copyToRegion(const torch::Tensor& x, const TensorGroup& tg) {
  return tg.parallel() ? CopyToRegion::apply(x, tg) : x;
}

torch::Tensor reduceFromRegion(const torch::Tensor& x, const TensorGroup& tg) {
  return tg.parallel() ? ReduceFromRegion::apply(x, tg) : x;
}

torch::Tensor gatherFromRegion(const torch::Tensor& x, const TensorGroup& tg) {
  if (!tg.parallel()) return x;
  return GatherFromRegion::apply(x, tg);
}

torch::Tensor scatterToRegion(const torch::Tensor& x, const TensorGroup& tg) {
  if (!tg.parallel()) return x;
  requireDivisible(x, tg, "scatterToRegion");
  return ScatterToRegion::apply(x, tg);
}

void allreduceInPlace(torch::Tensor& t, const TensorGroup& tg, ReduceOp op) {
  if (!tg.parallel()) return;
  t = allreduced(t, tg, Pass::kForward, op);
}

torch::Tensor allgatherLastDim(const torch::Tensor& x, const TensorGroup& tg,
                               const std::vector<int64_t>& sizes) {
  if (!tg.parallel()) return x;
  SHOAL_CHECK(static_cast<int>(sizes.size()) == tg.size() && x.size(-1) == sizes[tg.rank()],
              "allgatherLastDim: slice sizes do not match the group");
  const int64_t widest = *std::max_element(sizes.begin(), sizes.end());
  torch::Tensor padded = torch::constant_pad_nd(x, {0, widest - x.size(-1)});
  torch::Tensor all = gathered(padded, tg, Pass::kForward);
  std::vector<torch::Tensor> parts;
  for (int r = 0; r < tg.size(); ++r) parts.push_back(all.narrow(-1, r * widest, sizes[r]));
  return torch::cat(parts, -1);
}

}  // namespace shoal::train::tensor
