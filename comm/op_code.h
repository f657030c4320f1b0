// The operation codes of comm's operations, as frames carry them, and how comm names them in
// error messages.
//
// Codes below kFirstExternal belong to comm; layers above define theirs from kFirstExternal up
// (ps/protocol.h), so adding an operation edits neither transport/ nor this file.
#pragma once

#include <string>
#include <string_view>

#include "transport/frame.h"

namespace shoal::comm {

namespace op {
using transport::OpCode;
inline constexpr OpCode kAllreduce{1};
inline constexpr OpCode kBroadcast{2};
inline constexpr OpCode kReduce{3};
inline constexpr OpCode kAllgather{4};
inline constexpr OpCode kReduceScatter{5};
inline constexpr OpCode kAlltoall{6};
inline constexpr OpCode kGather{7};
inline constexpr OpCode kScatter{8};
inline constexpr OpCode kBarrier{9};
inline constexpr OpCode kSendRecv{10};
inline constexpr OpCode kInternal{11};  // group bookkeeping (split, diagnostics)
inline constexpr OpCode kFirstExternal{64};
}  // namespace op

// "allreduce"; "operation 70" for a code comm does not define.
std::string opName(transport::OpCode code);

// A frame as comm's error messages show it: "allreduce #5 of 77 x float32 (sum)",
// "broadcast #2 of 10 x int32 root 1", "barrier #7". The describer groups give their endpoints.
std::string describeOp(const transport::FrameHeader& h);

}  // namespace shoal::comm
