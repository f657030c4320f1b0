// Parameter servers, piece by piece: the partition, the server-side optimizer, shards, the
// decoders, and configuration a rank refuses. Whole jobs: tests/ps_job_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <numeric>
#include <random>

#include "comm/native/native_engine.h"
#include "common/sealed_file.h"
#include "ps/config.h"
#include "ps/partition.h"
#include "ps/protocol.h"
#include "ps/residual_checkpoint.h"
#include "ps/server_optimizer.h"
#include "ps/shard.h"
#include "ps/update_kernels.h"
#include "tests/process_util.h"
#include "tests/ps_job_util.h"
#include "tests/thread_ranks.h"

namespace shoal::test {
namespace {

using namespace std::chrono_literals;

// ---- partition

TEST(PsPartition, BalancesBytesSplitsLargeKeysAndKeepsSmallOnesWhole) {
  std::vector<ps::KeySpec> keys{{"conv.w", {32, 1, 5, 5}},
                                {"conv.b", {32}},
                                {"fc.w", {128, 1568}},
                                {"fc.b", {128}},
                                {"out.w", {10, 128}}};
  ps::Partition p(keys, 3);
  size_t covered = 0;
  for (int s = 0; s < 3; ++s) {
    EXPECT_EQ(p.begin(s), covered);
    size_t inPieces = 0;
    for (const auto& piece : p.pieces(s)) inPieces += piece.count;
    EXPECT_EQ(inPieces, p.elements(s));
    covered = p.end(s);
    // Balanced to within one small key of a third.
    EXPECT_NEAR(static_cast<double>(p.elements(s)), p.totalElements() / 3.0, 1400.0);
  }
  EXPECT_EQ(covered, p.totalElements());
  EXPECT_EQ(p.piecesOf(p.find("fc.w")).size(), 3u) << p.describe();
  EXPECT_EQ(p.piecesOf(p.find("conv.b")).size(), 1u);
  // Deterministic, and the description names the slices.
  ps::Partition again(keys, 3);
  EXPECT_EQ(p.describe(), again.describe());
  EXPECT_NE(p.describe().find("fc.w[0:"), std::string::npos) << p.describe();
}

TEST(PsPartition, MoreServersThanKeysLeavesSomeEmpty) {
  ps::Partition p({{"a", {3}}, {"b", {2}}}, 4);
  size_t total = 0;
  for (int s = 0; s < 4; ++s) total += p.elements(s);
  EXPECT_EQ(total, 5u);
  EXPECT_NE(p.describe().find("(nothing)"), std::string::npos);
}

TEST(PsPartition, RefusesBadKeysAndRoundTripsTheirText) {
  EXPECT_THROW(ps::Partition({{"a", {3}, DataType::kFloat64}}, 1), InvalidArgument);
  EXPECT_THROW(ps::Partition({{"a", {3}}, {"a", {4}}}, 1), InvalidArgument);
  EXPECT_THROW(ps::Partition({{"a b", {3}}}, 1), InvalidArgument);
  EXPECT_THROW(ps::Partition({{"a", {3}}}, 0), InvalidArgument);
  ps::Partition p({{"w", {4, 5}}, {"bn.mean", {5}, DataType::kFloat32, ps::KeyKind::kState}}, 2);
  EXPECT_EQ(p.firstDifference(ps::Partition::parseKeys(p.keysText())), "");
  auto other = ps::Partition::parseKeys(p.keysText());
  other[0].shape = {5, 4};
  EXPECT_NE(p.firstDifference(other).find("'w' float32 [4, 5] here but 'w' float32 [5, 4]"),
            std::string::npos);
  EXPECT_THROW(ps::Partition::parseKeys("w 0 float32 2 4\n"), ProtocolError);
}

TEST(PsConfig, RoundTripsAndRefusesNonsense) {
  ps::TrainingConfig c;
  c.mode = ps::Mode::kSsp;
  c.staleness = 3;
  c.optimizer.kind = OptimizerKind::kAdam;
  c.optimizer.lr = 0.001;
  c.warmupSteps = 10;
  EXPECT_EQ(ps::TrainingConfig::parse(c.toText()).toText(), c.toText());
  EXPECT_EQ(ps::parseMode("ps-async"), ps::Mode::kAsync);
  EXPECT_THROW(ps::parseMode("eventual"), InvalidArgument);
  EXPECT_THROW(ps::TrainingConfig::parse("mode=sync"), ProtocolError);
  c.optimizer.lr = -1;
  EXPECT_THROW(c.validate(), InvalidArgument);
}

// ---- the server's optimizer against the formulas written out

TEST(PsOptimizer, SgdMomentumAdamAndRmspropFollowTheirFormulas) {
  const float g[2] = {0.5f, -2.0f};
  {
    OptimizerOptions o{OptimizerKind::kSgd, 0.1, 0.9, 0.01};
    float p[2] = {1.0f, 2.0f}, m[2] = {0, 0};
    ps::applyUpdate(o, 0.1, 1, 1.0f, g, p, m, nullptr, 2);
    ps::applyUpdate(o, 0.1, 2, 1.0f, g, p, m, nullptr, 2);
    // Step 1: d = g + wd p; m = d; p -= lr m. Step 2: m = 0.9 m + d'.
    double p0 = 1.0, m0 = 0.5 + 0.01 * 1.0;
    p0 -= 0.1 * m0;
    m0 = 0.9 * m0 + (0.5 + 0.01 * p0);
    p0 -= 0.1 * m0;
    EXPECT_NEAR(p[0], p0, 1e-6);
  }
  {
    OptimizerOptions o{OptimizerKind::kAdam, 0.01, 0, 0};
    float p[2] = {1.0f, 2.0f}, m[2] = {0, 0}, v[2] = {0, 0};
    ps::applyUpdate(o, 0.01, 1, 0.5f, g, p, m, v, 2);
    // First Adam step moves every parameter by lr against the gradient's sign.
    EXPECT_NEAR(p[0], 1.0 - 0.01, 1e-6);
    EXPECT_NEAR(p[1], 2.0 + 0.01, 1e-6);
  }
  {
    OptimizerOptions o{OptimizerKind::kRmsprop, 0.01, 0, 0};
    float p[2] = {1.0f, 2.0f}, s[2] = {0, 0};
    ps::applyUpdate(o, 0.01, 1, 1.0f, g, p, s, nullptr, 2);
    const double sq = 0.01 * 0.25;
    EXPECT_NEAR(p[0], 1.0 - 0.01 * 0.5 / (std::sqrt(sq) + 1e-8), 1e-6);
  }
}

// The update is compiled once per instruction set and picked at run time (ps/update_kernels.h):
// every copy this CPU runs must give the generic loop's bits, for each optimizer and slot
// layout, over lengths that end inside a vector and over several steps (so that the state
// feeds back). A fused multiply-add in one copy would fail here.
TEST(PsOptimizer, EveryInstructionSetComputesTheGenericBits) {
  const auto sets = ps::update_isa::available();
  ASSERT_FALSE(sets.empty());
  ASSERT_EQ(sets.front().name, "generic");
  bool selectedIsAvailable = false;
  for (const auto& k : sets) selectedIsAvailable |= k.name == ps::update_isa::selected().name;
  EXPECT_TRUE(selectedIsAvailable) << ps::update_isa::selected().name;
  const std::vector<OptimizerOptions> optimizers = {{OptimizerKind::kSgd, 0.1, 0, 0},
                                                    {OptimizerKind::kSgd, 0.05, 0.9, 0.01},
                                                    {OptimizerKind::kAdam, 0.003, 0, 0.02},
                                                    {OptimizerKind::kRmsprop, 0.01, 0, 0.01},
                                                    {OptimizerKind::kRmsprop, 0.01, 0.8, 0}};
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.5f);
  for (const OptimizerOptions& o : optimizers) {
    const int slots = ps::optimizerStateSlots(o);
    for (size_t n : {size_t{1}, size_t{7}, size_t{16}, size_t{33}, size_t{1000}, size_t{4099}}) {
      std::vector<float> g(n), p0(n);
      for (auto& x : p0) x = normal(rng);
      // One buffer per set: parameters, then the state slots.
      std::vector<std::vector<float>> state(sets.size(), std::vector<float>(n * (1 + slots), 0.0f));
      for (auto& s : state) std::copy(p0.begin(), p0.end(), s.begin());
      for (int64_t step = 1; step <= 3; ++step) {
        for (auto& x : g) x = normal(rng);
        ps::update_isa::Step st;
        st.kind = o.kind;
        st.gradScale = 0.5f;
        st.weightDecay = static_cast<float>(o.weightDecay);
        st.momentum = static_cast<float>(o.momentum);
        st.rate = static_cast<float>(o.lr);
        st.beta1 = 0.9f, st.beta2 = 0.999f, st.oneMinusBeta1 = 0.1f, st.oneMinusBeta2 = 0.001f;
        st.eps = 1e-8f, st.bias2Sqrt = 0.03f * static_cast<float>(step), st.stepSize = 0.01f;
        st.alpha = 0.99f, st.oneMinusAlpha = 0.01f;
        for (size_t k = 0; k < sets.size(); ++k) {
          float* base = state[k].data();
          sets[k].update(st, g.data(), base, slots > 0 ? base + n : nullptr,
                         slots > 1 ? base + 2 * n : nullptr, n);
        }
      }
      for (size_t k = 1; k < sets.size(); ++k) {
        ASSERT_EQ(std::memcmp(state[k].data(), state[0].data(), state[0].size() * sizeof(float)), 0)
            << sets[k].name << " differs from generic: " << toString(o.kind) << " momentum "
            << o.momentum << ", n = " << n;
      }
      // And the update moved every parameter (a kernel that did nothing would pass above).
      for (size_t i = 0; i < n; ++i) ASSERT_NE(state[0][i], p0[i]) << toString(o.kind) << " " << i;
    }
  }
}

TEST(PsShard, SynchronousStepsAverageInWorkerOrderAndSnapshotsRestore) {
  ps::Partition p({{"w", {6}}}, 1);
  ps::TrainingConfig c;
  c.optimizer = {OptimizerKind::kSgd, 1.0, 0, 0};
  ps::Shard shard(p, 0, 3, c);
  for (int w = 0; w < 3; ++w) std::fill(shard.slot(w), shard.slot(w) + 6, float(w + 1));
  EXPECT_FALSE(shard.arrive(2, 0, 1));
  EXPECT_FALSE(shard.arrive(0, 0, 1));
  EXPECT_TRUE(shard.arrive(1, 0, 1));
  EXPECT_EQ(shard.version(0), 1u);
  EXPECT_FLOAT_EQ(shard.values()[3], -2.0f);
  const std::string snap = shard.snapshot("header", 1, {1, 1, 1});
  ps::Shard fresh(p, 0, 3, c);
  uint64_t round = 0;
  std::vector<uint64_t> clocks;
  EXPECT_EQ(fresh.restore(snap, round, clocks), "header");
  EXPECT_EQ(round, 1u);
  EXPECT_FLOAT_EQ(fresh.values()[5], -2.0f);
  EXPECT_EQ(fresh.version(0), 1u);
  ps::Shard twoWorkers(p, 0, 2, c);
  EXPECT_THROW(twoWorkers.restore(snap, round, clocks), InvalidArgument);
  EXPECT_THROW(fresh.restore(snap.substr(0, snap.size() - 3), round, clocks), InvalidArgument);
}

// Note [Resharding checkpoints]: shards of 2 servers copied into shards of 3 (and back) give
// every element its value, and every piece the version of the old pieces it overlaps.
TEST(PsShard, CopyOverlapMovesValuesAndVersionsBetweenPartitions) {
  const std::vector<ps::KeySpec> keys{{"a", {40000}}, {"b", {10}}};
  ps::TrainingConfig c;
  c.optimizer = {OptimizerKind::kSgd, 1.0, 0.9, 0};
  for (auto [from, to] : {std::pair{2, 3}, std::pair{3, 2}}) {
    const ps::Partition before(keys, from), after(keys, to);
    std::vector<std::unique_ptr<ps::Shard>> old;
    for (int s = 0; s < from; ++s) {
      old.push_back(std::make_unique<ps::Shard>(before, s, 1, c));
      ps::Shard& sh = *old.back();
      if (s == 0) {
        std::fill(sh.slot(0), sh.slot(0) + sh.elements(), 0.0f);
        sh.arrive(0, 0, sh.pieceCount());  // old server 0's pieces at version 1
      }
      for (size_t i = 0; i < sh.elements(); ++i) sh.values()[i] = float(sh.begin() + i);
    }
    for (int s = 0; s < to; ++s) {
      ps::Shard sh(after, s, 1, c);
      size_t copied = 0;
      for (const auto& o : old) copied += sh.copyOverlap(*o);
      EXPECT_EQ(copied, sh.elements()) << from << " -> " << to << " server " << s;
      for (size_t i = 0; i < sh.elements(); ++i) {
        ASSERT_EQ(sh.values()[i], float(sh.begin() + i)) << from << " -> " << to;
      }
      for (size_t i = 0; i < sh.pieceCount(); ++i) {
        const bool inZero = sh.piece(i).flat < before.end(0);
        EXPECT_EQ(sh.version(i), inZero ? 1u : 0u) << from << " -> " << to << " piece " << i;
      }
    }
  }
}

// ---- Note [Update from the ring]: a push applied part by part as it arrives must give the
// same bits as the slot path (arrive() / applyNow() on the whole payload), for every optimizer,
// every mode, however the payload is cut. A twin shard fed through the slots is the reference.

struct FusedCase {
  const char* name;
  OptimizerOptions optimizer;
  ps::Mode mode;
  int workers;
};

std::vector<float> gradient(size_t n, int worker, int step) {
  std::vector<float> g(n);
  for (size_t i = 0; i < n; ++i) {
    // Irregular values with all kinds of rounding, some negative, some tiny.
    g[i] = std::sin(0.37f * static_cast<float>(i) + 1.3f * static_cast<float>(worker) +
                    0.11f * static_cast<float>(step)) *
           (1.0f + static_cast<float>((i * 7 + static_cast<size_t>(worker)) % 13));
  }
  return g;
}

TEST(PsShard, PushesAppliedAsTheyArriveMatchTheSlotPathBitForBit) {
  const std::vector<FusedCase> cases{
      {"sgd sync 1 worker", {OptimizerKind::kSgd, 0.05, 0, 0}, ps::Mode::kSync, 1},
      {"sgd momentum wd sync 3", {OptimizerKind::kSgd, 0.05, 0.9, 1e-3}, ps::Mode::kSync, 3},
      {"adam sync 1", {OptimizerKind::kAdam, 1e-3, 0, 0}, ps::Mode::kSync, 1},
      {"adam wd sync 4", {OptimizerKind::kAdam, 1e-3, 0, 1e-2}, ps::Mode::kSync, 4},
      {"rmsprop momentum sync 2", {OptimizerKind::kRmsprop, 1e-3, 0.5, 0}, ps::Mode::kSync, 2},
      {"sgd momentum async 3", {OptimizerKind::kSgd, 0.05, 0.9, 0}, ps::Mode::kAsync, 3},
      {"adam ssp 2", {OptimizerKind::kAdam, 1e-3, 0, 0}, ps::Mode::kSsp, 2},
      {"rmsprop async 2", {OptimizerKind::kRmsprop, 1e-3, 0, 1e-3}, ps::Mode::kAsync, 2},
  };
  // Two parameter keys (one larger than a reduction chunk) and a state key (values replaced by
  // the average) on one server: a push covers several pieces, cut anywhere.
  ps::Partition p(
      {{"w", {3, 3001}}, {"b", {5}}, {"bn.mean", {17}, DataType::kFloat32, ps::KeyKind::kState}},
      1);
  const size_t n = p.elements(0);
  std::mt19937 rng(7);
  for (const FusedCase& fc : cases) {
    SCOPED_TRACE(fc.name);
    ps::TrainingConfig c;
    c.mode = fc.mode;
    c.optimizer = fc.optimizer;
    c.warmupSteps = 2;  // the rate changes from step to step
    c.totalSteps = 10;
    c.linearScaling = true;
    ps::Shard reference(p, 0, fc.workers, c), fused(p, 0, fc.workers, c);
    ps::Shard::Incoming in;
    for (int step = 0; step < 6; ++step) {
      // A different arrival order each step; the last to arrive is applied as it arrives.
      std::vector<int> order(static_cast<size_t>(fc.workers));
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), rng);
      for (size_t k = 0; k < order.size(); ++k) {
        const int w = order[k];
        const auto g = gradient(n, w, step);
        std::copy(g.begin(), g.end(), reference.slot(w));
        if (fc.mode == ps::Mode::kSync) {
          reference.arrive(w, 0, p.pieces(0).size());
        } else {
          reference.applyNow(w, 0, p.pieces(0).size(), step);
        }
        const bool last = k + 1 == order.size();
        if (fc.mode == ps::Mode::kSync && !last) {
          EXPECT_FALSE(fused.completesStep(w, 0, fused.pieceCount()));
          std::copy(g.begin(), g.end(), fused.slot(w));
          EXPECT_FALSE(fused.arrive(w, 0, fused.pieceCount()));
          continue;
        }
        ASSERT_TRUE(fc.mode != ps::Mode::kSync || fused.completesStep(w, 0, fused.pieceCount()));
        // The slot holds garbage: the fused path must not read it.
        std::fill(fused.slot(w), fused.slot(w) + n, std::nanf(""));
        fused.beginIncoming(w, 0, fused.pieceCount(), step, in);
        for (size_t at = 0; at < n;) {
          const size_t part = std::min<size_t>(n - at, 1 + rng() % 5000);
          fused.applyIncoming(in, g.data() + at, at, part);
          at += part;
        }
        fused.endIncoming(in);
      }
      for (size_t i = 0; i < fused.pieceCount(); ++i) {
        EXPECT_EQ(fused.version(i), reference.version(i));
      }
      ASSERT_EQ(std::memcmp(fused.values(), reference.values(), n * sizeof(float)), 0)
          << "step " << step;
    }
    // The optimizer state too (it shapes every later step): compare the snapshots.
    const std::vector<uint64_t> clocks(static_cast<size_t>(fc.workers), 6);
    EXPECT_TRUE(fused.snapshot("h", 6, clocks) == reference.snapshot("h", 6, clocks));
  }
}

