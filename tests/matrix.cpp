#include "tests/matrix.h"

#include <cmath>
#include <cstring>

#include "comm/collectives.h"
#include "comm/native/native_engine.h"
#include "common/half.h"

namespace shoal::test {

namespace {

using comm::AllreduceAlgorithm;

template <typename T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

template <typename T>
void store(uint8_t* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}

double get(const std::vector<uint8_t>& b, size_t i, DataType t) {
  const uint8_t* p = b.data() + i * elementSize(t);
  switch (t) {
    case DataType::kFloat32:
      return load<float>(p);
    case DataType::kFloat64:
      return load<double>(p);
    case DataType::kFloat16:
      return halfToFloat(load<uint16_t>(p));
    case DataType::kBFloat16:
      return bf16ToFloat(load<uint16_t>(p));
    case DataType::kInt32:
      return load<int32_t>(p);
    case DataType::kInt64:
      return static_cast<double>(load<int64_t>(p));
    case DataType::kUInt8:
      return *p;
  }
  return 0;
}

void put(std::vector<uint8_t>& b, size_t i, DataType t, double v) {
  uint8_t* p = b.data() + i * elementSize(t);
  switch (t) {
    case DataType::kFloat32:
      return store(p, static_cast<float>(v));
    case DataType::kFloat64:
      return store(p, v);
    case DataType::kFloat16:
      return store(p, floatToHalf(static_cast<float>(v)));
    case DataType::kBFloat16:
      return store(p, floatToBf16(static_cast<float>(v)));
    case DataType::kInt32:
      return store(p, static_cast<int32_t>(v));
    case DataType::kInt64:
      return store(p, static_cast<int64_t>(v));
    case DataType::kUInt8:
      return store(p, static_cast<uint8_t>(static_cast<int64_t>(v) & 0xff));
  }
}

// Input of `rank` at element i: small integers, positive for unsigned types, only 1 or 2 for
// products (so 8 ranks stay exact in every type, uint8 wrapping included).
double input(int rank, size_t i, DataType t, ReduceOp op, int salt = 0) {
  if (op == ReduceOp::kProduct) return ((rank + i + salt) % 3 == 0) ? 2 : 1;
  long v = static_cast<long>((rank * 7 + i * 3 + salt * 5) % 11);
  return t == DataType::kUInt8 ? v : v - 5;
}

double referenceReduce(int n, size_t i, DataType t, ReduceOp op, int salt = 0) {
  double acc = input(0, i, t, op, salt);
  for (int r = 1; r < n; ++r) {
    double v = input(r, i, t, op, salt);
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
        acc += v;
        break;
      case ReduceOp::kProduct:
        acc *= v;
        break;
      case ReduceOp::kMin:
        acc = std::min(acc, v);
        break;
      case ReduceOp::kMax:
        acc = std::max(acc, v);
        break;
    }
  }
  if (op == ReduceOp::kProduct && t == DataType::kUInt8) {
    acc = static_cast<double>(static_cast<int64_t>(acc) & 0xff);
  }
  if (op == ReduceOp::kAvg) {
    acc = isFloatingPoint(t) ? acc / n : static_cast<double>(static_cast<int64_t>(acc) / n);
  }
  return acc;
}

bool close(double got, double want, DataType t) {
  if (!isFloatingPoint(t)) return got == want;
  double tol = (t == DataType::kFloat16 || t == DataType::kBFloat16) ? 1e-2 : 1e-6;
  return std::fabs(got - want) <= tol * std::max(1.0, std::fabs(want));
}

class Checker {
 public:
  explicit Checker(int rank) : rank_(rank) {}
  // Compares buf[0..count) to want(i); records the first mismatch only.
  template <typename F>
  void expect(const std::string& what, const std::vector<uint8_t>& buf, size_t count, DataType t,
              F want) {
    for (size_t i = 0; i < count; ++i) {
      double w = want(i), g = get(buf, i, t);
      if (!close(g, w, t)) {
        failures_.push_back(
            fmt::format("rank {}: {}: element {} is {}, expected {}", rank_, what, i, g, w));
        return;
      }
    }
  }
  std::vector<std::string> take() { return std::move(failures_); }

