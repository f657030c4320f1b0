// Parameter-server compression (ps/payload_codec.h, ps::ClientOptions): servers and workers as
// thread ranks over shared memory. Casts of representable values are exact; top-k and 1-bit keep
// what they did not send in the worker's residual (nothing is lost); fp16 pulls are the fp16
// rounding of the servers' values; malformed compressed pushes are refused, one line, with the
// servers' state unchanged; the bytes a worker counts are those the layout implies.
#include <gtest/gtest.h>

#include <barrier>
#include <cmath>
#include <cstring>
#include <functional>
#include <latch>
#include <random>

#include "comm/compress/sign.h"
#include "comm/compress/topk.h"
#include "common/error.h"
#include "common/half.h"
#include "ps/client.h"
#include "ps/payload_codec.h"
#include "ps/protocol.h"
#include "ps/server.h"
#include "tests/thread_ranks.h"

namespace shoal::test {
namespace {

using compress::CompressionSpec;

// ---- a job of thread ranks: workers 0..W-1, then the servers

using GradFn = std::function<float(size_t i, int worker, int step)>;

struct Job {
  int workers = 1;
  int servers = 2;
  ps::Mode mode = ps::Mode::kSync;
  OptimizerOptions optimizer{OptimizerKind::kSgd, 1.0, 0, 0};
  std::vector<ps::KeySpec> keys;
  std::vector<ps::ClientOptions> options;  // per worker; missing: the defaults
  int steps = 10;
  int keyedEvery = 0;  // every this many steps (0: never) push key by key, then pull
  GradFn grad;
  // Runs in each worker after training (every worker's pushes are in), before goodbye.
  std::function<void(ps::Client&, int worker)> after;
};

struct WorkerResult {
  std::vector<float> values;  // the servers' values after the last step, as this worker pulled
  std::vector<float> residual;
  std::vector<ps::Traffic> steps;  // the payload bytes of each step
};

float initial(size_t i) {
  return 0.25f * static_cast<float>(static_cast<int>(i % 17) - 8);
}

std::vector<WorkerResult> runJob(const Job& job) {
  std::vector<WorkerResult> results(static_cast<size_t>(job.workers));
  std::barrier trained(job.workers);
  auto errors = runThreadRanks(
      job.workers + job.servers, testOptions(TransportKind::kShm, 60), [&](comm::Group& g) {
        if (g.rank() >= job.workers) {
          ps::ServerOptions o;
          o.quiet = true;
          o.idleTimeout = std::chrono::seconds(60);
          ps::serve(g, g.rank() - job.workers, job.servers, job.workers, o);
          return;
        }
        const int w = g.rank();
        ps::TrainingConfig config;
        config.mode = job.mode;
        config.optimizer = job.optimizer;
        const auto options =
            static_cast<size_t>(w) < job.options.size() ? job.options[w] : ps::ClientOptions{};
        ps::Client c(g, w, job.workers, job.servers, job.keys, config, options);
        const size_t n = c.partition().totalElements();
        std::vector<float> values(n), grads(n);
        for (size_t i = 0; i < n; ++i) values[i] = initial(i);
        if (c.mustInitialize()) c.initialize(values.data());
        c.pull(values.data(), 0)->wait();
        WorkerResult& r = results[w];
        for (int t = 0; t < job.steps; ++t) {
          for (size_t i = 0; i < n; ++i) grads[i] = job.grad(i, w, t);
          const ps::Traffic before = c.traffic();
          if (job.keyedEvery > 0 && t % job.keyedEvery == job.keyedEvery - 1) {
            size_t at = 0;
            for (const auto& k : job.keys) {
              c.pushKey(k.name, grads.data() + at, DataType::kFloat32, k.shape, t)->wait();
              at += k.numel();
            }
            c.pull(values.data(), t + 1)->wait();
          } else {
            c.pushPull(grads.data(), values.data(), t)->wait();
          }
          const ps::Traffic now = c.traffic();
          r.steps.push_back({now.pushes - before.pushes, now.pushedBytes - before.pushedBytes,
                             now.pulls - before.pulls, now.pulledBytes - before.pulledBytes});
        }
        trained.arrive_and_wait();
        c.pull(values.data(), job.steps)->wait();
        r.values = values;
        r.residual = c.residual();
        if (job.after) job.after(c, w);
        trained.arrive_and_wait();  // nobody says goodbye while others still pull
        c.finish();
      });
  for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  return results;
}

ps::ClientOptions compressed(const std::string& spec, bool pullHalf = false) {
  ps::ClientOptions o;
  o.compression = CompressionSpec::parse(spec);
  o.pullHalf = pullHalf;
  return o;
}

// A model split across both servers (w is over 64 KiB), with a small key and a state key.
std::vector<ps::KeySpec> model() {
  return {{"w", {300, 70}},
          {"b", {33}},
          {"bn.mean", {17}, DataType::kFloat32, ps::KeyKind::kState},
          {"v", {5, 41}}};
}

// Irregular gradients of all magnitudes, from integers only: the same bits wherever computed
// (a formula in floats may be contracted into FMAs differently at each call site).
float irregular(size_t i, int w, int t) {
  uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ static_cast<uint32_t>(w) * 40503u ^
               static_cast<uint32_t>(t) * 2246822519u;
  h ^= h >> 15;
  h *= 2246822519u;
  h ^= h >> 13;
  const float unit = static_cast<float>(static_cast<int>(h % 2001) - 1000) / 1000.0f;
  return unit * static_cast<float>(1 + (i * 7 + static_cast<size_t>(w)) % 13);
}

bool sameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// ---- casts

TEST(PsCompression, Fp16AndBf16PushesOfRepresentableValuesGiveTheRawParametersBitForBit) {
  struct Case {
    const char* spec;
    GradFn grad;
  };
  const std::vector<Case> cases{
      // Multiples of 1/256 below 4: 10 significant bits, exact in fp16.
      {"fp16",
       [](size_t i, int w, int t) {
         return static_cast<float>(static_cast<int>((i * 7 + w * 3 + t) % 2001) - 1000) / 256.0f;
       }},
      // 7 significant bits at exponents fp16 cannot hold (2^-40 .. 2^19): exact in bf16.
      {"bf16", [](size_t i, int w, int t) {
         return std::ldexp(static_cast<float>(static_cast<int>((i + w * 5 + t) % 255) - 127),
                           static_cast<int>((i * 3 + t) % 60) - 40);
       }}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.spec);
    Job job;
    job.workers = 2;
    job.keys = model();
    job.optimizer = {OptimizerKind::kSgd, 0.1, 0.9, 0};
    job.steps = 6;
    job.keyedEvery = 3;
    job.grad = c.grad;
    const auto raw = runJob(job);
    job.options = {compressed(c.spec), compressed(c.spec)};
    const auto cast = runJob(job);
    ASSERT_EQ(cast.size(), 2u);
    EXPECT_TRUE(sameBits(cast[0].values, raw[0].values));
    EXPECT_TRUE(sameBits(cast[1].values, raw[0].values));
    EXPECT_TRUE(cast[0].residual.empty());  // a cast keeps nothing back
  }
}

// ---- error feedback

// Top-k and 1-bit with SGD, lr 1, no momentum: the servers' values move by exactly what was
// applied, so (x0 - x_T) + residual == the sum of the gradients (averaged over the workers in
// synchronous mode, summed in asynchronous mode), up to float rounding; and the distance to the
// uncompressed run is what the residuals hold.
TEST(PsCompression, TopKAndOneBitLoseNothingTheResidualDoesNotHold) {
  struct Case {
    const char* spec;
    ps::Mode mode;
    int workers;
    int keyedEvery;
    double bound;  // relative distance to the uncompressed run after the steps
  };
  // The bounds: what these runs give (0.25, 0.36, 0.20, 0.20, 0.63) with a margin.
  const std::vector<Case> cases{{"topk:0.1", ps::Mode::kSync, 2, 0, 0.4},
                                {"topk:0.05", ps::Mode::kAsync, 2, 4, 0.5},
                                {"onebit", ps::Mode::kSync, 2, 0, 0.3},
                                {"onebit", ps::Mode::kSsp, 1, 3, 0.3},
                                {"topk:0.01,warmup=3", ps::Mode::kSync, 1, 0, 0.8}};
  for (const Case& c : cases) {
    SCOPED_TRACE(fmt::format("{} {} {} workers", c.spec, toString(c.mode), c.workers));
    Job job;
    job.workers = c.workers;
    job.mode = c.mode;
    job.keys = model();
    job.steps = 20;
    job.keyedEvery = c.keyedEvery;
    job.grad = irregular;
    const auto raw = runJob(job);
    job.options.assign(static_cast<size_t>(c.workers), compressed(c.spec));
    const auto ef = runJob(job);
    ASSERT_EQ(ef.size(), static_cast<size_t>(c.workers));
    const bool sync = c.mode == ps::Mode::kSync;
    const double scale = sync ? 1.0 / c.workers : 1.0;
    const std::vector<float>& x = ef[0].values;
    const ps::Partition p(job.keys, 2);
    double gap = 0, moved = 0, worst = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const bool state = i >= p.keys()[0].numel() + p.keys()[1].numel() &&
                         i < p.keys()[0].numel() + p.keys()[1].numel() + 17;
      if (state) {
        // Values, not gradients: raw in every encoding (synchronous: the average of the last).
        if (sync) {
          float last = irregular(i, 0, job.steps - 1);
          for (int w = 1; w < c.workers; ++w) last += irregular(i, w, job.steps - 1);
          EXPECT_EQ(x[i], last * static_cast<float>(scale)) << "state element " << i;
        }
        continue;
      }
      double sum = 0, held = 0;
      for (int w = 0; w < c.workers; ++w) {
        for (int t = 0; t < job.steps; ++t) sum += irregular(i, w, t);
        ASSERT_EQ(ef[w].residual.size(), x.size());
        held += ef[w].residual[i];
      }
      const double applied = static_cast<double>(initial(i)) - x[i];
      worst = std::max(worst, std::abs(applied + scale * held - scale * sum));
      const double d = static_cast<double>(x[i]) - raw[0].values[i];
      gap += d * d;
      moved += (scale * sum) * (scale * sum);
      // What the compressed run still owes is exactly what the residuals hold.
      ASSERT_NEAR(d, scale * held, 2e-4) << "element " << i;
    }
    EXPECT_LT(worst, 2e-4);
    EXPECT_LT(std::sqrt(gap / moved), c.bound) << "relative distance to the uncompressed run";
    EXPECT_GT(gap, 0.0);  // it was compressed
  }
}

