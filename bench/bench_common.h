// Shared measurement loops for the communication benchmarks, so that Shoal and its peers
// (OpenMPI, Gloo) are timed and checked the same way.
//
// All-reduce (runAllreduceSizes), in the style of nccl-tests:
// - sizes 4 KiB .. max of float32, sum (or average, Collective::average), in place;
// - per size: the number of back-to-back calls per measurement (`iters`) is calibrated so that
//   one measurement lasts at least `minSeconds` (a single call at 256 MiB is too short and too
//   noisy to time alone); then `reps` measurements, each after a barrier, each keeping the
//   slowest rank's time (a max-reduction);
// - reported: median, min, max and quartiles of the per-call time over the measurements,
//   algbw = bytes / time, busbw = algbw * 2(n-1)/n.
// Point to point (runP2p), in the style of the OSU micro-benchmarks, between ranks 0 and 1:
// ping-pong latency (half the round trip), one-way bandwidth (a stream of messages closed by
// a short acknowledgement) and both-ways bandwidth (both ranks send and receive at once; the
// aggregate of the two directions is reported).
//
// Note [Self-checking]
// Every measurement is verified on every rank, and any wrong byte fails the run (every rank
// returns false, so every benchmark process exits non-zero):
// - all-reduce: before each measurement one untimed call runs on a fresh rank- and
//   measurement-dependent pattern whose exact float sum is known (small integers), and every
//   element is checked. The timed calls then run on zeros, the one input whose in-place sum
//   stays exact call after call (summing a non-zero buffer in place grows it n-fold per call
//   until it overflows to infinity), and the buffer must still be all zeros afterwards.
// - point to point: every message carries a stamp (measurement, iteration, sender) in its
//   first 8 bytes that the receiver checks after every receive, and the last message's whole
//   payload is compared with the sender's pattern after each measurement.
// Buffers come from mmap and are touched before use, so the glibc malloc tunables a run sets
// (GLIBC_TUNABLES=glibc.malloc.hugetlb=1) change only the libraries' own allocations, never
// the benchmark's buffers: every implementation works on the same kind of memory.
//
// Threading: each rank calls these from one thread; all callbacks are collective (every rank
// calls them in the same order). Rank 0 prints one JSON line per measured size to stdout;
// failures are printed to stderr by the rank that saw them.
#pragma once

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

