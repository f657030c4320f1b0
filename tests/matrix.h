// The collective test matrix, shared by the thread-rank tests and the multi-process worker:
// every collective x algorithm x dtype x op x length, checked against a serial reference
// computed in double (inputs are small integers, so float results are exact except where
// avg or 16-bit rounding enters, which get a tolerance).
#pragma once

#include <string>
#include <vector>

#include "comm/group.h"

namespace shoal::test {

struct MatrixOptions {
  std::vector<size_t> lengths{0, 1, 5, 1003, 70001};
  std::vector<DataType> types{DataType::kFloat32,  DataType::kFloat64, DataType::kFloat16,
                              DataType::kBFloat16, DataType::kInt32,   DataType::kInt64,
                              DataType::kUInt8};
  std::vector<ReduceOp> ops{ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax,
                            ReduceOp::kProduct};
  bool big = false;  // also 64 MiB all-reduce (each algorithm) and broadcast
};

// Runs the whole matrix on `g` (collective: every rank calls it). Returns the failures seen
// by this rank, one line each; empty means everything matched.
std::vector<std::string> runMatrix(comm::Group& g, const MatrixOptions& options);

}  // namespace shoal::test