// One key pushed alone: the plan covers one piece at its offset in the shard.
TEST(PsShard, AKeyedPushAppliedAsItArrivesLandsAtItsPiece) {
  ps::Partition p({{"a", {10}}, {"b", {6}}}, 1);
  ps::TrainingConfig c;
  c.optimizer = {OptimizerKind::kSgd, 1.0, 0, 0};
  ps::Shard shard(p, 0, 1, c);
  ps::Shard::Incoming in;
  ASSERT_TRUE(shard.completesStep(0, 1, 2));
  shard.beginIncoming(0, 1, 2, 0, in);
  const float g[6] = {1, 2, 3, 4, 5, 6};
  shard.applyIncoming(in, g, 0, 4);
  shard.applyIncoming(in, g + 4, 4, 2);
  shard.endIncoming(in);
  EXPECT_EQ(shard.version(0), 0u);
  EXPECT_EQ(shard.version(1), 1u);
  EXPECT_EQ(shard.values()[9], 0.0f);
  EXPECT_EQ(shard.values()[10], -1.0f);
  EXPECT_EQ(shard.values()[15], -6.0f);
}

// ---- decoders that read lengths from a file or the wire (a crafted 2^60 must not allocate)

std::string errorOf(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const InvalidArgument& e) {
    return e.what();
  } catch (const ProtocolError& e) {
    return e.what();
  }
  return "";
}

