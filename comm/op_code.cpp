#include "comm/op_code.h"

#include <fmt/format.h>

#include "common/types.h"

namespace shoal::comm {

std::string opName(transport::OpCode code) {
  switch (static_cast<uint8_t>(code)) {
    case 0:
      return "none";
    case static_cast<uint8_t>(op::kAllreduce):
      return "allreduce";
    case static_cast<uint8_t>(op::kBroadcast):
      return "broadcast";
    case static_cast<uint8_t>(op::kReduce):
      return "reduce";
    case static_cast<uint8_t>(op::kAllgather):
      return "allgather";
    case static_cast<uint8_t>(op::kReduceScatter):
      return "reduce_scatter";
    case static_cast<uint8_t>(op::kAlltoall):
      return "alltoall";
    case static_cast<uint8_t>(op::kGather):
      return "gather";
    case static_cast<uint8_t>(op::kScatter):
      return "scatter";
    case static_cast<uint8_t>(op::kBarrier):
      return "barrier";
    case static_cast<uint8_t>(op::kSendRecv):
      return "send/recv";
    case static_cast<uint8_t>(op::kInternal):
      return "internal";
  }
  return fmt::format("operation {}", static_cast<int>(code));
}

std::string describeOp(const transport::FrameHeader& h) {
  const auto code = static_cast<transport::OpCode>(h.op);
  std::string s = fmt::format("{} #{}", opName(code), h.seq);
  if (code == op::kBarrier) return s;
  s += fmt::format(" of {} x {}", h.count,
                   validDataType(h.dtype) ? toString(static_cast<DataType>(h.dtype)) : "?");
  if (code == op::kAllreduce || code == op::kReduce || code == op::kReduceScatter) {
    s += fmt::format(" ({})",
                     validReduceOp(h.redop) ? toString(static_cast<ReduceOp>(h.redop)) : "?");
  }
  if (code == op::kBroadcast || code == op::kReduce || code == op::kGather ||
      code == op::kScatter) {
    s += fmt::format(" root {}", h.root);
  }
  return s;
}

}  // namespace shoal::comm
