// The abort record a failing rank of a native group leaves in the job's store (Note [Root cause]
// in native_engine.cpp): where it is kept and how it reads. Written by the engine; read by the
// peers that lost the rank without a word, and by the launcher to tell a rank that failed by
// itself from the ranks it took down (run/failure_blame.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "transport/frame.h"

namespace shoal::comm {

// The store prefix of world generation `generation` (Group::create), under which its groups'
// keys live.
std::string worldPrefix(uint64_t generation);

// The key of `rank`'s record, within its group's prefix.
std::string abortRecordKey(int rank);

// "<kind> <origin>\n<text>".
std::string encodeAbortRecord(const transport::Failure& failure);

// Read like any outside input: nothing for a malformed record, an unknown kind or an origin
// outside [-1, size). The text is cut at transport::kMaxAbortText.
std::optional<transport::Failure> decodeAbortRecord(const std::string& value, int size);

}  // namespace shoal::comm