// ---- fp16 pulls

TEST(PsCompression, HalfPullsAreTheFp16RoundingOfTheServersValues) {
  Job job;
  job.workers = 2;
  job.keys = model();
  job.optimizer = {OptimizerKind::kAdam, 0.01, 0, 0};
  job.steps = 5;
  job.grad = irregular;
  ps::ClientOptions half;
  half.pullHalf = true;
  job.options = {half, ps::ClientOptions{}};
  const auto r = runJob(job);
  ASSERT_EQ(r.size(), 2u);
  const std::vector<float>& full = r[1].values;
  ASSERT_EQ(r[0].values.size(), full.size());
  for (size_t i = 0; i < full.size(); ++i) {
    ASSERT_EQ(r[0].values[i], halfToFloat(floatToHalf(full[i]))) << "element " << i;
  }
  // Half the values' bytes, the same pushes.
  for (int t = 0; t < job.steps; ++t) {
    EXPECT_EQ(2 * r[0].steps[t].pulledBytes, r[1].steps[t].pulledBytes);
    EXPECT_EQ(r[0].steps[t].pushedBytes, r[1].steps[t].pushedBytes);
  }
  // The servers' masters stay float32: the raw puller does not see fp16 values.
  size_t rounded = 0;
  for (float v : full) rounded += v == halfToFloat(floatToHalf(v)) ? 1 : 0;
  EXPECT_LT(rounded, full.size() / 2);
}