 private:
  int rank_;
  std::vector<std::string> failures_;
};

std::vector<uint8_t> filled(int rank, size_t count, DataType t, ReduceOp op, int salt = 0) {
  std::vector<uint8_t> b(count * elementSize(t));
  for (size_t i = 0; i < count; ++i) put(b, i, t, input(rank, i, t, op, salt));
  return b;
}

}  // namespace

std::vector<std::string> runMatrix(comm::Group& g, const MatrixOptions& o) {
  const int n = g.size(), r = g.rank();
  Checker check(r);
  auto label = [](std::string_view coll, DataType t, size_t count, std::string_view extra) {
    return fmt::format("{} {} x {} {}", coll, count, toString(t), extra);
  };

  // The hierarchical all-reduce only where the group spans several hosts alike (elsewhere it
  // runs the ring, tested already).
  std::vector<AllreduceAlgorithm> algorithms{
      AllreduceAlgorithm::kRing, AllreduceAlgorithm::kRecursiveDoubling,
      AllreduceAlgorithm::kRabenseifner, AllreduceAlgorithm::kDriver, AllreduceAlgorithm::kAuto};
  if (g.engineName() == "native" && comm::nativeEngine(g).hosts().uniform()) {
    algorithms.push_back(AllreduceAlgorithm::kHierarchical);
  }
  for (auto algo : algorithms) {
    for (DataType t : o.types) {
      for (ReduceOp op : o.ops) {
        for (size_t count : o.lengths) {
          auto buf = filled(r, count, t, op);
          comm::allreduce(g, buf.data(), count, t, op, {.algorithm = algo});
          check.expect(label("allreduce", t, count,
                             fmt::format("{} {}", toString(op), comm::toString(algo))),
                       buf, count, t, [&](size_t i) { return referenceReduce(n, i, t, op); });
        }
      }
    }
  }

  const int root = n - 1;
  for (DataType t : o.types) {
    for (size_t count : o.lengths) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kAvg}) {
        auto buf = filled(r, count, t, op);
        comm::reduce(g, buf.data(), count, t, op, root);
        if (r == root) {
          check.expect(label("reduce", t, count, toString(op)), buf, count, t,
                       [&](size_t i) { return referenceReduce(n, i, t, op); });
        } else {
          check.expect(label("reduce (non-root unchanged)", t, count, ""), buf, count, t,
                       [&](size_t i) { return input(r, i, t, op); });
        }
      }
      auto b = filled(r, count, t, ReduceOp::kSum, 1);
      comm::broadcast(g, b.data(), count, t, root);
      check.expect(label("broadcast", t, count, ""), b, count, t,
                   [&](size_t i) { return input(root, i, t, ReduceOp::kSum, 1); });

      auto mine = filled(r, count, t, ReduceOp::kSum, 2);
      std::vector<uint8_t> all(count * n * elementSize(t));
      comm::allgather(g, mine.data(), all.data(), count, t);
      check.expect(label("allgather", t, count, ""), all, count * n, t, [&](size_t i) {
        return input(static_cast<int>(i / count), i % count, t, ReduceOp::kSum, 2);
      });

      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin}) {
        // Rank r's send buffer block j holds input(r, j*count + i).
        auto in = filled(r, count * n, t, op, 3);
        std::vector<uint8_t> out(count * elementSize(t));
        comm::reduceScatter(g, in.data(), out.data(), count, t, op);
        check.expect(label("reduce_scatter", t, count, toString(op)), out, count, t,
                     [&](size_t i) { return referenceReduce(n, r * count + i, t, op, 3); });
      }

      // All-to-all: rank r's block j holds values tagged (r, j).
      std::vector<uint8_t> a2aIn(count * n * elementSize(t)), a2aOut(a2aIn.size());
      for (int j = 0; j < n; ++j) {
        for (size_t i = 0; i < count; ++i) put(a2aIn, j * count + i, t, (r * 3 + j + i) % 13);
      }
      comm::alltoall(g, a2aIn.data(), a2aOut.data(), count, t);
      check.expect(label("alltoall", t, count, ""), a2aOut, count * n, t, [&](size_t k) {
        size_t j = k / count, i = k % count;  // block j came from rank j, its block r
        return static_cast<double>((j * 3 + r + i) % 13);
      });

      const int groot = 1 % n;
      std::vector<uint8_t> gathered(r == groot ? count * n * elementSize(t) : 0);
      comm::gather(g, mine.data(), gathered.data(), count, t, groot);
      if (r == groot) {
        check.expect(label("gather", t, count, ""), gathered, count * n, t, [&](size_t i) {
          return input(static_cast<int>(i / count), i % count, t, ReduceOp::kSum, 2);
        });
      }
      auto scatterIn = filled(groot, count * n, t, ReduceOp::kSum, 4);
      std::vector<uint8_t> part(count * elementSize(t));
      comm::scatter(g, r == groot ? scatterIn.data() : nullptr, part.data(), count, t, groot);
      check.expect(label("scatter", t, count, ""), part, count, t,
                   [&](size_t i) { return input(groot, r * count + i, t, ReduceOp::kSum, 4); });
    }
  }

  comm::barrier(g);

  // Point to point around the ring; even ranks send first so that large messages cannot
  // deadlock on full buffers.
  if (n > 1) {
    for (size_t count : o.lengths) {
      const DataType t = DataType::kInt64;
      auto out = filled(r, count, t, ReduceOp::kSum, 5);
      std::vector<uint8_t> in(out.size());
      const int to = (r + 1) % n, from = (r + n - 1) % n;
      if (r % 2 == 0) {
        comm::send(g, out.data(), count, t, to);
        comm::recv(g, in.data(), count, t, from);
      } else {
        comm::recv(g, in.data(), count, t, from);
        comm::send(g, out.data(), count, t, to);
      }
      check.expect(label("send/recv", t, count, ""), in, count, t,
                   [&](size_t i) { return input(from, i, t, ReduceOp::kSum, 5); });
    }
  }

  // Several asynchronous all-reduces in flight at once.
  {
    const DataType t = DataType::kFloat32;
    const size_t count = 4099;
    std::vector<std::vector<uint8_t>> bufs;
    std::vector<std::shared_ptr<comm::Work>> works;
    for (int k = 0; k < 4; ++k) bufs.push_back(filled(r, count, t, ReduceOp::kSum, k));
    for (int k = 0; k < 4; ++k) {
      works.push_back(comm::allreduceAsync(g, bufs[k].data(), count, t, ReduceOp::kSum));
    }
    for (int k = 0; k < 4; ++k) {
      works[k]->wait();
      check.expect(label("allreduce async", t, count, std::to_string(k)), bufs[k], count, t,
                   [&](size_t i) { return referenceReduce(n, i, t, ReduceOp::kSum, k); });
    }
  }

  // Sub-groups: even and odd ranks, ordered by descending rank.
  {
    auto sub = g.split(r % 2, -r);
    const int subSize = (n + 1 - r % 2) / 2;
    if (!sub || sub->size() != subSize || sub->rank() != (subSize - 1 - r / 2)) {
      return {fmt::format("rank {}: split gave size {} rank {}, expected size {} rank {}", r,
                          sub ? sub->size() : -1, sub ? sub->rank() : -1, subSize,
                          subSize - 1 - r / 2)};
    }
    int64_t v = r, sum = 0;
    for (int p = r % 2; p < n; p += 2) sum += p;
    comm::allreduce(*sub, &v, 1, DataType::kInt64, ReduceOp::kSum);
    if (v != sum) {
      return {fmt::format("rank {}: sub-group sum {} expected {}", r, v, sum)};
    }
    comm::barrier(g);
  }

  if (o.big) {
    const size_t count = (64u << 20) / 4;
    const DataType t = DataType::kFloat32;
    for (auto algo : algorithms) {
      if (algo == AllreduceAlgorithm::kAuto) continue;
      auto buf = filled(r, count, t, ReduceOp::kSum);
      comm::allreduce(g, buf.data(), count, t, ReduceOp::kSum, {.algorithm = algo});
      check.expect(label("allreduce 64 MiB", t, count, comm::toString(algo)), buf, count, t,
                   [&](size_t i) { return referenceReduce(n, i, t, ReduceOp::kSum); });
    }
    auto b = filled(r, count, t, ReduceOp::kSum, 1);
    comm::broadcast(g, b.data(), count, t, 0);
    check.expect(label("broadcast 64 MiB", t, count, ""), b, count, t,
                 [&](size_t i) { return input(0, i, t, ReduceOp::kSum, 1); });
  }
  return check.take();
}

}  // namespace shoal::test
