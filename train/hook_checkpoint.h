// A communication hook's state in sharded checkpoints (train/reshard_checkpoint.h), so that a
// job with gradient compression resumes exactly where it stopped: the error-feedback residuals
// (what each rank held back, not yet sent), momentum correction's velocities, PowerSGD's warm
// start and the count of steps that ends a warm-up (ddp::HookState). Without them a resumed job
// would silently drop what the ranks had held back, and start its warm-up and PowerSGD's Q over.
//
// Names in the checkpoint (beside param/, optim/ and buffer/ of train/state_shards.h, which
// nothing else reads them with):
//   hook/<key>/<parameter name>   a per-rank tensor: shape [world size, elements], rank r's in
//                                 row r; a shared one: shape [elements], written by rank 0
// and in the meta "hook" (the state's kind) and "hook_steps".
//
// Loading at the world size that saved it gives every rank its own state back (and DDP its
// bucket order: train/ddp_checkpoint.h), so a resumed job trains as the one that never
// stopped. At another, every rank gets the mean of the per-rank tensors over the ranks that
// saved them (the ranks' held-back gradients enter the average update as their mean, which
// this keeps) and the shared ones as saved.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "comm/group.h"
#include "train/ddp/comm_hook.h"
#include "train/reshard_checkpoint.h"

namespace shoal::train {

// Appends this rank's part of the hook's state to `pieces` and its kind and step count to
// `meta`; nothing when the hook keeps no state. `names`: the trainable parameters' names by
// index (GradBucket::params). Every rank of the checkpoint calls it (its meta must match).
void addHookState(const ddp::CommHook& hook, const std::vector<std::string>& names, int rank,
                  int size, std::vector<FlatPiece>& pieces,
                  std::map<std::string, std::string>& meta);

// The state for rank `rank` of a job of `size` ranks to import into `hook` (see above), or nothing,
// with `why` set to a one-line reason to log, when the checkpoint holds none or another kind's, or
// the hook keeps none. InvalidArgument (naming the checkpoint step) for a tensor of a parameter the
// model does not have, or of the wrong shape.
std::optional<ddp::HookState> readHookState(const ShardReader& reader, const ddp::CommHook& hook,
                                            const std::vector<std::string>& names, int rank,
                                            int size, std::string& why);

// Once the rest of the checkpoint is in place: imports `state` into `hook` on every rank
// (collectively: a refusal on one rank is an error on all, train/collective_verdict.h), or, with
// none, logs `why` (if any) on rank 0.
void restoreHookState(comm::Group& group, ddp::CommHook& hook,
                      const std::optional<ddp::HookState>& state, const std::string& why);

}  // namespace shoal::train
