// A rank program for the multi-process tests, started by run::LocalJob.
//
//   shoal_test_worker matrix                 run the collective matrix, exit 1 on a mismatch
//   shoal_test_worker loop <collective>      run the collective over and over until it fails;
//                                            print "ready" once, then the error and
//                                            "CAUSE <rank>" (the rank it started at); exit 3
//   shoal_test_worker mismatch               the last rank all-reduces 100 floats, others 77
//   shoal_test_worker exit-rank <R>          after a barrier rank R exits 1 at once (an error of
//                                            its own, no collective failing), the others loop
//                                            on all-reduces until they fail (exit 3)
//   shoal_test_worker wrong-secret           rank 1 joins with another secret
//   shoal_test_worker marker                 all-reduce and send (rank 0 → 1) 1 MiB of floats whose
//                                            bytes spell kMarker, check the results, print
//                                            "marker done over <link>" (the capture test)
// Errors are printed as "ERROR <Type>: <message>".
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "comm/collectives.h"
#include "comm/native/native_engine.h"
#include "common/error.h"
#include "run/init.h"
#ifdef SHOAL_HAVE_MPI  // built with Shoal::mpi: SHOAL_BACKEND=mpi, and mpirun without a store
#include "run/init_mpi.h"
#endif
#include "tests/matrix.h"
#include "tests/process_util.h"

using namespace shoal;
using shoal::test::typeName;