namespace shoal::bench {

// Page-aligned memory from mmap, touched once so that no measurement pays first-touch faults.
class Buffer {
 public:
  explicit Buffer(size_t bytes) : bytes_(std::max<size_t>(bytes, 1)) {
    void* p = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
      throw std::runtime_error("bench: mmap of " + std::to_string(bytes_) + " bytes failed");
    data_ = static_cast<char*>(p);
    std::memset(data_, 0, bytes_);
  }
  ~Buffer() { ::munmap(data_, bytes_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  char* data() const { return data_; }
  template <class T>
  T* as() const {
    return reinterpret_cast<T*>(data_);
  }

 private:
  size_t bytes_;
  char* data_;
};

struct Timing {
  std::function<double(double)> maxOverRanks;  // same result on every rank
  std::function<void()> barrier;
};

struct MeasureOptions {
  int reps = 5;             // measurements per size; the median is reported
  double minSeconds = 0.2;  // lower bound on the duration of one measurement
  int maxIters = 1000000;   // upper bound on calls per measurement
  // Test hook: this rank damages one element or byte of each verified result before checking
  // it, so a test can see the self-check fail the run (bench/CMakeLists.txt). -1: off.
  int corruptRank = -1;
};

inline std::vector<size_t> powersOf4(size_t minBytes, size_t maxBytes) {
  std::vector<size_t> s;
  for (size_t b = minBytes; b <= maxBytes; b *= 4) s.push_back(b);
  return s;
}

inline std::vector<size_t> defaultSizes(size_t maxBytes = 256u << 20) {
  return powersOf4(4096, maxBytes);
}

// The slowest rank's time for body(iters), in seconds.
inline double timeCollective(const Timing& t, const std::function<void(int)>& body, int iters) {
  t.barrier();
  auto t0 = std::chrono::steady_clock::now();
  body(iters);
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return t.maxOverRanks(s);
}

// Calls per measurement so that one lasts >= minSeconds. The first call pays one-time costs
// (connections, scratch buffers) and is left out of the estimate. The estimate comes from a
// batch grown until it lasts a tenth of minSeconds, so that one descheduled rank (2 cores run
// up to 4 ranks here) cannot shrink a whole size's measurements to a call each. Every rank
// computes the same count because it derives from max-reduced times.
inline int calibrate(const Timing& t, const std::function<void(int)>& body,
                     const MeasureOptions& o) {
  timeCollective(t, body, 1);
  const double target = o.minSeconds / 10;
  int k = 1;
  double elapsed = timeCollective(t, body, k);
  while (elapsed < target && k < o.maxIters) {
    k = static_cast<int>(std::min<double>(o.maxIters, k * (elapsed < target / 10 ? 10 : 2)));
    elapsed = timeCollective(t, body, k);
  }
  const double per = std::max(elapsed / k, 1e-9);
  return static_cast<int>(std::clamp(std::ceil(o.minSeconds / per), 1.0, double(o.maxIters)));
}

// One measurement: per-call seconds of the slowest rank over `iters` calls. A measurement that
// ran under half of minSeconds (the calibration was fooled by a stall) is repeated with more
// calls, and `iters` keeps the larger count for the next ones.
inline double measure(const Timing& t, const std::function<void(int)>& body, int& iters,
                      const MeasureOptions& o) {
  double elapsed = timeCollective(t, body, iters);
  while (elapsed < o.minSeconds / 2 && iters < o.maxIters) {
    iters = static_cast<int>(std::min<double>(
        o.maxIters, std::ceil(iters * 1.2 * o.minSeconds / std::max(elapsed, 1e-9))));
    elapsed = timeCollective(t, body, iters);
  }
  return elapsed / iters;
}

struct Stats {
  double median = 0, min = 0, max = 0, q1 = 0, q3 = 0;
};

inline Stats stats(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  // Linear interpolation between order statistics: the median of an even count is the mean of
  // the middle two.
  auto at = [&](double q) {
    const double x = q * (v.size() - 1);
    const size_t lo = static_cast<size_t>(x), hi = std::min(lo + 1, v.size() - 1);
    return v[lo] + (v[hi] - v[lo]) * (x - lo);
  };
  return {at(0.5), v.front(), v.back(), at(0.25), at(0.75)};
}

inline void addStats(nlohmann::json& row, const Stats& s, double scale, const std::string& unit) {
  row["median_" + unit] = s.median * scale;
  row["min_" + unit] = s.min * scale;
  row["max_" + unit] = s.max * scale;
  row["q1_" + unit] = s.q1 * scale;
  row["q3_" + unit] = s.q3 * scale;
}

// Every rank learns whether any rank saw a failure (see Note [Self-checking]).
inline bool allPassed(const Timing& t, bool localOk) {
  return t.maxOverRanks(localOk ? 0.0 : 1.0) == 0.0;
}

// ---------------------------------------------------------------------------------------------
// All-reduce

struct Collective {
  std::function<void(float* data, size_t count)> allreduce;  // in place, float32 sum
  // The call averages instead: each result is the exact sum times the float32 1/n (what
  // ReduceOp::kAvg computes for float32), so the check stays exact.
  bool average = false;
  Timing timing;
};

// Returns false (on every rank) if any rank's result was wrong. See Note [Self-checking].
inline bool runAllreduceSizes(const std::string& impl, const std::string& variant, int rank, int n,
                              const Collective& c, const std::vector<size_t>& sizes,
                              const MeasureOptions& o) {
  Buffer mem(sizes.back());
  float* buf = mem.as<float>();
  // Small integers: every partial sum is exact in float32 for n up to thousands.
  auto pattern = [&](size_t i, int r, int rep) {
    return static_cast<float>((r + 1) * static_cast<int>((i + 7 * rep) % 251 + 1));
  };
  const float rankSum = static_cast<float>(n * (n + 1) / 2);
  const float scale = 1.0f / static_cast<float>(n);
  for (size_t bytes : sizes) {
    const size_t count = bytes / 4;
    std::memset(buf, 0, count * 4);
    auto body = [&](int iters) {
      for (int i = 0; i < iters; ++i) c.allreduce(buf, count);
    };
    int iters = calibrate(c.timing, body, o);
    std::vector<double> times;
    std::string failure;
    for (int rep = 0; rep < o.reps && failure.empty(); ++rep) {
      for (size_t i = 0; i < count; ++i) buf[i] = pattern(i, rank, rep);
      c.allreduce(buf, count);
      if (rank == o.corruptRank) buf[count / 2] += 1.0f;
      for (size_t i = 0; i < count && failure.empty(); ++i) {
        float want = pattern(i, 0, rep) * rankSum;
        if (c.average) want *= scale;
        if (buf[i] != want) {
          failure = "element " + std::to_string(i) + " is " + std::to_string(buf[i]) +
                    ", expected " + std::to_string(want) + " (verified call " +
                    std::to_string(rep) + ")";
        }
      }
      std::memset(buf, 0, count * 4);
      times.push_back(measure(c.timing, body, iters, o));
      for (size_t i = 0; i < count && failure.empty(); ++i) {
        if (buf[i] != 0.0f) {
          failure = "element " + std::to_string(i) + " is " + std::to_string(buf[i]) +
                    " after the timed calls on zeros (measurement " + std::to_string(rep) + ")";
        }
      }
      // Checked after every measurement so that all ranks stop together.
      if (!allPassed(c.timing, failure.empty()) && failure.empty()) failure = "another rank failed";
    }
    if (!failure.empty()) {
      std::fprintf(stderr, "%s %s n=%d %zu bytes: rank %d: verification failed: %s\n", impl.c_str(),
                   variant.c_str(), n, bytes, rank, failure.c_str());
      return false;
    }
    const Stats s = stats(times);
    if (rank == 0) {
      const double algbw = bytes / s.median / 1e9;
      nlohmann::json row = {
          {"impl", impl},    {"variant", variant}, {"op", c.average ? "avg" : "sum"},
          {"n", n},          {"bytes", bytes},     {"reps", o.reps},
          {"iters", iters},  {"algbw", algbw},     {"busbw", algbw * 2.0 * (n - 1) / n},
          {"verified", true}};
      addStats(row, s, 1e6, "us");
      std::printf("%s\n", row.dump().c_str());
      std::fflush(stdout);
    }
  }
  return true;
}

// ---------------------------------------------------------------------------------------------
// Point to point, between ranks 0 and 1 (other ranks, if any, only join the barriers).

struct PointToPoint {
  std::function<void(const void* data, size_t bytes)> send;  // to the other rank, blocking
  std::function<void(void* data, size_t bytes)> recv;        // from the other rank, blocking
  // Sends `out` to and receives `in` from the other rank at the same time; returns when both
  // are done.
  std::function<void(const void* out, void* in, size_t bytes)> exchange;
  Timing timing;
};

enum class P2pMode { kPingPong, kOneWay, kBothWays };

inline const char* p2pModeName(P2pMode m) {
  switch (m) {
    case P2pMode::kPingPong:
      return "pingpong";
    case P2pMode::kOneWay:
      return "oneway";
    case P2pMode::kBothWays:
      return "bothways";
  }
  return "?";
}

namespace detail {

inline uint8_t payloadByte(size_t j, int sender, int rep) {
  return static_cast<uint8_t>(j * 31 + static_cast<size_t>(sender) * 7 + rep * 13 + 1);
}

// Measurement, iteration and sender in one word: a message that was lost, repeated or taken
// from the wrong peer shows a different stamp.
inline uint64_t stamp(int rep, int iter, int sender) {
  return (uint64_t(rep + 1) << 40) | (uint64_t(iter) << 8) | uint64_t(sender + 1);
}

}  // namespace detail

// Returns false (on every rank) if any message arrived wrong. See Note [Self-checking].
inline bool runP2p(const std::string& impl, const std::string& variant, int rank, int n,
                   const PointToPoint& p, P2pMode mode, const std::vector<size_t>& sizes,
                   const MeasureOptions& o) {
  const bool active = rank < 2;
  const int other = 1 - rank;
  Buffer out(sizes.back()), in(sizes.back());
  std::string failure;
  for (size_t bytes : sizes) {
    if (bytes < 8) throw std::invalid_argument("bench: p2p messages must hold at least 8 bytes");
    int rep = -1;  // calibration runs as measurement -1
    uint64_t bad = 0;
    auto sendOne = [&](int iter) {
      const uint64_t s = detail::stamp(rep, iter, rank);
      std::memcpy(out.data(), &s, 8);
      p.send(out.data(), bytes);
    };
    auto checkStamp = [&](int iter) {
      uint64_t got;
      std::memcpy(&got, in.data(), 8);
      if (got != detail::stamp(rep, iter, other)) ++bad;
    };
    auto recvOne = [&](int iter) {
      p.recv(in.data(), bytes);
      checkStamp(iter);
    };
    auto body = [&](int iters) {
      if (!active) return;
      for (int i = 0; i < iters; ++i) {
        switch (mode) {
          case P2pMode::kPingPong:
            if (rank == 0) {
              sendOne(i);
              recvOne(i);
            } else {
              recvOne(i);
              sendOne(i);
            }
            break;
          case P2pMode::kOneWay:
            if (rank == 0) {
              sendOne(i);
            } else {
              recvOne(i);
            }
            break;
          case P2pMode::kBothWays: {
            const uint64_t s = detail::stamp(rep, i, rank);
            std::memcpy(out.data(), &s, 8);
            p.exchange(out.data(), in.data(), bytes);
            checkStamp(i);
            break;
          }
        }
      }
      if (mode == P2pMode::kOneWay) {
        // The stream ends when the receiver has everything: it acknowledges with 8 bytes.
        uint64_t ack = 0;
        if (rank == 1) {
          p.send(&ack, 8);
        } else {
          p.recv(&ack, 8);
        }
      }
    };
    auto fillPattern = [&] {
      for (size_t j = 8; j < bytes; ++j) out.data()[j] = detail::payloadByte(j, rank, rep);
      std::memset(in.data(), 0, bytes);
    };
    fillPattern();
    int iters = calibrate(p.timing, body, o);
    if (!allPassed(p.timing, bad == 0)) {
      failure = bad ? std::to_string(bad) + " messages with a wrong stamp while calibrating"
                    : "another rank failed";
    }
    std::vector<double> times;
    for (rep = 0; rep < o.reps && failure.empty(); ++rep) {
      fillPattern();
      bad = 0;
      times.push_back(measure(p.timing, body, iters, o));
      const bool receives = active && (mode != P2pMode::kOneWay || rank == 1);
      if (rank == o.corruptRank) in.data()[bytes - 1] ^= 0x5a;
      if (bad) failure = std::to_string(bad) + " messages with a wrong stamp";
      for (size_t j = 8; receives && j < bytes && failure.empty(); ++j) {
        const uint8_t want = detail::payloadByte(j, other, rep);
        if (static_cast<uint8_t>(in.data()[j]) != want) {
          failure = "byte " + std::to_string(j) + " of the last message is " +
                    std::to_string(static_cast<uint8_t>(in.data()[j])) + ", expected " +
                    std::to_string(want);
        }
      }
      if (!allPassed(p.timing, failure.empty()) && failure.empty()) failure = "another rank failed";
    }
    if (!failure.empty()) {
      std::fprintf(stderr, "%s %s %s %zu bytes: rank %d: verification failed: %s\n", impl.c_str(),
                   variant.c_str(), p2pModeName(mode), bytes, rank, failure.c_str());
      return false;
    }
    const Stats s = stats(times);
    if (rank == 0) {
      nlohmann::json row = {{"impl", impl},   {"variant", variant}, {"mode", p2pModeName(mode)},
                            {"n", n},         {"bytes", bytes},     {"reps", o.reps},
                            {"iters", iters}, {"verified", true}};
      if (mode == P2pMode::kPingPong) {
        // Latency: half the round trip (osu_latency's convention).
        addStats(row, {s.median / 2, s.min / 2, s.max / 2, s.q1 / 2, s.q3 / 2}, 1e6, "us");
      } else {
        addStats(row, s, 1e6, "us");
        // Both ways moves 2 x bytes per call (osu_bibw reports the aggregate).
        const double moved = mode == P2pMode::kBothWays ? 2.0 * bytes : double(bytes);
        row["gbs"] = moved / s.median / 1e9;
      }
      std::printf("%s\n", row.dump().c_str());
      std::fflush(stdout);
    }
  }
  return true;
}

}  // namespace shoal::bench
