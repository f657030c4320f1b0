// The shard that shard_restore_fuzz restores into, shared with the seed generator.
#include "ps/config.h"
#include "ps/partition.h"
#include "ps/shard.h"

namespace shoal::fuzz {

using namespace shoal::ps;

const Partition& restorePartition() {
  static const Partition p({KeySpec{"w", {3, 4}, DataType::kFloat32, KeyKind::kParameter},
                            KeySpec{"b", {4}, DataType::kFloat32, KeyKind::kParameter},
                            KeySpec{"steps", {1}, DataType::kFloat32, KeyKind::kState}},
                           1);
  return p;
}

// Adam: two state vectors, so every field of the format is present.
Shard makeRestoreShard(const Partition& p) {
  TrainingConfig config;
  config.optimizer.kind = OptimizerKind::kAdam;
  return Shard(p, 0, 2, config);
}

}  // namespace shoal::fuzz
