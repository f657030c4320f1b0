#include "ps/shard.h"

#include <algorithm>
#include <cstring>

#include "common/byte_codec.h"
#include "common/error.h"
#include "ps/server_optimizer.h"

namespace shoal::ps {

namespace {

constexpr size_t kChunk = 4096;  // elements reduced at a time (stays in L1/L2)

}  // namespace

Shard::Shard(const Partition& partition, int server, int workers, const TrainingConfig& config)
    : config_(config), workers_(workers), begin_(partition.begin(server)) {
  for (const Piece& p : partition.pieces(server)) {
    PieceState s;
    s.piece = p;
    s.parameter = partition.keys()[p.key].kind == KeyKind::kParameter;
    s.arrived.assign(static_cast<size_t>(workers), 0);
    pieces_.push_back(std::move(s));
  }
  const size_t n = partition.elements(server);
  values_.assign(n, 0.0f);
  const int slots = optimizerStateSlots(config.optimizer);
  if (slots >= 1) state0_.assign(n, 0.0f);
  if (slots >= 2) state1_.assign(n, 0.0f);
  slots_.assign(static_cast<size_t>(workers), std::vector<float>(n, 0.0f));
  if (config.mode == Mode::kSync && workers > 1) sum_.resize(kChunk);
}

void Shard::update(bool parameter, int64_t updateNumber, const float* g, float scale, double lr,
                   size_t at, size_t n) {
  if (!parameter) {
    for (size_t i = 0; i < n; ++i) values_[at + i] = g[i] * scale;
    return;
  }
  applyUpdate(config_.optimizer, lr, updateNumber, scale, g, values_.data() + at,
              state0_.empty() ? nullptr : state0_.data() + at,
              state1_.empty() ? nullptr : state1_.data() + at, n);
}

bool Shard::arrive(int worker, size_t first, size_t last) {
  bool completed = false;
  const LrSchedule schedule = config_.schedule(workers_);
  for (size_t i = first; i < last; ++i) {
    PieceState& ps = pieces_[i];
    ps.arrived[worker] = 1;
    if (++ps.arrivals < workers_) continue;
    const size_t at = localOffset(i);
    const size_t n = ps.piece.count;
    const double lr = schedule.at(static_cast<int64_t>(ps.version));
    const float scale = 1.0f / static_cast<float>(workers_);
    if (workers_ == 1) {
      update(ps, slots_[0].data() + at, 1.0f, lr, at, n);
    } else {
      // Worker order, whatever the arrival order: the same sums on every run.
      for (size_t c = 0; c < n; c += kChunk) {
        const size_t m = std::min(kChunk, n - c);
        const float* s0 = slots_[0].data() + at + c;
        std::copy(s0, s0 + m, sum_.data());
        for (int w = 1; w < workers_; ++w) {
          const float* sw = slots_[w].data() + at + c;
          for (size_t k = 0; k < m; ++k) sum_[k] += sw[k];
        }
        update(ps, sum_.data(), scale, lr, at + c, m);
      }
    }
    ++ps.version;
    ps.arrivals = 0;
    std::fill(ps.arrived.begin(), ps.arrived.end(), 0);
    completed = true;
  }
  return completed;
}

void Shard::applyNow(int worker, size_t first, size_t last, int64_t step) {
  const LrSchedule schedule = config_.schedule(workers_);
  const double lr = schedule.at(step);
  for (size_t i = first; i < last; ++i) {
    PieceState& ps = pieces_[i];
    const size_t at = localOffset(i);
    update(ps, slots_[worker].data() + at, 1.0f, lr, at, ps.piece.count);
    ++ps.version;
  }
}

bool Shard::completesStep(int worker, size_t first, size_t last) const {
  for (size_t i = first; i < last; ++i) {
    const PieceState& ps = pieces_[i];
    if (ps.arrived[worker] || ps.arrivals != workers_ - 1) return false;
  }
  return true;
}

bool Shard::completesAnyStep(int worker, size_t first, size_t last) const {
  if (config_.mode != Mode::kSync) return false;
  for (size_t i = first; i < last; ++i) {
    const PieceState& ps = pieces_[i];
    if (!ps.arrived[worker] && ps.arrivals == workers_ - 1) return true;
  }
  return false;
}

void Shard::beginIncoming(int worker, size_t first, size_t last, int64_t step, Incoming& in) const {
  const bool sync = config_.mode == Mode::kSync;
  SHOAL_ASSERT(!sync || completesStep(worker, first, last),
               "worker {} does not complete pieces [{}, {})", worker, first, last);
  const LrSchedule schedule = config_.schedule(workers_);
  in.worker = worker;
  in.first = first;
  in.last = last;
  in.begin = first < last ? localOffset(first) : 0;
  in.scale = sync && workers_ > 1 ? 1.0f / static_cast<float>(workers_) : 1.0f;
  in.sum = sync && workers_ > 1;
  in.cursor = 0;
  in.segments.clear();
  for (size_t i = first; i < last; ++i) {
    const PieceState& ps = pieces_[i];
    Incoming::Segment s;
    s.at = localOffset(i);
    s.count = ps.piece.count;
    // As arrive() and applyNow() do: the step of the piece (synchronous) or of the worker.
    s.lr = schedule.at(sync ? static_cast<int64_t>(ps.version) : step);
    s.update = static_cast<int64_t>(ps.version) + 1;
    s.parameter = ps.parameter;
    SHOAL_ASSERT(i == first || s.at == in.segments.back().at + in.segments.back().count,
                 "pieces {} and {} are not contiguous", i - 1, i);
    in.segments.push_back(s);
  }
}

void Shard::applyIncoming(Incoming& in, const float* g, size_t offset, size_t n) {
  size_t at = in.begin + offset;
  while (n > 0) {
    while (in.cursor < in.segments.size() &&
           in.segments[in.cursor].at + in.segments[in.cursor].count <= at) {
      ++in.cursor;
    }
    SHOAL_ASSERT(in.cursor < in.segments.size() && in.segments[in.cursor].at <= at,
                 "element {} is outside the push", at);
    const Incoming::Segment& s = in.segments[in.cursor];
    const size_t m = std::min(n, s.at + s.count - at);
    if (!in.sum) {
      update(s.parameter, s.update, g, in.scale, s.lr, at, m);
    } else {
      // The reduction arrive() does, with this worker's part read where it arrived.
      for (size_t c = 0; c < m; c += kChunk) {
        const size_t k = std::min(kChunk, m - c);
        auto part = [&](int w) { return w == in.worker ? g + c : slots_[w].data() + at + c; };
        const float* s0 = part(0);
        std::copy(s0, s0 + k, sum_.data());
        for (int w = 1; w < workers_; ++w) {
          const float* sw = part(w);
          for (size_t j = 0; j < k; ++j) sum_[j] += sw[j];
        }
        update(s.parameter, s.update, sum_.data(), in.scale, s.lr, at + c, k);
      }
    }
    g += m;
    at += m;
    n -= m;
  }
}

void Shard::endIncoming(const Incoming& in) {
  for (size_t i = in.first; i < in.last; ++i) {
    PieceState& ps = pieces_[i];
    ++ps.version;
    ps.arrivals = 0;
    std::fill(ps.arrived.begin(), ps.arrived.end(), 0);
  }
}

std::string Shard::snapshot(const std::string& header, uint64_t round,
                            const std::vector<uint64_t>& clocks) const {
  std::string out;
  putBytes(out, header.data(), header.size());
  putValue<uint64_t>(out, round);
  putValue<uint64_t>(out, clocks.size());
  for (uint64_t c : clocks) putValue<uint64_t>(out, c);
  putValue<uint64_t>(out, pieces_.size());
  for (const PieceState& ps : pieces_) putValue<uint64_t>(out, ps.version);
  putBytes(out, values_.data(), values_.size() * sizeof(float));
  putBytes(out, state0_.data(), state0_.size() * sizeof(float));
  putBytes(out, state1_.data(), state1_.size() * sizeof(float));
  return out;
}

std::string Shard::snapshotHeader(const std::string& payload, std::string_view source) {
  ByteReader in(payload, std::string(source));
  return std::string(in.bytes());
}

void Shard::checkSnapshotFits(const Partition& partition, int server, const TrainingConfig& config,
                              size_t payloadBytes, std::string_view source) {
  // Values plus each optimizer state slot, float32 each; computed in long double so that a
  // crafted element count cannot wrap around to something small.
  const long double elements = static_cast<long double>(partition.elements(server));
  const long double needed = elements * sizeof(float) * (1 + optimizerStateSlots(config.optimizer));
  if (needed > static_cast<long double>(payloadBytes)) {
    SHOAL_THROW(InvalidArgument,
                "{} is corrupt: its keys give server {} {} elements ({:.0f} bytes with optimizer "
                "state), but the file holds {} bytes",
                source, server, partition.elements(server), static_cast<double>(needed),
                payloadBytes);
  }
}

std::string Shard::restore(const std::string& payload, uint64_t& round,
                           std::vector<uint64_t>& clocks, std::string_view source) {
  ByteReader in(payload, std::string(source));
  std::string header(in.bytes());
  round = in.get<uint64_t>();
  // Checked against this job before the vector is sized (the count comes from the file).
  const uint64_t workers = in.count(sizeof(uint64_t), "worker clocks");
  if (workers != static_cast<uint64_t>(workers_)) {
    SHOAL_THROW(InvalidArgument, "{} was written for {} workers; this job has {}", source, workers,
                workers_);
  }
  clocks.resize(workers);
  for (auto& c : clocks) c = in.get<uint64_t>();
  if (const uint64_t pieces = in.count(sizeof(uint64_t), "pieces"); pieces != pieces_.size()) {
    SHOAL_THROW(InvalidArgument,
                "{} holds another partition of the model ({} pieces, this shard has {})", source,
                pieces, pieces_.size());
  }
  for (PieceState& ps : pieces_) ps.version = in.get<uint64_t>();
  auto fill = [&](std::vector<float>& v, const char* what) {
    auto b = in.bytes();
    if (b.size() != v.size() * sizeof(float)) {
      SHOAL_THROW(InvalidArgument, "{}: {} holds {} bytes, expected {}", source, what, b.size(),
                  v.size() * sizeof(float));
    }
    if (!b.empty()) std::memcpy(v.data(), b.data(), b.size());
  };
  fill(values_, "values");
  fill(state0_, "optimizer state");
  fill(state1_, "optimizer state");
  if (!in.atEnd()) SHOAL_THROW(InvalidArgument, "{} has trailing bytes", source);
  return header;
}

size_t Shard::copyOverlap(const Shard& from) {
  if (from.state0_.empty() != state0_.empty() || from.state1_.empty() != state1_.empty()) {
    SHOAL_THROW(InvalidArgument, "cannot copy between shards with different optimizer state");
  }
  const size_t lo = std::max(begin_, from.begin_);
  const size_t hi = std::min(begin_ + values_.size(), from.begin_ + from.values_.size());
  if (lo >= hi) return 0;
  auto copy = [&](const std::vector<float>& src, std::vector<float>& dst) {
    if (dst.empty()) return;
    std::copy(src.begin() + static_cast<ptrdiff_t>(lo - from.begin_),
              src.begin() + static_cast<ptrdiff_t>(hi - from.begin_),
              dst.begin() + static_cast<ptrdiff_t>(lo - begin_));
  };
  copy(from.values_, values_);
  copy(from.state0_, state0_);
  copy(from.state1_, state1_);
  for (PieceState& ps : pieces_) {
    const size_t a = ps.piece.flat, b = ps.piece.flat + ps.piece.count;
    for (const PieceState& other : from.pieces_) {
      const size_t c = other.piece.flat, d = other.piece.flat + other.piece.count;
      if (std::max(a, c) < std::min(b, d)) ps.version = std::max(ps.version, other.version);
    }
  }
  return hi - lo;
}

}  // namespace shoal::ps
