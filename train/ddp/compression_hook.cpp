// The factory behind compressionHook() (train/ddp/compression_hook.h) and what its hooks share
// (train/ddp/compression_parts.h).
#include "train/ddp/compression_hook.h"

#include "comm/collectives.h"
#include "common/error.h"
#include "train/ddp/compression_parts.h"
#include "train/tensor_types.h"

namespace shoal::train::ddp {

namespace compression {

void checkKind(const CommHook& hook, const HookState& state) {
  if (state.kind != hook.stateKind()) {
    SHOAL_THROW(InvalidArgument, "{}: the saved state is a {} hook's, not a {} one's", hook.name(),
                state.kind, hook.stateKind());
  }
}

bool isFloat32(const GradBucket& bucket) {
  return bucket.buffer.scalar_type() == torch::kFloat32;
}

std::shared_ptr<comm::Work> plainAverage(comm::Group& group, GradBucket& bucket) {
  return comm::allreduceAsync(group, bucket.buffer.data_ptr(),
                              static_cast<size_t>(bucket.buffer.numel()),
                              toShoalType(bucket.buffer.scalar_type()), ReduceOp::kAvg);
}

}  // namespace compression

std::shared_ptr<CommHook> compressionHook(const compress::CompressionSpec& spec) {
  switch (spec.codec) {
    case compress::Codec::kNone:
      return averageAllreduce();
    case compress::Codec::kFp16:
      return compression::castHook(DataType::kFloat16, spec.warmupSteps);
    case compress::Codec::kBf16:
      return compression::castHook(DataType::kBFloat16, spec.warmupSteps);
    case compress::Codec::kTopK:
    case compress::Codec::kOneBit:
      return compression::gatherHook(spec);
    case compress::Codec::kPowerSgd:
      return compression::powerSgdHook(spec);
  }
  SHOAL_THROW(InvalidArgument, "compression: unknown codec {}", static_cast<int>(spec.codec));
}

}  // namespace shoal::train::ddp
