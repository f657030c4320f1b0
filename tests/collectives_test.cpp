// The full collective matrix with ranks as threads, over each transport and world size.
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