// ---- bytes

// One server's pieces of the parameter-only model below, and what each encoding makes of them.
TEST(PsCompression, TheBytesCountedAreThoseTheLayoutImplies) {
  const std::vector<ps::KeySpec> keys{{"w", {400, 100}}, {"b", {100}}, {"v", {3, 333}}};
  const ps::Partition p(keys, 2);
  const uint64_t n = p.totalElements();
  uint64_t topk = 0, onebit = 0;
  for (int s = 0; s < 2; ++s) {
    for (const ps::Piece& piece : p.pieces(s)) {
      topk += compress::topkMessageBytes(compress::topkCount(piece.count, 0.01));
      onebit += compress::signMessageBytes(piece.count);
    }
  }
  // Top-k at 1%: 8 bytes (index and value) per sent element, so 2% of the raw bytes plus the
  // rounding up of each piece's count; 1-bit: 1/32 of the raw bytes plus a scale per piece.
  EXPECT_NEAR(static_cast<double>(topk) / (4.0 * n), 0.02, 0.001);
  EXPECT_NEAR(static_cast<double>(onebit) / (4.0 * n), 1.0 / 32, 0.001);
  struct Case {
    std::string spec;
    bool pullHalf;
    uint64_t pushed, pulled;
  };
  const std::vector<Case> cases{{"none", false, 4 * n, 4 * n},
                                {"fp16", false, 2 * n, 4 * n},
                                {"bf16", true, 2 * n, 2 * n},
                                {"topk:0.01", false, topk, 4 * n},
                                {"onebit", true, onebit, 2 * n}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.spec);
    Job job;
    job.keys = keys;
    job.steps = 4;
    job.grad = irregular;
    job.options = {compressed(c.spec == "none" ? c.spec : c.spec + ",warmup=2", c.pullHalf)};
    const auto r = runJob(job);
    ASSERT_EQ(r.size(), 1u);
    ASSERT_EQ(r[0].steps.size(), 4u);
    for (int t = 0; t < 4; ++t) {
      SCOPED_TRACE(t);
      EXPECT_EQ(r[0].steps[t].pushes, 1u);
      EXPECT_EQ(r[0].steps[t].pulls, 1u);
      EXPECT_EQ(r[0].steps[t].pushedBytes, t < 2 ? 4 * n : c.pushed);  // warm-up: raw
      EXPECT_EQ(r[0].steps[t].pulledBytes, c.pulled);
    }
  }
}

