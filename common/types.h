// Element types and reduction operators the engine moves and reduces. The engine works on raw
// buffers (void*, count, DataType) so it never depends on a tensor library.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace shoal {

enum class DataType : uint8_t {
  kFloat32 = 0,
  kFloat64 = 1,
  kFloat16 = 2,
  kBFloat16 = 3,
  kInt32 = 4,
  kInt64 = 5,
  kUInt8 = 6,
};
inline constexpr int kNumDataTypes = 7;

enum class ReduceOp : uint8_t {
  kSum = 0,
  kAvg = 1,
  kMin = 2,
  kMax = 3,
  kProduct = 4,
};
inline constexpr int kNumReduceOps = 5;

size_t elementSize(DataType t);
std::string_view toString(DataType t);
std::string_view toString(ReduceOp op);
bool isFloatingPoint(DataType t);
// Throws InvalidArgument for a name that is not a data type / op ("float32", "sum", ...).
DataType parseDataType(std::string_view name);
ReduceOp parseReduceOp(std::string_view name);
// Validate a raw byte taken from the wire.
bool validDataType(uint8_t raw);
bool validReduceOp(uint8_t raw);

}  // namespace shoal
