// torch's element types as Shoal's (the engine knows nothing of torch).
#pragma once

#include <torch/torch.h>

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

}  // namespace shoal::train