TEST(PsShardDecoder, CraftedCountsAreRefusedBeforeAnythingIsSized) {
  ps::Partition p({{"w", {6}}}, 1);
  ps::TrainingConfig c;
  c.optimizer = {OptimizerKind::kSgd, 1.0, 0, 0};
  ps::Shard shard(p, 0, 3, c);
  const std::string good = shard.snapshot("header", 1, {1, 1, 1});
  const uint64_t huge = uint64_t{1} << 60;
  auto patch = [&](size_t at) {
    std::string bad = good;
    std::memcpy(bad.data() + at, &huge, sizeof(huge));
    return bad;
  };
  uint64_t round = 0;
  std::vector<uint64_t> clocks;
  // The header's length, the number of worker clocks and the number of pieces.
  const size_t headerLen = 0, clockCount = 8 + 6 + 8, pieceCount = clockCount + 8 + 3 * 8;
  EXPECT_EQ(
      errorOf([&] { ps::Shard::snapshotHeader(patch(headerLen), "s0.ck"); }),
      fmt::format("s0.ck is truncated: {} more bytes needed, {} left", huge, good.size() - 8));
  EXPECT_EQ(errorOf([&] { shard.restore(patch(clockCount), round, clocks, "s0.ck"); }),
            fmt::format("s0.ck is corrupt: it claims {} worker clocks, more than its remaining "
                        "{} bytes can hold",
                        huge, good.size() - clockCount - 8));
  EXPECT_TRUE(clocks.empty());
  EXPECT_EQ(errorOf([&] { shard.restore(patch(pieceCount), round, clocks, "s0.ck"); }),
            fmt::format("s0.ck is corrupt: it claims {} pieces, more than its remaining {} bytes "
                        "can hold",
                        huge, good.size() - pieceCount - 8));
  // A header whose keys would size a shard far beyond the file: refused before the Shard exists.
  ps::Partition enormous({{"w", {int64_t{1} << 40}}}, 1);
  EXPECT_NE(errorOf([&] {
              ps::Shard::checkSnapshotFits(enormous, 0, c, good.size(), "s0.ck");
            }).find("s0.ck is corrupt: its keys give server 0 1099511627776 elements"),
            std::string::npos);
  EXPECT_NO_THROW(ps::Shard::checkSnapshotFits(p, 0, c, good.size(), "s0.ck"));
  ps::Shard fresh(p, 0, 3, c);
  EXPECT_EQ(fresh.restore(good, round, clocks, "s0.ck"), "header");
}

