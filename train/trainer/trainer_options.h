// Private to the Trainer (train/trainer.h): its options and context checked before anything is
// built, each bad value named in one line (InvalidArgument), and the strategies' families.
#pragma once

#include "train/trainer.h"

namespace shoal::train {

bool isZero(Strategy s);
// The strategies that split the model over a process grid (train/trainer/hybrid_strategy.cpp).
bool onGrid(Strategy s);

// The options alone.
void validateOptions(const TrainerOptions& o);
// The options against the job: parameter servers, this rank's role, an elastic job's limits.
// `ctx.world` must be set.
void validateContext(const TrainerOptions& o, const TrainerContext& ctx);

}  // namespace shoal::train
