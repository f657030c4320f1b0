// What a native algorithm sees while it runs: the frame template of its operation, the
// deadline, and builders for the transfers it hands to the endpoint.
//
// Threading: used by the thread running the operation only; lives as long as the operation.
#pragma once

#include <vector>

#include "common/deadline.h"
#include "transport/endpoint.h"
#include "transport/frame.h"

namespace shoal::comm {

class NativeEngine;

class OpContext {
 public:
  OpContext(NativeEngine& engine, transport::FrameHeader base, const Deadline& deadline);

  int rank() const;
  int size() const;
  const transport::FrameHeader& base() const { return base_; }
  void setAlgorithm(uint8_t algo) { base_.algo = algo; }
  const Deadline& deadline() const { return deadline_; }

  transport::FrameHeader header(uint32_t step, uint64_t bytes) const;

  // Runs a batch (see transport::Endpoint::run). A batch blocked for a while says so in the
  // group's store, for the timeout report of whichever rank gives up first.
  void run(std::vector<transport::Transfer>& batch);

  // Builders for batch entries; `step` must be computed identically by sender and receiver.
  transport::Transfer send(int peer, uint32_t step, const void* data, size_t bytes) const;
  // Only the first *ready bytes may go so far (transport::Transfer::sendAsReady).
  transport::Transfer sendAsReady(int peer, uint32_t step, const void* data, size_t bytes,
                                  const size_t* ready) const;
  transport::Transfer recv(int peer, uint32_t step, void* data, size_t bytes) const;
  transport::Transfer recvReduce(int peer, uint32_t step, void* data, size_t bytes) const;
  // The receive-reduce after which the elements it covers hold their reduction over every
  // rank: for kAvg it also divides by size() in the same pass (Note [Average in the last
  // step] in comm/native/algorithms.h); for other ops it is recvReduce.
  transport::Transfer recvReduceFinal(int peer, uint32_t step, void* data, size_t bytes) const;
  // The payload goes to `handler` piece by piece as it arrives (transport::PieceHandler).
  transport::Transfer recvApply(int peer, uint32_t step, size_t bytes,
                                transport::PieceHandler handler) const;

  NativeEngine& engine() { return engine_; }

 private:
  NativeEngine& engine_;
  transport::FrameHeader base_;
  const Deadline& deadline_;
};

}  // namespace shoal::comm
