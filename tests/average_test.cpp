// ReduceOp::kAvg divides inside each algorithm's last reduction (Note [Average in the last step]
// in comm/native/algorithms.h). These tests hold it to what the separate pass gave: the same
// algorithm's sum followed by scaleAverage, bit for bit for float32, float64 and the integer
// types (uint8 wrapping included, negative integers truncating), within one unit in the last
// place for float16 / bfloat16; every rank ends with the same bytes. Every all-reduce algorithm,
// reduce and reduce-scatter, each dtype, world sizes that are and are not powers of two, counts
// that do not divide evenly, ranks as threads.
#include <gtest/gtest.h>

#include <cstring>
#include <mutex>
#include <random>

#include "comm/collectives.h"
#include "common/half.h"
#include "common/reduce.h"
#include "tests/thread_ranks.h"

namespace shoal::test {
namespace {

using comm::AllreduceAlgorithm;

const DataType kTypes[] = {DataType::kFloat32,  DataType::kFloat64, DataType::kFloat16,
                           DataType::kBFloat16, DataType::kInt32,   DataType::kInt64,
                           DataType::kUInt8};

// Rank r's input: fractions for floating types (so 1/n and the partial sums round), unless
// `exact` (multiples of 1/4: every order of summation gives the same sum, for the driver, whose
// rank 0 reduces its peers in arrival order); negative and positive integers; uint8 over its
// whole range, so that sums wrap.
std::vector<uint8_t> input(int rank, size_t count, DataType t, bool exact) {
  std::mt19937 rng(static_cast<uint32_t>(rank * 7919 + static_cast<int>(t) * 31 + count));
  std::uniform_real_distribution<float> real(-4.0f, 4.0f);
  std::vector<uint8_t> b(count * elementSize(t));
  for (size_t i = 0; i < count; ++i) {
    uint8_t* p = b.data() + i * elementSize(t);
    float f = real(rng);
    if (exact) f = static_cast<float>(static_cast<int>(f * 4)) / 4;
    const auto k = static_cast<int32_t>(rng() % 2001) - 1000;
    switch (t) {
      case DataType::kFloat32:
        std::memcpy(p, &f, 4);
        break;
      case DataType::kFloat64: {
        double d = exact ? f : f + real(rng) * 1e-9;
        std::memcpy(p, &d, 8);
        break;
      }
      case DataType::kFloat16: {
        uint16_t h = floatToHalf(f);
        std::memcpy(p, &h, 2);
        break;
      }
      case DataType::kBFloat16: {
        uint16_t h = floatToBf16(f);
        std::memcpy(p, &h, 2);
        break;
      }
      case DataType::kInt32:
        std::memcpy(p, &k, 4);
        break;
      case DataType::kInt64: {
        int64_t v = int64_t{k} * 1000003;
        std::memcpy(p, &v, 8);
        break;
      }
      case DataType::kUInt8:
        *p = static_cast<uint8_t>(rng());
        break;
    }
  }
  return b;
}

// 16-bit floats in an order where neighbouring values differ by one.
int ordered16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  const int magnitude = v & 0x7fff;
  return (v & 0x8000) ? -magnitude : magnitude;
}

// "" if `got` is what the two passes gave (`want`), else the first difference.
std::string compare(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want, DataType t) {
  const size_t es = elementSize(t);
  for (size_t i = 0; i < got.size() / es; ++i) {
    const uint8_t* g = got.data() + i * es;
    const uint8_t* w = want.data() + i * es;
    const bool sixteen = t == DataType::kFloat16 || t == DataType::kBFloat16;
    const bool ok =
        sixteen ? std::abs(ordered16(g) - ordered16(w)) <= 1 : std::memcmp(g, w, es) == 0;
    if (!ok) return fmt::format("element {} differs from sum-then-divide", i);
  }
  return "";
}

struct Param {
  TransportKind transport;
  int size;
};

class AverageInTheLastStep : public ::testing::TestWithParam<Param> {
 protected:
  // Runs body on every rank; fails the test with every failure it reported.
  void run(const std::function<void(comm::Group&, std::vector<std::string>&)>& body) {
    const auto [transport, n] = GetParam();
    std::mutex mutex;
    std::vector<std::string> failures;
    auto errors = runThreadRanks(n, testOptions(transport), [&](comm::Group& g) {
      std::vector<std::string> mine;
      body(g, mine);
      std::lock_guard<std::mutex> lock(mutex);
      failures.insert(failures.end(), mine.begin(), mine.end());
    });
    for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
    EXPECT_TRUE(failures.empty()) << failures.size() << " failures, first: " << failures.front();
  }
};

// Every rank's `bytes` must equal rank 0's.
void expectSameOnEveryRank(comm::Group& g, const std::vector<uint8_t>& bytes,
                           const std::string& what, std::vector<std::string>& failures) {
  std::vector<uint8_t> all(bytes.size() * g.size());
  comm::allgather(g, bytes.data(), all.data(), bytes.size(), DataType::kUInt8);
  for (int r = 1; r < g.size(); ++r) {
    if (std::memcmp(all.data(), all.data() + r * bytes.size(), bytes.size()) != 0) {
      failures.push_back(fmt::format("{}: rank {} differs from rank 0", what, r));
      return;
    }
  }
}

TEST_P(AverageInTheLastStep, AllreduceEqualsTheSumThenTheDivisionForEveryAlgorithmAndType) {
  run([](comm::Group& g, std::vector<std::string>& failures) {
    const int n = g.size(), r = g.rank();
    for (auto algo : {AllreduceAlgorithm::kRing, AllreduceAlgorithm::kRecursiveDoubling,
                      AllreduceAlgorithm::kRabenseifner, AllreduceAlgorithm::kDriver}) {
      const bool exact = algo == AllreduceAlgorithm::kDriver;
      for (DataType t : kTypes) {
        std::vector<size_t> counts{1, 5, 1003, 70001};
        // Blocks of over 1 MiB: the ring's last step in several segments.
        if (t == DataType::kFloat32 && algo == AllreduceAlgorithm::kRing) {
          counts.push_back(static_cast<size_t>(n) * (300u << 10) + 7);
        }
        for (size_t count : counts) {
          const std::string what = fmt::format("allreduce {} {} x {} on {} ranks",
                                               comm::toString(algo), count, toString(t), n);
          auto avg = input(r, count, t, exact);
          auto want = avg;
          comm::allreduce(g, avg.data(), count, t, ReduceOp::kAvg, {.algorithm = algo});
          comm::allreduce(g, want.data(), count, t, ReduceOp::kSum, {.algorithm = algo});
          scaleAverage(want.data(), count, t, n);
          if (auto d = compare(avg, want, t); !d.empty()) {
            failures.push_back(fmt::format("rank {}: {}: {}", r, what, d));
          }
          expectSameOnEveryRank(g, avg, what, failures);
        }
      }
    }
  });
}

TEST_P(AverageInTheLastStep, ReduceAndReduceScatterEqualTheSumThenTheDivision) {
  run([](comm::Group& g, std::vector<std::string>& failures) {
    const int n = g.size(), r = g.rank();
    for (DataType t : kTypes) {
      for (size_t count : {size_t{1}, size_t{5}, size_t{1003}, size_t{70001}}) {
        // The root's subtrees arrive in any order: exact inputs.
        for (int root : {0, n - 1}) {
          auto avg = input(r, count, t, true);
          auto want = avg;
          comm::reduce(g, avg.data(), count, t, ReduceOp::kAvg, root);
          comm::reduce(g, want.data(), count, t, ReduceOp::kSum, root);
          if (r == root) {
            scaleAverage(want.data(), count, t, n);
          } else {
            want = input(r, count, t, true);  // left unchanged
          }
          if (auto d = compare(avg, want, t); !d.empty()) {
            failures.push_back(
                fmt::format("rank {}: reduce to {} {} x {}: {}", r, root, count, toString(t), d));
          }
        }
        // Reduce-scatter's ring has one order: fractional inputs.
        auto in = input(r, count * n, t, false);
        std::vector<uint8_t> avg(count * elementSize(t)), want(avg.size());
        comm::reduceScatter(g, in.data(), avg.data(), count, t, ReduceOp::kAvg);
        comm::reduceScatter(g, in.data(), want.data(), count, t, ReduceOp::kSum);
        scaleAverage(want.data(), count, t, n);
        if (auto d = compare(avg, want, t); !d.empty()) {
          failures.push_back(
              fmt::format("rank {}: reduce_scatter {} x {}: {}", r, count, toString(t), d));
        }
      }
    }
  });
}

std::string name(const ::testing::TestParamInfo<Param>& info) {
  return std::string(toString(info.param.transport)) + "_n" + std::to_string(info.param.size);
}

// 3, 5 and 6 fold to a power of two (6: two pairs fold); 2 and 4 do not.
INSTANTIATE_TEST_SUITE_P(
    Sizes, AverageInTheLastStep,
    ::testing::Values(Param{TransportKind::kShm, 2}, Param{TransportKind::kShm, 3},
                      Param{TransportKind::kShm, 4}, Param{TransportKind::kShm, 5},
                      Param{TransportKind::kShm, 6}, Param{TransportKind::kTcp, 3}),
    name);

}  // namespace
}  // namespace shoal::test