TEST(PsProtocolDecoder, AHugeReplyLengthFailsTheExchangeNamingTheServer) {
  // Rank 0 stands in for a parameter server that answers a hello with a reply claiming 2^60
  // bytes of text; the worker must refuse it before sizing anything.
  std::string workerError;
  auto errors = runThreadRanks(2, testOptions(TransportKind::kShm, 30), [&](comm::Group& g) {
    if (g.rank() == 0) {
      auto pair = g.connect(ps::pairName(0, 0), 0, 2);
      comm::CallOptions call;
      transport::FrameHeader base;
      base.dtype = static_cast<uint8_t>(DataType::kUInt8);
      comm::execute(*pair, ps::kPsOperation, base, call, [](comm::OpContext& ctx) {
        ps::Request rq;
        std::vector<transport::Transfer> in{ctx.recv(1, 0, &rq, sizeof(rq))};
        ctx.run(in);
        ps::Reply rp;
        rp.status = static_cast<uint32_t>(ps::Status::kRejected);
        rp.bytes = uint64_t{1} << 60;
        std::vector<transport::Transfer> out{ctx.send(1, 2, &rp, sizeof(rp))};
        ctx.run(out);
      });
    } else {
      auto pair = g.connect(ps::pairName(0, 0), 1, 2);
      auto x = std::make_shared<ps::Exchange>();
      x->request.kind = static_cast<uint32_t>(ps::RequestKind::kPull);
      try {
        ps::submitExchange(*pair, 0, 0, x, std::chrono::seconds(30))->wait();
      } catch (const ProtocolError& e) {
        workerError = e.what();
      }
    }
  });
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
  // Named from the worker's side (which server, which request); the engine adds its context.
  EXPECT_EQ(workerError.rfind("parameter server 0: pull step 0 from worker 0: protocol error: ", 0),
            0u)
      << workerError;
  EXPECT_NE(workerError.find(fmt::format("a {}-byte reply text", uint64_t{1} << 60)),
            std::string::npos)
      << workerError;
  EXPECT_EQ(workerError.find('\n'), std::string::npos) << workerError;
}