namespace {

// 16 bytes whose 4-byte groups are ordinary float32 values (12.95, 2.07e11, 1.41e10, 8.4e8): a
// sum of two of them is exact, and a packet capture finds the text wherever they travel in
// clear. tests/multihost/capture_test.sh looks for it.
constexpr char kMarker[] = "SHOALMARKERPLAIN";

int markerScenario(comm::Group& g) {
  const size_t count = (1 << 20) / sizeof(float);
  std::vector<float> pattern(count);
  for (size_t i = 0; i < count; i += 4) std::memcpy(&pattern[i], kMarker, 16);
  std::vector<float> a = pattern;
  comm::allreduce(g, a.data(), count, DataType::kFloat32, ReduceOp::kSum);
  for (size_t i = 0; i < count; ++i) {
    if (a[i] != pattern[i] * static_cast<float>(g.size())) {
      std::printf("WRONG all-reduce result at %zu: %g\n", i, a[i]);
      return 1;
    }
  }
  if (g.size() > 1 && g.rank() < 2) {
    std::vector<float> in(count);
    if (g.rank() == 0) comm::send(g, pattern.data(), count, DataType::kFloat32, 1);
    if (g.rank() == 1) {
      comm::recv(g, in.data(), count, DataType::kFloat32, 0);
      if (std::memcmp(in.data(), pattern.data(), count * sizeof(float)) != 0) {
        std::printf("WRONG bytes received from rank 0\n");
        return 1;
      }
    }
  }
  comm::barrier(g);
  std::printf(
      "marker done over %s\n",
      g.size() > 1
          ? std::string(toString(comm::nativeEngine(g).linkKind((g.rank() + 1) % g.size()))).c_str()
          : "nothing");
  return 0;
}

void loopOnce(comm::Group& g, const std::string& what, std::vector<float>& a,
              std::vector<float>& b) {
  const size_t count = a.size() / g.size();
  const int root = 0;
  if (what == "allreduce_ring" || what == "allreduce_recursive_doubling" ||
      what == "allreduce_driver" || what == "allreduce_rabenseifner") {
    auto algo = comm::parseAllreduceAlgorithm(what.substr(10));
    comm::allreduce(g, a.data(), a.size(), DataType::kFloat32, ReduceOp::kSum, {.algorithm = algo});
  } else if (what == "broadcast") {
    comm::broadcast(g, a.data(), a.size(), DataType::kFloat32, root);
  } else if (what == "reduce") {
    comm::reduce(g, a.data(), a.size(), DataType::kFloat32, ReduceOp::kSum, root);
  } else if (what == "allgather") {
    comm::allgather(g, a.data(), b.data(), count, DataType::kFloat32);
  } else if (what == "reduce_scatter") {
    comm::reduceScatter(g, a.data(), b.data(), count, DataType::kFloat32, ReduceOp::kSum);
  } else if (what == "alltoall") {
    comm::alltoall(g, a.data(), b.data(), count, DataType::kFloat32);
  } else if (what == "gather") {
    comm::gather(g, a.data(), b.data(), count, DataType::kFloat32, root);
  } else if (what == "scatter") {
    comm::scatter(g, a.data(), b.data(), count, DataType::kFloat32, root);
  } else if (what == "barrier") {
    comm::barrier(g);
  } else if (what == "sendrecv") {
    // Around the ring, even ranks sending first.
    const int n = g.size(), r = g.rank();
    if (r % 2 == 0) {
      comm::send(g, a.data(), count, DataType::kFloat32, (r + 1) % n);
      comm::recv(g, b.data(), count, DataType::kFloat32, (r + n - 1) % n);
    } else {
      comm::recv(g, b.data(), count, DataType::kFloat32, (r + n - 1) % n);
      comm::send(g, a.data(), count, DataType::kFloat32, (r + 1) % n);
    }
  } else {
    SHOAL_THROW(InvalidArgument, "unknown collective '{}'", what);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (argc < 2) {
    std::fprintf(
        stderr, "usage: shoal_test_worker matrix|loop <collective>|mismatch|wrong-secret|marker\n");
    return 2;
  }
  const std::string scenario = argv[1];
  try {
    if (scenario == "wrong-secret" && std::atoi(std::getenv("SHOAL_RANK")) == 1) {
      ::setenv("SHOAL_SECRET", "an impostor's guess", 1);
    }
#ifdef SHOAL_HAVE_MPI
    World w = initWithMpi();
#else
    World w = init();
#endif
    auto world = w.group;
    if (scenario == "matrix") {
      test::MatrixOptions o;
      o.lengths = {0, 1, 5, 1003, 70001};
      auto failures = test::runMatrix(*world, o);
      for (auto& f : failures) std::printf("FAIL %s\n", f.c_str());
      std::string over = "nothing";
      if (world->engineName() != "native") {
        over = std::string(world->engineName());
      } else if (world->size() > 1) {
        over = toString(comm::nativeEngine(*world).linkKind((world->rank() + 1) % world->size()));
      }
      std::printf(
          "rank %d of %d (local %d of %d, started by %s): matrix done over %s, %zu failures\n",
          world->rank(), world->size(), w.localRank, w.localSize,
          std::string(toString(w.launcher)).c_str(), over.c_str(), failures.size());
      return failures.empty() ? 0 : 1;
    }
    if (scenario == "loop") {
      const std::string what = argc > 2 ? argv[2] : "allreduce_ring";
      // Big enough that a rank is almost always in the middle of moving data.
      std::vector<float> a(world->size() * 65536, 1.0f), b(a.size());
      for (long i = 0; i < 1000000; ++i) {
        loopOnce(*world, what, a, b);
        if (i == 0) std::printf("ready\n");
      }
      return 0;
    }
    if (scenario == "mismatch") {
      const size_t count = world->rank() == world->size() - 1 ? 100 : 77;
      std::vector<float> a(count, 1.0f);
      comm::allreduce(*world, a.data(), count, DataType::kFloat32, ReduceOp::kSum);
      return 0;
    }
    if (scenario == "exit-rank") {
      const int victim = argc > 2 ? std::atoi(argv[2]) : 0;
      comm::barrier(*world);
      if (world->rank() == victim) {
        std::printf("ERROR user: rank %d gives up\n", victim);
        return 1;
      }
      std::vector<float> a(65536, 1.0f);
      for (long i = 0; i < 1000000; ++i) {
        comm::allreduce(*world, a.data(), a.size(), DataType::kFloat32, ReduceOp::kSum);
      }
      return 0;
    }
    if (scenario == "wrong-secret") {
      comm::barrier(*world);
      return 0;
    }
    if (scenario == "marker") return markerScenario(*world);
    std::fprintf(stderr, "unknown scenario %s\n", scenario.c_str());
    return 2;
  } catch (const InvalidArgument& e) {
    // A configuration the rank refuses (SHOAL_* values, launcher variables): exit 2.
    std::printf("ERROR %s: %s\n", typeName(e), e.what());
    return 2;
  } catch (const std::exception& e) {
    std::printf("ERROR %s: %s\n", typeName(e), e.what());
    // The rank the failure started at, for the fault tests (Error::origin; -1 unknown).
    if (auto* se = dynamic_cast<const Error*>(&e)) std::printf("CAUSE %d\n", se->origin());
    return scenario == "mismatch" && dynamic_cast<const MismatchError*>(&e) ? 4 : 3;
  }
}
