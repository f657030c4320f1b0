#include "train/ddp/comm_hook.h"

#include <fmt/format.h>

#include <algorithm>
#include <tuple>

#include "comm/collectives.h"
#include "common/error.h"
#include "train/tensor_types.h"

namespace shoal::train::ddp {

void GradBucket::throwWrongState() const {
  SHOAL_THROW(InternalError,
              "DistributedDataParallel: bucket {} holds no state of the type its hook expects "
              "(makeState returned {} state)",
              index, state ? "another" : "no");
}

std::unique_ptr<BucketState> CommHook::makeState(comm::Group&, const GradBucket&) {
  return nullptr;
}

void CommHook::finish(comm::Group&, GradBucket&) {}

std::string CommHook::stateKind() const {
  return {};
}

void HookState::sortTensors() {
  std::sort(tensors.begin(), tensors.end(), [](const Tensor& a, const Tensor& b) {
    return std::tie(a.key, a.param) < std::tie(b.key, b.param);
  });
}

std::optional<HookState> CommHook::viewState() const {
  return std::nullopt;
}

std::optional<HookState> CommHook::exportState() const {
  auto state = viewState();
  if (state) {
    for (auto& t : state->tensors) t.data = t.data.clone();
  }
  return state;
}

void CommHook::importState(const HookState& state) {
  SHOAL_THROW(InvalidArgument, "the {} keeps no state between steps; a {} state does not fit it",
              name(), state.kind);
}

std::shared_ptr<comm::Work> AllreduceHook::start(comm::Group& group, GradBucket& bucket) {
  return comm::allreduceAsync(group, bucket.buffer.data_ptr(),
                              static_cast<size_t>(bucket.buffer.numel()),
                              toShoalType(bucket.buffer.scalar_type()), op_, call_);
}

std::string AllreduceHook::name() const {
  return op_ == ReduceOp::kAvg ? "average all-reduce" : fmt::format("{} all-reduce", toString(op_));
}

std::shared_ptr<CommHook> averageAllreduce() {
  return std::make_shared<AllreduceHook>(ReduceOp::kAvg);
}

}  // namespace shoal::train::ddp
