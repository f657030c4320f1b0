// One verdict for a step every rank does on its own (reading its part of a checkpoint): if it
// fails anywhere, it fails everywhere, with the failing rank's message, instead of the others
// going on into a collective their peer never joins.
#pragma once

#include <functional>
#include <string>

#include "comm/group.h"

namespace shoal::train {

// Runs body(); then, collectively, learns whether it threw on any rank. The lowest failing
// rank rethrows its own exception; every other rank throws InvalidArgument
// "rank r: <what> failed on rank k: <k's message>". Blocking, bounded by the group's timeout.
void onEveryRank(comm::Group& group, const std::string& what, const std::function<void()>& body);

}  // namespace shoal::train