TEST(PsCompression, PowerSgdIsRefusedForParameterServersInOneLine) {
  std::string error;
  auto errors = runThreadRanks(1, testOptions(TransportKind::kShm, 30), [&](comm::Group& g) {
    try {
      ps::Client c(g, 0, 1, 1, {{"w", {4}}}, {}, compressed("powersgd:4"));
    } catch (const InvalidArgument& e) {
      error = e.what();
    }
  });
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(error,
            "parameter servers do not support powersgd compression (DDP only); use none, fp16, "
            "bf16, topk:DENSITY or onebit");
}

// The servers' optimizer holds the momentum: a worker-side one (the codec's) is refused, and so
// is dense= (pushes are cut by pieces, not parameters).
TEST(PsCompression, CodecMomentumAndDenseAreRefusedForParameterServersInOneLine) {
  for (const char* spec :
       {"topk:0.1,momentum=0.9", "onebit,momentum=0.5,warmup=2", "topk:0.1,dense=100"}) {
    std::string error;
    auto errors = runThreadRanks(1, testOptions(TransportKind::kShm, 30), [&](comm::Group& g) {
      try {
        ps::Client c(g, 0, 1, 1, {{"w", {4}}}, {}, compressed(spec));
      } catch (const InvalidArgument& e) {
        error = e.what();
      }
    });
    EXPECT_EQ(errors[0], "");
    EXPECT_EQ(error, fmt::format("parameter servers do not support compression {}: momentum= and "
                                 "dense= are DDP's and ZeRO-1's (the servers' optimizer applies "
                                 "the momentum)",
                                 CompressionSpec::parse(spec).toString()));
  }
}

// ---- the codec alone (ps/payload_codec.h)

