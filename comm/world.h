// Joining the world group of a job whose ranks were started by something else (Shoal's local
// job runner today, `shoal run` later), from SHOAL_RANK, SHOAL_WORLD_SIZE and SHOAL_STORE_ADDR.
#pragma once

#include <memory>

#include "comm/group.h"

namespace shoal::comm {

// Blocking, bounded by the group timeout. Throws InvalidArgument naming a missing or bad
// variable, StoreError if the store cannot be reached.
std::shared_ptr<Group> joinWorld();

}  // namespace shoal::comm
