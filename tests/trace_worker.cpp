// A rank program for the timeline tests (tests/trace_alignment_test.cpp,
// tests/trace_wait_test.cpp), started by `shoal run` with SHOAL_TRACE set: joins the world
// through shoal::init(), runs collectives and exits; the world writes the rank's trace file as
// it goes.
//
//   shoal_trace_worker <barriers>     a fixed sequence of collectives (all-reduces of three
//                                     sizes, a broadcast, an all-gather, an asynchronous
//                                     all-reduce, a send / receive ring), then that many barriers
//   shoal_trace_worker late <ms>      a barrier; an all-reduce of 1024 floats that rank 1 enters
//                                     <ms> late; a barrier; a broadcast of 1024 floats from rank
//                                     0 that rank 0 enters <ms> late; a barrier
//
// Prints "TRACE_WORKER rank R of N done" on success, "ERROR <Type>: <message>" and exits 1
// otherwise.
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "comm/collectives.h"
#include "common/env.h"
#include "common/error.h"
#include "run/init.h"
#include "tests/process_util.h"

using namespace shoal;

namespace {

// The late rank's delay is the workload (the lateness the spans must show), not a wait for
// something: the collectives themselves synchronise the ranks.
void runLate(comm::Group& g, std::chrono::milliseconds delay) {
  std::vector<float> v(1024, 1.0f);
  comm::barrier(g);
  if (g.rank() == 1) std::this_thread::sleep_for(delay);
  comm::allreduce(g, v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum);
  SHOAL_CHECK_EQ(v[0], static_cast<float>(g.size()), "all-reduce");
  comm::barrier(g);
  if (g.rank() == 0) std::this_thread::sleep_for(delay);
  comm::broadcast(g, v.data(), v.size(), DataType::kFloat32, 0);
  comm::barrier(g);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const bool late = argc > 2 && std::string(argv[1]) == "late";
    const int barriers =
        argc > 1 && !late ? static_cast<int>(parseInteger("barriers", argv[1], 0, 10000)) : 10;
    World w = init();
    comm::Group& g = *w.group;
    if (!w.trace) SHOAL_THROW(InvalidArgument, "SHOAL_TRACE is not set: nothing is traced");
    if (late) {
      runLate(g, std::chrono::milliseconds(parseInteger("delay", argv[2], 0, 60000)));
      std::printf("TRACE_WORKER rank %d of %d done\n", g.rank(), g.size());
      std::fflush(stdout);
      return 0;
    }
    for (size_t count : {size_t{1}, size_t{4096}, size_t{1} << 18}) {
      std::vector<float> v(count, 1.0f);
      comm::allreduce(g, v.data(), count, DataType::kFloat32, ReduceOp::kSum);
      SHOAL_CHECK_EQ(v[0], static_cast<float>(g.size()), "all-reduce of {} floats", count);
    }
    int64_t token = g.rank() == 0 ? 42 : 0;
    comm::broadcast(g, &token, 1, DataType::kInt64, 0);
    SHOAL_CHECK_EQ(token, 42, "broadcast");
    std::vector<int32_t> ranks(static_cast<size_t>(g.size()));
    const int32_t me = g.rank();
    comm::allgather(g, &me, ranks.data(), 1, DataType::kInt32);
    for (int r = 0; r < g.size(); ++r) SHOAL_CHECK_EQ(ranks[r], r, "all-gather");
    std::vector<double> d(1000, 0.5);
    comm::allreduceAsync(g, d.data(), d.size(), DataType::kFloat64, ReduceOp::kSum)->wait();
    if (g.size() > 1) {
      int32_t got = -1;
      auto recv = comm::irecv(g, &got, 1, DataType::kInt32, (g.rank() + g.size() - 1) % g.size());
      comm::send(g, &me, 1, DataType::kInt32, (g.rank() + 1) % g.size());
      recv->wait();
      SHOAL_CHECK_EQ(got, (g.rank() + g.size() - 1) % g.size(), "ring message");
    }
    for (int i = 0; i < barriers; ++i) comm::barrier(g);
    std::printf("TRACE_WORKER rank %d of %d done\n", g.rank(), g.size());
    std::fflush(stdout);
    return 0;
  } catch (const std::exception& e) {
    std::printf("ERROR %s: %s\n", test::typeName(e), e.what());
    std::fflush(stdout);
    return 1;
  }
}
