// The reduction kernels per instruction set (common/reduce_isa.h): GB/s of reduceTo (two inputs
// read, one output written) for float32, bfloat16 and float16 sums, medians of several runs.
// bench/results/portable_build.md compares a portable build's sets with a -march=native build,
// the build this one replaced as the default.
//
//   reduce_isa_bench [--elements N] [--runs R]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/reduce_isa.h"

int main(int argc, char** argv) {
  size_t elements = size_t{1} << 20;  // 4 MiB of float32: in L2/L3, as an all-reduce chunk is
  int runs = 9;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--elements") == 0) elements = std::strtoull(argv[i + 1], nullptr, 10);
    if (std::strcmp(argv[i], "--runs") == 0) runs = std::atoi(argv[i + 1]);
  }
  const int iterations = 20;
  std::printf("%-8s %-9s %10s\n", "set", "type", "GB/s");
  for (const auto& k : shoal::reduce_isa::available()) {
    for (auto type :
         {shoal::DataType::kFloat32, shoal::DataType::kBFloat16, shoal::DataType::kFloat16}) {
      const size_t bytes = elements * shoal::elementSize(type);
      std::vector<uint8_t> a(bytes, 0x3c), b(bytes, 0x3c), dst(bytes);
      std::vector<double> rates;
      for (int r = 0; r < runs; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        for (int it = 0; it < iterations; ++it) {
          k.reduceTo(dst.data(), a.data(), b.data(), elements, type, shoal::ReduceOp::kSum, 1);
        }
        const double s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        rates.push_back(3.0 * bytes * iterations / s / 1e9);
      }
      std::sort(rates.begin(), rates.end());
      std::printf("%-8s %-9s %10.2f\n", std::string(k.name).c_str(),
                  std::string(shoal::toString(type)).c_str(), rates[rates.size() / 2]);
    }
  }
  return 0;
}