// Encoded then decoded, piece by piece: state pieces come back exactly, cast ones rounded, and
// what a top-k or 1-bit piece lost is exactly what its residual gained (decoded + residual
// after == grad + residual before, elementwise up to the rounding of one addition).
TEST(PsPayloadCodec, WhatADecodedPushLacksIsInTheResidual) {
  const ps::Partition p(
      {{"w", {3000}}, {"s", {7}, DataType::kFloat32, ps::KeyKind::kState}, {"b", {13}}}, 2);
  const size_t n = p.totalElements();
  for (const char* spec : {"fp16", "bf16", "topk:0.03", "onebit"}) {
    SCOPED_TRACE(spec);
    ps::PushEncoder encoder(CompressionSpec::parse(spec), p);
    const ps::Encoding e = encoder.encodingAt(0);
    std::vector<float> previous(n, 0.0f);
    for (int t = 0; t < 3; ++t) {
      std::vector<float> grad(n), decoded(n);
      for (size_t i = 0; i < n; ++i) grad[i] = irregular(i, 0, t);
      for (int s = 0; s < 2; ++s) {
        std::vector<uint8_t> message;
        const float* g = grad.data() + p.begin(s);
        encoder.encode(e, p.pieces(s), g, message);
        ASSERT_EQ(message.size(), ps::pushPayloadBytes(static_cast<uint8_t>(e), encoder.density(),
                                                       p.pieces(s), p.keys()));
        ps::decodePush(e, encoder.density(), p.pieces(s), p.keys(), message.data(),
                       decoded.data() + p.begin(s));
      }
      const std::vector<float>& residual = encoder.residual();
      for (size_t i = 0; i < n; ++i) {
        const bool state = i >= 3000 && i < 3007;
        if (state) {
          ASSERT_EQ(decoded[i], grad[i]) << i;
        } else if (e == ps::Encoding::kFp16) {
          ASSERT_EQ(decoded[i], halfToFloat(floatToHalf(grad[i]))) << i;
        } else if (e == ps::Encoding::kBf16) {
          ASSERT_EQ(decoded[i], bf16ToFloat(floatToBf16(grad[i]))) << i;
        } else {
          ASSERT_NEAR(decoded[i] + residual[i], grad[i] + previous[i],
                      1e-5f * (1 + std::abs(grad[i])))
              << i;
        }
      }
      if (!residual.empty()) previous = residual;
    }
  }
}

// Random payloads of the right size for random encodings and densities: each decodes or is
// refused with InvalidArgument, nothing else (ASan runs this: scripts/sanitize.sh).
TEST(PsPayloadCodec, RandomPayloadsDecodeOrAreRefusedWithInvalidArgument) {
  const ps::Partition p(
      {{"w", {513}}, {"s", {3}, DataType::kFloat32, ps::KeyKind::kState}, {"b", {1}}, {"e", {0}}},
      1);
  std::mt19937 rng(11);
  std::vector<float> out(p.totalElements());
  int refused = 0, decoded = 0;
  for (int round = 0; round < 3000; ++round) {
    ps::Request rq;
    rq.kind = static_cast<uint32_t>(ps::RequestKind::kPush);
    rq.encoding = static_cast<uint8_t>(rng() % 6);
    const double densities[] = {0.001, 0.01, 0.5, 1.0, 0.0, -1.0, 2.0, std::nan("")};
    rq.density = densities[rng() % 8];
    std::vector<uint8_t> payload;
    try {
      ps::checkEncodings(rq);
      payload.resize(ps::pushPayloadBytes(rq.encoding, rq.density, p.pieces(0), p.keys()));
      rq.bytes = payload.size();
      ps::checkPushBytes(rq, p.pieces(0), p.keys());
      // Mostly small indices (so that some messages decode), sometimes anything.
      for (auto& b : payload) b = static_cast<uint8_t>(rng() % 4 == 0 ? rng() : rng() % 3);
      ps::decodePush(static_cast<ps::Encoding>(rq.encoding), rq.density, p.pieces(0), p.keys(),
                     payload.data(), out.data());
      ++decoded;
    } catch (const InvalidArgument& e) {
      ASSERT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
      ++refused;
    }
  }
  EXPECT_GT(refused, 100);
  EXPECT_GT(decoded, 100);
}

// ---- malformed compressed requests

// A model on one server: "w" (100 gradients) then "s" (10 state values, raw in every encoding).
constexpr size_t kW = 100, kS = 10;

struct Crafted {
  std::string name;
  ps::RequestKind kind = ps::RequestKind::kPush;
  uint8_t encoding = 0, pullEncoding = 0;
  uint32_t version = ps::kProtocolVersion;
  double density = 0;
  std::vector<uint8_t> payload;
  uint64_t pullBytes = 0;
  std::string expected;  // in the refusal
};

