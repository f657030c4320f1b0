// A rank program for the flight recorder tests (tests/flight_test.cpp), started by `shoal run`
// with SHOAL_FLIGHT_DIR set: joins the world through shoal::init() and runs ten all-reduces of
// 1000 + i floats (i = 0..9, so each has its own size), then splits the world into even and odd
// ranks, all-reduces in each half, and ends with a barrier.
//
//   shoal_flight_worker ok
//   shoal_flight_worker skip R I   rank R leaves out all-reduce I (the others do not)
//   shoal_flight_worker kill R I   rank R kills itself (SIGKILL) instead of all-reduce I
//
// Prints "FLIGHT_WORKER rank R of N done" on success, "ERROR <Type>: <message>" and exits 1
// otherwise.
#include <csignal>
#include <cstdio>
#include <string>
#include <vector>

#include "comm/collectives.h"
#include "common/env.h"
#include "common/error.h"
#include "run/init.h"
#include "tests/process_util.h"

using namespace shoal;

int main(int argc, char** argv) {
  try {
    const std::string mode = argc > 1 ? argv[1] : "ok";
    int oddRank = -1, oddStep = -1;
    if (mode == "skip" || mode == "kill") {
      SHOAL_CHECK(argc == 4, "usage: shoal_flight_worker {} RANK STEP", mode);
      oddRank = static_cast<int>(parseInteger("RANK", argv[2], 0, 1 << 20));
      oddStep = static_cast<int>(parseInteger("STEP", argv[3], 0, 9));
    } else {
      SHOAL_CHECK(mode == "ok", "unknown mode '{}' (ok, skip, kill)", mode);
    }
    World w = init();
    comm::Group& g = *w.group;
    for (int i = 0; i < 10; ++i) {
      if (g.rank() == oddRank && i == oddStep) {
        if (mode == "kill") std::raise(SIGKILL);
        continue;
      }
      std::vector<float> v(1000 + static_cast<size_t>(i), 1.0f);
      comm::allreduce(g, v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum);
      SHOAL_CHECK_EQ(v[0], static_cast<float>(g.size()), "all-reduce {}", i);
    }
    auto half = g.split(g.rank() % 2, g.rank());
    float x = 1.0f;
    comm::allreduce(*half, &x, 1, DataType::kFloat32, ReduceOp::kSum);
    SHOAL_CHECK_EQ(x, static_cast<float>(half->size()), "all-reduce in the half");
    comm::barrier(g);
    std::printf("FLIGHT_WORKER rank %d of %d done\n", g.rank(), g.size());
    std::fflush(stdout);
    return 0;
  } catch (const std::exception& e) {
    std::printf("ERROR %s: %s\n", test::typeName(e), e.what());
    std::fflush(stdout);
    return 1;
  }
}
