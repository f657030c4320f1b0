// A digest of tensors' bytes for the process tests' workers: ranks print it, and the tests compare
// replicas (and runs) bit for bit without moving the tensors themselves.
#pragma once

#include <fmt/format.h>
#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

namespace shoal::test {

// FNV-1a over the tensors' bytes, in order, as 16 hex digits.
inline std::string tensorDigest(const std::vector<torch::Tensor>& tensors) {
  uint64_t h = 1469598103934665603ull;
  for (const auto& t : tensors) {
    const auto c = t.contiguous();
    const auto* b = static_cast<const unsigned char*>(c.data_ptr());
    for (size_t i = 0; i < c.nbytes(); ++i) h = (h ^ b[i]) * 1099511628211ull;
  }
  return fmt::format("{:016x}", h);
}

}  // namespace shoal::test
