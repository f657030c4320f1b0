// torch's element types as Shoal's (the engine knows nothing of torch).
#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <string>

#include "common/error.h"
#include "common/types.h"

namespace shoal::train {

inline DataType toShoalType(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat32:
      return DataType::kFloat32;
    case torch::kFloat64:
      return DataType::kFloat64;
    case torch::kFloat16:
      return DataType::kFloat16;
    case torch::kBFloat16:
      return DataType::kBFloat16;
    case torch::kInt32:
      return DataType::kInt32;
    case torch::kInt64:
      return DataType::kInt64;
    case torch::kUInt8:
      return DataType::kUInt8;
    default:
      SHOAL_THROW(InvalidArgument, "tensor type {} has no Shoal equivalent",
                  std::string(c10::toString(t)));
  }
}

// "Float [3, 4]" for messages; "undefined" for an undefined tensor.
inline std::string describe(const torch::Tensor& t) {
  if (!t.defined()) return "undefined";
  return fmt::format("{} [{}]", c10::toString(t.scalar_type()), fmt::join(t.sizes(), ", "));
}

}  // namespace shoal::train
