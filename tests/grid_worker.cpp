// One rank of the process grid tests, run under `shoal run -n N` (tests/process_grid_test.cpp).
//
//   grid_worker [--data D] [--pipeline P] [--tensor T] [--order O]
//
// Makes the grid and prints, each on one line:
//   GRID <describe()>
//   COORD world w data d pipeline p tensor t
//   GROUP <tensor|pipeline|data> world w members a,b,... sum s
// where members are the group's world ranks in group-rank order (an allgather of each rank's
// world rank over that group) and sum an all-reduce of them. Checks on its own side that the
// members are the world ranks worldRankOf() names along that dimension, that the sum matches,
// and that pipelineGrid() carries the same groups and coordinates: prints "FAIL <what>" for
// each that does not hold and exits 1; else prints "OK world w". A grid error prints
// "ERROR <Type>: <message> [origin k]" and exits 1.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include "comm/collectives.h"
#include "common/error.h"
#include "run/init.h"
#include "tests/process_util.h"
#include "train/process_grid.h"

namespace {

shoal::train::ProcessGridOptions parse(int argc, char** argv) {
  shoal::train::ProcessGridOptions o;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) SHOAL_THROW(InvalidArgument, "{} needs a value", k);
      return argv[++i];
    };
    if (k == "--data")
      o.data = std::stoi(next());
    else if (k == "--pipeline")
      o.pipeline = std::stoi(next());
    else if (k == "--tensor")
      o.tensor = std::stoi(next());
    else if (k == "--order")
      o.order = next();
    else
      SHOAL_THROW(InvalidArgument, "unknown argument {}", k);
  }
  return o;
}

int run(const shoal::train::ProcessGridOptions& options, const shoal::World& world) {
  namespace comm = shoal::comm;
  auto g = shoal::train::makeProcessGrid(world.group, options);
  const int w = world.rank;
  std::vector<std::string> failures;
  std::cout << "GRID " << g.describe() << "\n";
  std::cout << fmt::format("COORD world {} data {} pipeline {} tensor {}\n", w, g.dataRank,
                           g.pipelineRank, g.tensorRank);
  if (g.worldRankOf(g.dataRank, g.pipelineRank, g.tensorRank) != w) {
    failures.push_back("worldRankOf(own coordinates) is not this rank");
  }

  struct Along {
    const char* name;
    std::shared_ptr<comm::Group> group;
    int size;
  };
  for (const Along& a :
       {Along{"tensor", g.tensor, g.tensorSize}, Along{"pipeline", g.pipe, g.pipelineSize},
        Along{"data", g.data, g.dataSize}}) {
    if (a.group == nullptr || a.group->size() != a.size) {
      failures.push_back(fmt::format("{} group missing or of the wrong size", a.name));
      continue;
    }
    int64_t mine = w;
    std::vector<int64_t> members(a.size);
    comm::allgather(*a.group, &mine, members.data(), 1, shoal::DataType::kInt64);
    int64_t sum = w;
    comm::allreduce(*a.group, &sum, 1, shoal::DataType::kInt64, shoal::ReduceOp::kSum);
    std::cout << fmt::format("GROUP {} world {} members {} sum {}\n", a.name, w,
                             fmt::join(members, ","), sum);
    int64_t expectedSum = 0;
    for (int i = 0; i < a.size; ++i) {
      const std::string dim = a.name;
      const int expected =
          g.worldRankOf(dim == "data" ? i : g.dataRank, dim == "pipeline" ? i : g.pipelineRank,
                        dim == "tensor" ? i : g.tensorRank);
      if (members[i] != expected) {
        failures.push_back(fmt::format("{} group rank {} is world rank {}, worldRankOf says {}",
                                       a.name, i, members[i], expected));
      }
      expectedSum += expected;
    }
    if (sum != expectedSum) {
      failures.push_back(fmt::format("{} group sum {}, expected {}", a.name, sum, expectedSum));
    }
  }

  const auto pg = g.pipelineGrid();
  if (pg.world != g.world || pg.pipe != g.pipe || pg.data != g.data || pg.tensor != g.tensor ||
      pg.stages != g.pipelineSize || pg.replicas != g.dataSize || pg.stage != g.pipelineRank ||
      pg.replica != g.dataRank || pg.tensorRank != g.tensorRank) {
    failures.push_back("pipelineGrid() differs from the grid: " + pg.describe());
  }

  for (const auto& f : failures) std::cout << "FAIL " << f << "\n";
  if (failures.empty()) std::cout << "OK world " << w << "\n";
  std::cout.flush();
  return failures.empty() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    auto options = parse(argc, argv);
    shoal::World world = shoal::init();
    return run(options, world);
  } catch (const shoal::Error& e) {
    std::cerr << "ERROR " << shoal::test::typeName(e) << ": " << e.what() << " [origin "
              << e.origin() << "]\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "ERROR " << e.what() << "\n";
    return 1;
  }
}