std::vector<uint8_t> stateTail() {
  return std::vector<uint8_t>(kS * sizeof(float), 0);
}

std::vector<uint8_t> topkMessage(const std::vector<uint32_t>& indices) {
  std::vector<uint8_t> m(compress::topkMessageBytes(indices.size()));
  std::memcpy(m.data(), indices.data(), indices.size() * sizeof(uint32_t));
  for (size_t j = 0; j < indices.size(); ++j) {
    const float v = 1.0f;
    std::memcpy(m.data() + indices.size() * sizeof(uint32_t) + j * sizeof(float), &v, 4);
  }
  const auto tail = stateTail();
  m.insert(m.end(), tail.begin(), tail.end());
  return m;
}

std::vector<Crafted> craftedRequests() {
  std::vector<Crafted> cases;
  auto add = [&](Crafted c) { cases.push_back(std::move(c)); };
  const auto fp16 = static_cast<uint8_t>(ps::Encoding::kFp16);
  const auto topk = static_cast<uint8_t>(ps::Encoding::kTopK);
  const auto onebit = static_cast<uint8_t>(ps::Encoding::kOneBit);
  const size_t fp16Bytes = kW * 2 + kS * 4;
  add({"fp16 two bytes long", ps::RequestKind::kPush, fp16, 0, ps::kProtocolVersion, 0,
       std::vector<uint8_t>(fp16Bytes + 2), 0,
       fmt::format("the fp16 push carries {} bytes, expected {}", fp16Bytes + 2, fp16Bytes)});
  add({"fp16 sized as raw", ps::RequestKind::kPush, fp16, 0, ps::kProtocolVersion, 0,
       std::vector<uint8_t>((kW + kS) * 4), 0,
       fmt::format("the fp16 push carries {} bytes, expected {}", (kW + kS) * 4, fp16Bytes)});
  add({"unknown encoding", ps::RequestKind::kPush, 9, 0, ps::kProtocolVersion, 0,
       std::vector<uint8_t>(40), 0,
       "unknown payload encoding 9 (this server knows raw, fp16, bf16, topk, onebit)"});
  add({"top-k density 0", ps::RequestKind::kPush, topk, 0, ps::kProtocolVersion, 0,
       topkMessage({1}), 0, "a top-k density of 0 (expected one in (0, 1])"});
  add({"top-k density NaN", ps::RequestKind::kPush, topk, 0, ps::kProtocolVersion, std::nan(""),
       topkMessage({1}), 0, "a top-k density of nan (expected one in (0, 1])"});
  // density 0.05 of 100: 5 pairs.
  add({"top-k index out of range", ps::RequestKind::kPush, topk, 0, ps::kProtocolVersion, 0.05,
       topkMessage({1, 2, 3, 4, 100}), 0, "the topk message of key 'w' [0:100]: "});
  add({"top-k indices out of order", ps::RequestKind::kPushPull, topk, 0, ps::kProtocolVersion,
       0.05, topkMessage({1, 2, 9, 4, 50}), (kW + kS) * 4,
       "the topk message of key 'w' [0:100]: "});
  add({"top-k pairs missing", ps::RequestKind::kPush, topk, 0, ps::kProtocolVersion, 0.05,
       topkMessage({1, 2, 3, 4}), 0, "the topk push carries 72 bytes, expected 80"});
  {
    std::vector<uint8_t> m(compress::signMessageBytes(kW));
    const float nan = std::nanf("");
    std::memcpy(m.data(), &nan, sizeof(float));
    const auto tail = stateTail();
    m.insert(m.end(), tail.begin(), tail.end());
    add({"1-bit scale NaN", ps::RequestKind::kPush, onebit, 0, ps::kProtocolVersion, 0, m, 0,
         "the onebit message of key 'w' [0:100]: "});
  }
  add({"bf16 pull",
       ps::RequestKind::kPull,
       0,
       static_cast<uint8_t>(ps::Encoding::kBf16),
       ps::kProtocolVersion,
       0,
       {},
       (kW + kS) * 2,
       "a pull in bf16 (values are sent as raw float32 or fp16)"});
  add({"encoded pull",
       ps::RequestKind::kPull,
       fp16,
       0,
       ps::kProtocolVersion,
       0,
       {},
       (kW + kS) * 4,
       "payload encoding 1 on a pull (only pushes are encoded)"});
  add({"old protocol", ps::RequestKind::kPush, 0, 0, 1, 0, std::vector<uint8_t>((kW + kS) * 4), 0,
       "parameter-server protocol version 1 (this server speaks 2)"});
  return cases;
}