// ---- configuration a rank refuses: one line, exit code 2, before anything starts

TEST(PsConfigErrors, BadVariablesStopARankWithExitCodeTwo) {
  const std::vector<std::pair<Proc::Env, std::string>> cases{
      {{{"SHOAL_TIMEOUT", "inf"}}, "SHOAL_TIMEOUT='inf': expected a finite number"},
      {{{"SHOAL_TIMEOUT", "1e300"}}, "SHOAL_TIMEOUT='1e300': expected a finite number"},
      {{{"SHOAL_TIMEOUT", ""}}, "SHOAL_TIMEOUT is set but empty"},
      {{{"SHOAL_SHM_RING_BYTES", "-5"}}, "SHOAL_SHM_RING_BYTES='-5': expected an integer"},
      // Outside mpirun MPI would make a world of one, silently.
      {{{"SHOAL_BACKEND", "mpi"}}, "SHOAL_BACKEND=mpi needs a job started by mpirun"},
  };
  for (const auto& [env, expected] : cases) {
    TempDir dir;
    Proc p({SHOAL_PS_WORKER, "sums"}, dir.path + "/out", env);
    EXPECT_EQ(p.wait(60s), 2) << expected << "\n" << p.output();
    const std::string out = p.output();
    EXPECT_NE(out.find("ERROR InvalidArgument: " + expected), std::string::npos) << out;
    EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
  }
}

