// Private to the Trainer: what its two loops share, fit() in train/trainer.cpp and an elastic
// job's in train/trainer/elastic_fit.cpp. Errors: require() throws InvalidArgument; the sum is
// a collective (its errors are the group's).
#pragma once

#include <fmt/format.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "comm/collectives.h"
#include "common/error.h"
#include "common/splitmix.h"

namespace shoal::train::loop {

// A bad option is the user's configuration: the message alone, without SHOAL_CHECK's source
// expression.
template <typename... Args>
void require(bool cond, fmt::format_string<Args...> format, Args&&... args) {
  if (!cond) throw InvalidArgument(fmt::format(format, std::forward<Args>(args)...));
}

// One well-mixed seed from three numbers: nearby steps and replicas get unrelated streams.
inline uint64_t mixSeed(uint64_t seed, uint64_t stream, uint64_t step) {
  return splitmix64(splitmix64(splitmix64(seed) ^ stream) ^ step);
}

inline double secondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// Sums over the workers: [sum of losses, count] or [sum, correct, count].
inline void sumOverWorkers(comm::Group& g, double* values, size_t n) {
  comm::allreduce(g, values, n, DataType::kFloat64, ReduceOp::kSum);
}

}  // namespace shoal::train::loop
