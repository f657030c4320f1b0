// Checks a libtorch archive (a zip file) against its own size before libtorch opens it.
//
// Why: libtorch's zip reader allocates whatever sizes the archive's directory claims (a crafted
// 2 KiB checkpoint made it allocate 3.3 GB), so the claims are checked here first: every entry
// must lie inside the bytes given, stored entries must claim as many bytes as they hold, and a
// compressed entry may not expand beyond what deflate can. Only the container is checked; the
// tensors inside are checked by the loader against the model.
//
// Pure function on bytes; throws InvalidArgument with one line saying what is wrong.
#pragma once

#include <string_view>

namespace shoal::train {

void checkArchiveBounds(std::string_view archive);

}  // namespace shoal::train
