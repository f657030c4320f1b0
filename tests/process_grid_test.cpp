// The data x pipeline x tensor process grid (train/process_grid.h): real processes under
// `shoal run` (rank programs in tests/grid_worker.cpp) for the layouts, where every rank reports
// its coordinates and, per sub-group, its members (an allgather) and their sum (an all-reduce);
// thread ranks for every order; and the errors every rank must agree on.
#include "train/process_grid.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "comm/collectives.h"
#include "common/error.h"
#include "tests/process_util.h"
#include "tests/thread_ranks.h"

namespace shoal::test {
namespace {

ShellRun job(int n, const std::string& args) {
  return runShell(
      fmt::format("OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 timeout 300 {} run -n {} --timeout "
                  "30 -- {} {}",
                  SHOAL_BIN, n, GRID_WORKER_BIN, args));
}

size_t count(const std::string& text, const std::string& what) {
  size_t c = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++c;
  return c;
}

// The layout as the header states it, computed here independently: with the dimensions of
// `order` fastest first, w = a + A * (b + B * c).
struct Layout {
  std::map<std::string, int> size;
  std::vector<std::string> order;  // fastest first
  int rankOf(std::map<std::string, int> coord) const {
    int w = 0;
    for (auto it = order.rbegin(); it != order.rend(); ++it) w = w * size.at(*it) + coord.at(*it);
    return w;
  }
};

struct Report {
  std::string output;
  std::map<int, std::array<int, 3>> coords;  // world rank -> (data, pipeline, tensor)
  // (dimension, world rank) -> the group's world ranks in group order, and their sum
  std::map<std::pair<std::string, int>, std::pair<std::vector<int>, long>> groups;
};

Report parseReport(const std::string& out) {
  Report r;
  std::regex coord(R"(COORD world (\d+) data (\d+) pipeline (\d+) tensor (\d+))");
  for (std::sregex_iterator it(out.begin(), out.end(), coord), end; it != end; ++it) {
    r.coords[std::stoi((*it)[1])] = {std::stoi((*it)[2]), std::stoi((*it)[3]), std::stoi((*it)[4])};
  }
  std::regex group(R"(GROUP (\w+) world (\d+) members ([0-9,]+) sum (\d+))");
  for (std::sregex_iterator it(out.begin(), out.end(), group), end; it != end; ++it) {
    std::vector<int> members;
    std::string list = (*it)[3];
    for (size_t at = 0; at < list.size();) {
      size_t comma = list.find(',', at);
      if (comma == std::string::npos) comma = list.size();
      members.push_back(std::stoi(list.substr(at, comma - at)));
      at = comma + 1;
    }
    r.groups[{(*it)[1], std::stoi((*it)[2])}] = {members, std::stol((*it)[4])};
  }
  return r;
}

std::vector<int> membersOf(const Report& rep, const std::string& dim, int w) {
  auto g = rep.groups.find({dim, w});
  return g == rep.groups.end() ? std::vector<int>{} : g->second.first;
}
long sumOf(const Report& rep, const std::string& dim, int w) {
  auto g = rep.groups.find({dim, w});
  return g == rep.groups.end() ? -1 : g->second.second;
}

// Runs the grid on n = D * P * T ranks and checks every rank's report against `layout`: each
// coordinate triple once, at the world rank the layout gives, and each sub-group holding the
// ranks that differ only along it, ranked by that coordinate, summing to their world ranks.
Report expectGrid(int n, const std::string& args, const Layout& layout) {
  auto r = job(n, args);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(count(r.output, "] OK world "), static_cast<size_t>(n)) << r.output;
  EXPECT_EQ(count(r.output, "FAIL"), 0u) << r.output;
  Report rep = parseReport(r.output);
  rep.output = r.output;
  EXPECT_EQ(rep.coords.size(), static_cast<size_t>(n)) << r.output;
  EXPECT_EQ(rep.groups.size(), static_cast<size_t>(3 * n)) << r.output;
  std::set<std::array<int, 3>> seen;
  for (const auto& [w, c] : rep.coords) {
    EXPECT_TRUE(seen.insert(c).second) << "coordinates repeated at world rank " << w;
    std::map<std::string, int> coord = {{"data", c[0]}, {"pipeline", c[1]}, {"tensor", c[2]}};
    EXPECT_EQ(layout.rankOf(coord), w) << fmt::format("({}, {}, {})", c[0], c[1], c[2]);
    for (const std::string dim : {"data", "pipeline", "tensor"}) {
      std::vector<int> expected;
      long sum = 0;
      for (int i = 0; i < layout.size.at(dim); ++i) {
        auto at = coord;
        at[dim] = i;
        expected.push_back(layout.rankOf(at));
        sum += expected.back();
      }
      auto g = rep.groups.find({dim, w});
      if (g == rep.groups.end()) {
        ADD_FAILURE() << dim << " group of world rank " << w << " missing\n" << r.output;
        continue;
      }
      EXPECT_EQ(g->second.first, expected) << dim << " group of world rank " << w;
      EXPECT_EQ(g->second.second, sum) << dim << " group of world rank " << w;
    }
  }
  return rep;
}

TEST(ProcessGrid, EightRanksDataTwoPipelineTwoTensorTwoDefaultOrder) {
  Layout layout{{{"data", 2}, {"pipeline", 2}, {"tensor", 2}}, {"tensor", "pipeline", "data"}};
  Report rep = expectGrid(8, "--data 2 --pipeline 2 --tensor 2", layout);
  // Tensor-parallel ranks are adjacent: world ranks 2k and 2k + 1, summing to 4k + 1.
  for (int w = 0; w < 8; ++w) {
    auto g = rep.groups.find({"tensor", w});
    ASSERT_NE(g, rep.groups.end());
    const int k = w / 2;
    EXPECT_EQ(g->second.first, (std::vector<int>{2 * k, 2 * k + 1})) << w;
    EXPECT_EQ(g->second.second, 4 * k + 1) << w;
  }
  // Then the stages (pipeline groups {0, 2}, {1, 3}, {4, 6}, {5, 7}), then the replicas.
  EXPECT_EQ(membersOf(rep, "pipeline", 5), (std::vector<int>{5, 7}));
  EXPECT_EQ(membersOf(rep, "data", 5), (std::vector<int>{1, 5}));
}

TEST(ProcessGrid, EightRanksInAnotherOrder) {
  Layout layout{{{"data", 2}, {"pipeline", 2}, {"tensor", 2}}, {"data", "tensor", "pipeline"}};
  Report rep =
      expectGrid(8, "--data 2 --pipeline 2 --tensor 2 --order data,tensor,pipeline", layout);
  // Replicas adjacent, then tensor ranks (2 apart), then stages (4 apart).
  EXPECT_EQ(membersOf(rep, "data", 0), (std::vector<int>{0, 1}));
  EXPECT_EQ(membersOf(rep, "tensor", 0), (std::vector<int>{0, 2}));
  EXPECT_EQ(membersOf(rep, "pipeline", 0), (std::vector<int>{0, 4}));
  EXPECT_EQ(sumOf(rep, "tensor", 7), 5 + 7);
}

TEST(ProcessGrid, FourRanksInferTheDataSize) {
  Layout layout{{{"data", 2}, {"pipeline", 2}, {"tensor", 1}}, {"tensor", "pipeline", "data"}};
  Report rep = expectGrid(4, "--data 0 --pipeline 2", layout);
  EXPECT_NE(rep.output.find("GRID grid data 2 x pipeline 2 x tensor 1 (order "
                            "tensor,pipeline,data); world rank 3 = data 1, stage 1, tensor 0"),
            std::string::npos)
      << rep.output;
}

// Every rank validates the same options before any split, so each fails alone, at once, with
// the same one-line message.
void expectEveryRankFails(int n, const std::string& args, const std::string& message) {
  auto r = job(n, args);
  EXPECT_NE(r.code, 0) << r.output;
  // Once per rank (the launcher repeats the first failure's last lines without a rank prefix).
  const std::string line = "ERROR InvalidArgument: " + message + " [origin -1]";
  EXPECT_EQ(count(r.output, "] " + line), static_cast<size_t>(n)) << r.output;
  for (int rank = 0; rank < n; ++rank) {
    EXPECT_NE(r.output.find(fmt::format("[{}] {}", rank, line)), std::string::npos)
        << "rank " << rank << "\n"
        << r.output;
  }
  EXPECT_EQ(count(r.output, "COORD"), 0u) << r.output;
}

TEST(ProcessGridErrors, ATensorSizeThatDoesNotDivideTheWorld) {
  expectEveryRankFails(3, "--tensor 2",
                       "process grid: pipeline 1 x tensor 2 = 2 ranks do not divide the world's 3 "
                       "(data = world / (pipeline x tensor))");
}

TEST(ProcessGridErrors, SizesWhoseProductIsNotTheWorld) {
  expectEveryRankFails(
      2, "--data 2 --pipeline 2",
      "process grid: data 2 x pipeline 2 x tensor 1 = 4 ranks, but the world has 2");
}

TEST(ProcessGridErrors, AnOrderThatIsNotAPermutation) {
  expectEveryRankFails(2, "--order tensor,pipeline,tensor",
                       "process grid: order \"tensor,pipeline,tensor\" is not a permutation of "
                       "tensor, pipeline and data (comma-separated, fastest-varying first)");
}

// Thread ranks (one process): all six orders on 8 ranks, each group's members against
// worldRankOf() and the layout formula.
TEST(ProcessGridThreads, EveryOrderOnEightRanks) {
  const std::vector<std::string> orders = {"tensor,pipeline,data", "tensor,data,pipeline",
                                           "pipeline,tensor,data", "pipeline,data,tensor",
                                           "data,tensor,pipeline", "data, pipeline ,tensor"};
  for (const auto& order : orders) {
    auto errors = runThreadRanks(8, testOptions(TransportKind::kTcp), [&](comm::Group& world) {
      auto g = train::makeProcessGrid(world.shared_from_this(),
                                      {.data = 2, .pipeline = 2, .tensor = 2, .order = order});
      SHOAL_CHECK_EQ(g.worldRankOf(g.dataRank, g.pipelineRank, g.tensorRank), world.rank(), "");
      std::string names = order;
      names.erase(std::remove(names.begin(), names.end(), ' '), names.end());
      SHOAL_CHECK_EQ(g.order, names, "");
      // The coordinates from the layout formula, fastest first.
      std::map<std::string, int> coord;
      int w = world.rank();
      for (size_t at = 0; at < names.size();) {
        size_t comma = names.find(',', at);
        if (comma == std::string::npos) comma = names.size();
        coord[names.substr(at, comma - at)] = w % 2;
        w /= 2;
        at = comma + 1;
      }
      SHOAL_CHECK_EQ(coord["data"], g.dataRank, "");
      SHOAL_CHECK_EQ(coord["pipeline"], g.pipelineRank, "");
      SHOAL_CHECK_EQ(coord["tensor"], g.tensorRank, "");
      for (auto [group, dim] :
           {std::pair{g.tensor.get(), 2}, std::pair{g.pipe.get(), 1}, std::pair{g.data.get(), 0}}) {
        std::array<int64_t, 2> members{};
        const int64_t mine = world.rank();
        comm::allgather(*group, &mine, members.data(), 1, DataType::kInt64);
        for (int i = 0; i < 2; ++i) {
          std::array<int, 3> c = {g.dataRank, g.pipelineRank, g.tensorRank};
          c[dim] = i;
          SHOAL_CHECK_EQ(members[i], g.worldRankOf(c[0], c[1], c[2]), "dim {}", dim);
        }
      }
      const auto pg = g.pipelineGrid();
      SHOAL_CHECK(pg.tensor == g.tensor && pg.tensorRank == g.tensorRank, "");
    });
    for (int r = 0; r < 8; ++r) EXPECT_EQ(errors[r], "") << order << " rank " << r;
  }
}

TEST(ProcessGridThreads, AWorldOfOneHasGroupsOfOne) {
  auto errors = runThreadRanks(1, testOptions(TransportKind::kTcp), [](comm::Group& world) {
    auto g = train::makeProcessGrid(world.shared_from_this());
    SHOAL_CHECK(g.tensor && g.pipe && g.data, "");
    SHOAL_CHECK_EQ(g.tensor->size() + g.pipe->size() + g.data->size(), 3, "");
    SHOAL_CHECK_EQ(g.describe(),
                   "grid data 1 x pipeline 1 x tensor 1 (order tensor,pipeline,data); world rank "
                   "0 = data 0, stage 0, tensor 0",
                   "");
    SHOAL_CHECK_EQ(g.pipelineGrid().describe(),
                   "1 replica x 1 stage; world rank 0 = replica 0, "
                   "stage 0",
                   "");
  });
  EXPECT_EQ(errors[0], "");
}

TEST(ProcessGridThreads, OutOfRangeCoordinatesAndBadSizes) {
  auto errors = runThreadRanks(1, testOptions(TransportKind::kTcp), [](comm::Group& world) {
    auto g = train::makeProcessGrid(world.shared_from_this());
    try {
      g.worldRankOf(0, 1, 0);
      SHOAL_THROW(Error, "worldRankOf(0, 1, 0) did not throw");
    } catch (const InvalidArgument& e) {
      SHOAL_CHECK_EQ(std::string(e.what()),
                     "process grid: coordinates data 0, stage 1, tensor 0 are outside data 1 x "
                     "pipeline 1 x tensor 1",
                     "");
    }
    try {
      train::makeProcessGrid(world.shared_from_this(), {.pipeline = 0});
      SHOAL_THROW(Error, "pipeline 0 did not throw");
    } catch (const InvalidArgument& e) {
      SHOAL_CHECK(std::string(e.what()).find("process grid: pipeline 0 is not a size") == 0, "{}",
                  e.what());
    }
  });
  EXPECT_EQ(errors[0], "");
}

TEST(ProcessGridRequireDivisible, NamesTheValueAndTheDimension) {
  EXPECT_NO_THROW(train::requireDivisible("attention heads", 8, "tensor", 4));
  EXPECT_NO_THROW(train::requireDivisible("layers", 12, "pipeline", 1));
  try {
    train::requireDivisible("attention heads", 6, "tensor", 4);
    ADD_FAILURE() << "no throw";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "tensor parallelism: 6 attention heads do not divide over tensor 4");
  }
  EXPECT_THROW(train::requireDivisible("hidden units", 64, "tensor", 0), InvalidArgument);
}

}  // namespace
}  // namespace shoal::test
