// Google Benchmark of the reduction kernels (dst = dst op src) per data type, in GB/s of
// bytes touched (two reads and a write per element). All-reduce over shared memory is bound
// by these loops and memcpy; this says which one.
#include <benchmark/benchmark.h>

#include <vector>

#include "common/reduce.h"

namespace {

void reduceKernel(benchmark::State& state, shoal::DataType type, shoal::ReduceOp op) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  const size_t count = bytes / shoal::elementSize(type);
  std::vector<uint8_t> dst(bytes, 0), src(bytes, 0);
  for (auto _ : state) {
    shoal::reduceInto(dst.data(), src.data(), count, type, op);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * 3 * bytes);
}

#define SHOAL_REDUCE_BENCH(type, op)                                                       \
  BENCHMARK_CAPTURE(reduceKernel, type##_##op, shoal::DataType::type, shoal::ReduceOp::op) \
      ->Arg(256 << 10)                                                                     \
      ->Arg(64 << 20)

SHOAL_REDUCE_BENCH(kFloat32, kSum);
SHOAL_REDUCE_BENCH(kFloat32, kMax);
SHOAL_REDUCE_BENCH(kFloat64, kSum);
SHOAL_REDUCE_BENCH(kFloat16, kSum);
SHOAL_REDUCE_BENCH(kBFloat16, kSum);
SHOAL_REDUCE_BENCH(kInt32, kSum);
SHOAL_REDUCE_BENCH(kInt64, kSum);
SHOAL_REDUCE_BENCH(kUInt8, kSum);

}  // namespace

BENCHMARK_MAIN();