// ps/residual_checkpoint.h: a step's residuals are saved once its pushes covered the model and
// the step is due, and by finish(); they read back bit for bit; a file that is not this
// worker's, or is damaged, is refused naming it.
TEST(PsResidualCheckpoint, AStepIsSavedWhenItsPushesCoverTheModelAndReadsBackBitForBit) {
  TempDir dir;
  const std::string folder = dir.path + "/worker-1";
  auto file = [&](int step) { return fmt::format("{}/residual-{:08d}.bin", folder, step); };
  ps::ResidualCheckpoints rc(dir.path, 1, /*every=*/2, /*keep=*/2, /*elements=*/5);
  const std::vector<float> a{0.5f, -1.25f, 3.0f, 1e-40f, -0.0f};
  const std::vector<float> b{7.0f, 0.0f, -2.5f, 1e30f, 0.125f};
  rc.encoded(0, 3, a);
  rc.encoded(0, 2, a);  // step 0 complete: step 1 is not due
  rc.encoded(1, 3, a);
  EXPECT_FALSE(std::filesystem::exists(file(1)));
  EXPECT_FALSE(std::filesystem::exists(file(2)));
  rc.encoded(1, 2, a);  // step 1 complete: step 2 is due
  EXPECT_TRUE(std::filesystem::exists(file(2)));
  rc.encoded(2, 5, b);  // step 3 is not due; finish() saves it
  EXPECT_FALSE(std::filesystem::exists(file(3)));
  rc.encoded(3, 4, a);  // incomplete: finish() saves the last complete step's successor
  rc.finish(b);
  EXPECT_TRUE(std::filesystem::exists(file(3)));
  EXPECT_FALSE(std::filesystem::exists(file(4)));

  std::string why;
  auto two = rc.load(2, &why);
  ASSERT_TRUE(two.has_value()) << why;
  ASSERT_EQ(two->size(), a.size());
  EXPECT_EQ(std::memcmp(two->data(), a.data(), a.size() * sizeof(float)), 0);
  auto three = rc.load(3, &why);
  ASSERT_TRUE(three.has_value()) << why;
  EXPECT_EQ(std::memcmp(three->data(), b.data(), b.size() * sizeof(float)), 0);
  EXPECT_FALSE(rc.load(7, &why).has_value());
  EXPECT_EQ(why, "no error-feedback residuals for step 7 in " + folder);

  // Another model's size, and another worker's file under this worker's name.
  ps::ResidualCheckpoints bigger(dir.path, 1, 2, 2, 6);
  auto refusal = [&](const ps::ResidualCheckpoints& c, int step) {
    return errorOf([&] { c.load(step, &why); });
  };
  EXPECT_NE(refusal(bigger, 2).find(file(2) + ": not worker 1's residuals of 6 elements"),
            std::string::npos)
      << refusal(bigger, 2);
  ps::ResidualCheckpoints other(dir.path, 0, 2, 2, 5);
  other.encoded(1, 5, a);
  std::filesystem::copy_file(dir.path + "/worker-0/residual-00000002.bin", file(2),
                             std::filesystem::copy_options::overwrite_existing);
  EXPECT_NE(refusal(rc, 2).find("'shoal ps residual 1 worker 0 elements 5 step 2')"),
            std::string::npos)
      << refusal(rc, 2);
  // A file far larger than the model's residuals is refused before it is read.
  std::filesystem::resize_file(file(2), 1 << 20);
  EXPECT_NE(refusal(rc, 2).find(file(2) + ": 1048576 bytes, more than worker 1's residuals"),
            std::string::npos)
      << refusal(rc, 2);
  std::filesystem::resize_file(file(3), std::filesystem::file_size(file(3)) - 1);
  EXPECT_NE(refusal(rc, 3).find(file(3)), std::string::npos) << refusal(rc, 3);
}

}  // namespace
}  // namespace shoal::test
