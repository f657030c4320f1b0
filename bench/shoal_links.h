// A Shoal benchmark's label must be true: "tcp+tls" only over links that really are TLS, "tcp"
// only over clear TCP (a stray SHOAL_ENCRYPT in the environment would otherwise mislabel a row).
#pragma once

#include <cstdio>
#include <string>

#include "comm/group.h"
#include "comm/native/native_engine.h"

namespace shoal::bench {

// Whether every link of this rank is of `kind`; says which is not on stderr otherwise.
inline bool linksAre(comm::Group& g, transport::LinkKind kind) {
  for (int p = 0; p < g.size(); ++p) {
    if (p == g.rank() || comm::nativeEngine(g).linkKind(p) == kind) continue;
    std::fprintf(stderr, "rank %d: the link to rank %d is %s, the benchmark expected %s\n",
                 g.rank(), p, std::string(toString(comm::nativeEngine(g).linkKind(p))).c_str(),
                 std::string(toString(kind)).c_str());
    return false;
  }
  return true;
}

}  // namespace shoal::bench
