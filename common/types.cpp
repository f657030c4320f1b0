#include "common/types.h"

#include "common/error.h"

namespace shoal {

namespace {
constexpr std::string_view kTypeNames[] = {"float32", "float64", "float16", "bfloat16",
                                           "int32",   "int64",   "uint8"};
constexpr size_t kTypeSizes[] = {4, 8, 2, 2, 4, 8, 1};
constexpr std::string_view kOpNames[] = {"sum", "avg", "min", "max", "product"};
}  // namespace

bool validDataType(uint8_t raw) {
  return raw < kNumDataTypes;
}
bool validReduceOp(uint8_t raw) {
  return raw < kNumReduceOps;
}

size_t elementSize(DataType t) {
  return kTypeSizes[static_cast<int>(t)];
}
std::string_view toString(DataType t) {
  return validDataType(static_cast<uint8_t>(t)) ? kTypeNames[static_cast<int>(t)] : "invalid";
}
std::string_view toString(ReduceOp op) {
  return validReduceOp(static_cast<uint8_t>(op)) ? kOpNames[static_cast<int>(op)] : "invalid";
}
bool isFloatingPoint(DataType t) {
  return t == DataType::kFloat32 || t == DataType::kFloat64 || t == DataType::kFloat16 ||
         t == DataType::kBFloat16;
}

DataType parseDataType(std::string_view name) {
  for (int i = 0; i < kNumDataTypes; ++i) {
    if (kTypeNames[i] == name) return static_cast<DataType>(i);
  }
  SHOAL_THROW(InvalidArgument,
              "unknown data type '{}' (float32, float64, float16, bfloat16, "
              "int32, int64, uint8)",
              name);
}

ReduceOp parseReduceOp(std::string_view name) {
  for (int i = 0; i < kNumReduceOps; ++i) {
    if (kOpNames[i] == name) return static_cast<ReduceOp>(i);
  }
  SHOAL_THROW(InvalidArgument, "unknown reduce op '{}' (sum, avg, min, max, product)", name);
}

}  // namespace shoal
