// The full collective matrix with ranks as threads, over each transport and world size.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <mutex>

#include "comm/native/native_engine.h"
#include "tests/matrix.h"
#include "tests/thread_ranks.h"

namespace shoal::test {
namespace {

struct Param {
  TransportKind transport;
  int size;
};

class CollectiveMatrix : public ::testing::TestWithParam<Param> {};

TEST_P(CollectiveMatrix, EveryCollectiveAlgorithmTypeAndOp) {
  const auto [transport, n] = GetParam();
  MatrixOptions o;
  o.big = true;
  std::mutex mutex;
  std::vector<std::string> failures;
  auto errors = runThreadRanks(n, testOptions(transport), [&](comm::Group& g) {
    if (n > 1) {
      EXPECT_EQ(
          comm::nativeEngine(g).linkKind((g.rank() + 1) % n),
          transport == TransportKind::kShm ? transport::LinkKind::kShm : transport::LinkKind::kTcp);
    }
    auto f = runMatrix(g, o);
    std::lock_guard<std::mutex> lock(mutex);
    failures.insert(failures.end(), f.begin(), f.end());
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  EXPECT_TRUE(failures.empty()) << failures.size() << " failures, first: " << failures.front();
}

// Ranks on emulated hosts (GroupOptions::hostLabel): shared memory inside a host, TCP across,
// and the hierarchical all-reduce (forced, and chosen by auto) against the serial reference.
struct HostShape {
  int hosts;
  int perHost;      // ranks on each host; 0: host sizes 2, 1 (not uniform: ring fallback)
  bool interleave;  // rank r on host r % hosts, instead of ranks in a row per host
};

class HierarchicalMatrix : public ::testing::TestWithParam<HostShape> {};

TEST_P(HierarchicalMatrix, MatchesTheReference) {
  const auto [hosts, perHost, interleave] = GetParam();
  const int n = perHost == 0 ? 3 : hosts * perHost;
  auto hostOf = [&](int r) {
    if (perHost == 0) return r < 2 ? 0 : 1;
    return interleave ? r % hosts : r / perHost;
  };
  MatrixOptions o;
  o.big = perHost == 2 && hosts == 2 && !interleave;  // 64 MiB: one shape is enough
  o.types = {DataType::kFloat32, DataType::kFloat16, DataType::kInt32, DataType::kInt64};
  std::mutex mutex;
  std::vector<std::string> failures;
  auto optionsOf = [&](int r) {
    auto opt = testOptions(TransportKind::kAuto);
    opt.encrypt = EncryptMode::kOff;
    opt.hostLabel = fmt::format("emulated-host-{}", hostOf(r));
    return opt;
  };
  auto errors = runThreadRanks(n, optionsOf, [&](comm::Group& g) {
    const auto& layout = comm::nativeEngine(g).hosts();
    EXPECT_EQ(layout.uniform(), perHost > 0);
    EXPECT_EQ(layout.host, hostOf(g.rank()));
    for (int p = 0; p < n; ++p) {
      if (p == g.rank()) continue;
      EXPECT_EQ(comm::nativeEngine(g).linkKind(p), hostOf(p) == hostOf(g.rank())
                                                       ? transport::LinkKind::kShm
                                                       : transport::LinkKind::kTcp);
    }
    auto f = runMatrix(g, o);
    std::lock_guard<std::mutex> lock(mutex);
    failures.insert(failures.end(), f.begin(), f.end());
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  EXPECT_TRUE(failures.empty()) << failures.size() << " failures, first: " << failures.front();
}

INSTANTIATE_TEST_SUITE_P(Shapes, HierarchicalMatrix,
                         ::testing::Values(HostShape{2, 2, false}, HostShape{3, 2, false},
                                           HostShape{2, 3, false}, HostShape{2, 2, true},
                                           HostShape{2, 0, false}),
                         [](const ::testing::TestParamInfo<HostShape>& info) {
                           const auto& s = info.param;
                           if (s.perHost == 0) return std::string("hosts_2_and_1");
                           return fmt::format("{}x{}{}", s.hosts, s.perHost,
                                              s.interleave ? "_interleaved" : "");
                         });

TEST(ChooseAllreduce, HierarchicalWhenSeveralUniformHosts) {
  using comm::AllreduceAlgorithm;
  using comm::algo::AllreduceKind;
  using comm::algo::chooseAllreduce;
  EXPECT_EQ(chooseAllreduce(AllreduceAlgorithm::kAuto, 4, false, true, 1u << 20),
            AllreduceKind::kHierarchical);
  EXPECT_EQ(chooseAllreduce(AllreduceAlgorithm::kAuto, 4, false, true, 1024),
            AllreduceKind::kRecursiveDoubling);
  EXPECT_EQ(chooseAllreduce(AllreduceAlgorithm::kAuto, 4, false, false, 64u << 20),
            AllreduceKind::kRing);
  EXPECT_EQ(chooseAllreduce(AllreduceAlgorithm::kHierarchical, 4, true, false, 64u << 20),
            AllreduceKind::kRing);
  EXPECT_EQ(comm::parseAllreduceAlgorithm("hierarchical"), AllreduceAlgorithm::kHierarchical);
}

std::string name(const ::testing::TestParamInfo<Param>& info) {
  return std::string(toString(info.param.transport)) + "_n" + std::to_string(info.param.size);
}

INSTANTIATE_TEST_SUITE_P(
    Tcp, CollectiveMatrix,
    ::testing::Values(Param{TransportKind::kTcp, 1}, Param{TransportKind::kTcp, 2},
                      Param{TransportKind::kTcp, 3}, Param{TransportKind::kTcp, 4},
                      Param{TransportKind::kTcp, 7}, Param{TransportKind::kTcp, 8}),
    name);
INSTANTIATE_TEST_SUITE_P(
    Shm, CollectiveMatrix,
    ::testing::Values(Param{TransportKind::kShm, 1}, Param{TransportKind::kShm, 2},
                      Param{TransportKind::kShm, 3}, Param{TransportKind::kShm, 4},
                      Param{TransportKind::kShm, 7}, Param{TransportKind::kShm, 8}),
    name);

}  // namespace
}  // namespace shoal::test