// Sends each crafted request from `worker` and checks its one-line refusal.
void expectRefused(ps::Client& c, int worker, int64_t step) {
  for (const Crafted& k : craftedRequests()) {
    SCOPED_TRACE(k.name);
    auto x = std::make_shared<ps::Exchange>();
    ps::Request& rq = x->request;
    rq.kind = static_cast<uint32_t>(k.kind);
    rq.dtype = static_cast<uint8_t>(DataType::kFloat32);
    rq.step = static_cast<uint64_t>(step);
    rq.encoding = k.encoding;
    rq.pullEncoding = k.pullEncoding;
    rq.version = k.version;
    rq.density = k.density;
    rq.bytes = k.payload.size();
    x->payload = k.payload.data();
    std::vector<float> into((kW + kS) * 2);
    rq.pullBytes = k.pullBytes;
    if (k.pullBytes > 0) x->into = into.data();
    std::string error;
    try {
      ps::submitExchange(c.link(0), 0, worker, x, std::chrono::seconds(30))->wait();
    } catch (const InvalidArgument& e) {
      error = e.what();
    }
    const std::string prefix = fmt::format(
        "parameter server 0 refused the {}: worker {}: {} step {}: ", ps::toString(k.kind), worker,
        ps::toString(k.kind), step);
    EXPECT_EQ(error.rfind(prefix + k.expected, 0), 0u) << error;
    EXPECT_EQ(error.find('\n'), std::string::npos) << error;
  }
}

TEST(PsCompression, MalformedCompressedRequestsAreRefusedAndChangeNothing) {
  const std::vector<ps::KeySpec> keys{
      {"w", {int64_t(kW)}}, {"s", {int64_t(kS)}, DataType::kFloat32, ps::KeyKind::kState}};
  for (ps::Mode mode : {ps::Mode::kAsync, ps::Mode::kSync}) {
    SCOPED_TRACE(toString(mode));
    Job job;
    job.workers = mode == ps::Mode::kSync ? 2 : 1;
    job.servers = 1;
    job.mode = mode;
    job.keys = keys;
    job.steps = 2;
    job.grad = irregular;
    job.options.assign(2, compressed("topk:0.05"));
    // After training, before the next step: the crafted requests are refused; the values did
    // not move; then a good step still trains. Synchronous: worker 1's go for its slot (worker
    // 0 has pushed nothing yet); worker 0's, once worker 1's good push waits in its slot, would
    // complete the step and go for the shard as they arrive.
    std::latch pushed(1);
    std::vector<std::vector<float>> before(2), afterRefusals(2), trained(2);
    job.after = [&](ps::Client& c, int w) {
      const int64_t step = job.steps;
      const size_t n = kW + kS;
      const std::vector<float> g(n, 1.0f);
      before[w].resize(n);
      afterRefusals[w].resize(n);
      trained[w].resize(n);
      c.pull(before[w].data(), step)->wait();
      if (w == 0 && job.workers == 2) pushed.wait();
      expectRefused(c, w, step);
      c.pull(afterRefusals[w].data(), step)->wait();
      if (w == 1) {
        c.push(g.data(), step)->wait();
        pushed.count_down();
        c.pull(trained[w].data(), step + 1)->wait();
      } else {
        c.pushPull(g.data(), trained[w].data(), step)->wait();
      }
    };
    const auto r = runJob(job);
    for (int w = 0; w < job.workers; ++w) {
      EXPECT_TRUE(sameBits(afterRefusals[w], before[w])) << "worker " << w;
      ASSERT_EQ(trained[w].size(), kW + kS);
      // Top-k of a constant gradient 1 with this worker's residual: at least one element moved.
      size_t moved = 0;
      for (size_t i = 0; i < kW; ++i) moved += trained[w][i] != before[w][i] ? 1 : 0;
      EXPECT_GT(moved, 0u) << "worker " << w;
    }
  }
}

}  // namespace
}  // namespace shoal::test
