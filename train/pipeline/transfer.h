// Activations and gradients between neighbouring virtual stages, over the pipeline group's
// non-blocking point-to-point (comm/collectives.h: shared memory on one host, TCP across).
//
// Each transfer is two messages on the same (peer, boundary, direction): a fixed header
// (step, micro-batch, dtype, shape) on one tag and the tensor's bytes on another. The receiver
// posts every header receive of a step when the step begins, so a sender never waits for its
// peer to reach the matching action; it posts the payload receive once the header arrived and
// checked out, sized from the checked header. Nothing read from the wire is used before it is
// checked: the step and micro-batch must be the ones expected, the dtype known, the rank and
// dimensions within limits, the size at most Options::maxBytes, and the dimensions after the
// batch dimension those of the plan (train/pipeline/plan.h).
//
// Tags: (boundary * 2 + direction) * 2 + {0: header, 1: payload}; boundaries and directions are
// independent channels, so interleaved schedules that cross the same pair of ranks several
// times per micro-batch never confuse their messages.
//
// Threading: one training thread. Blocking: recv() waits for its message, bounded by the
// group's timeout; send() never blocks (the tensor is kept alive until its send completed).
// Errors: what the engine throws (PeerError, TimeoutError naming ranks of the pipeline group),
// MismatchError for a message that is not the one expected (naming step, micro-batch, shapes),
// ProtocolError for a header out of bounds.
#pragma once

#include <torch/torch.h>

#include <array>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "comm/group.h"
#include "comm/work.h"
#include "train/pipeline/schedule.h"

namespace shoal::train::pipeline {

// What crosses one boundary: the dimensions after the batch dimension and the element type.
struct BoundarySpec {
  std::vector<int64_t> sampleShape;
  torch::ScalarType dtype = torch::kFloat32;
};

// The number a header or a plan gives a torch type that may cross stages (float32, float64,
// float16, bfloat16, int32, int64, uint8), and back (nothing for a number out of range).
// InvalidArgument for another type.
int64_t wireType(torch::ScalarType t);
std::optional<torch::ScalarType> fromWireType(int64_t index);

class Transfers {
 public:
  struct Options {
    size_t maxBytes = size_t{1} << 32;  // one message's payload at most
  };
  // `boundaries[b]`: what crosses boundary b (activation and gradient alike).
  Transfers(std::shared_ptr<comm::Group> pipe, const Schedule& schedule,
            std::vector<BoundarySpec> boundaries, Options options);
  // Returns at once: buffers still posted stay alive with their operations (abandon()).
  ~Transfers();
  Transfers(const Transfers&) = delete;
  Transfers& operator=(const Transfers&) = delete;

  // Posts the header receives of every receive action in `list` (this rank's actions for
  // `step`, which must stay alive until endStep()).
  void beginStep(int64_t step, const std::vector<Action>& list);
  // Posts `tensor` (made contiguous, kept alive until sent) for the transfer `action`.
  void send(const Action& action, const torch::Tensor& tensor);
  // The tensor of the receive `action`, blocking until it arrived and was checked.
  torch::Tensor recv(const Action& action);
  // Waits for every send of the step to be handed to the transport (rethrows a failure).
  void endStep();
  // Drops what is in flight after a failure (the group is failed; nothing is waited for).
  void abandon();

  // The point-to-point tag of a transfer across `boundary`.
  static int tag(int boundary, bool gradient, bool payload) {
    return (boundary * 2 + (gradient ? 1 : 0)) * 2 + (payload ? 1 : 0);
  }

 private:
  static constexpr int kMaxDims = 8;
  // magic, step, micro-batch, dtype, ndim, dims[kMaxDims]
  using Header = std::array<int64_t, 5 + kMaxDims>;
  struct PendingHeader {
    Action action;
    std::shared_ptr<Header> header;
    std::shared_ptr<comm::Work> work;
  };
  struct PendingSend {
    torch::Tensor tensor;
    std::shared_ptr<Header> header;
    std::shared_ptr<comm::Work> headerWork, payloadWork;
  };
  static bool isGradient(ActionKind k) {
    return k == ActionKind::kSendGradient || k == ActionKind::kRecvGradient;
  }
  void checkShape(const Action& action, const char* what, int boundary, int64_t microBatch,
                  const std::vector<int64_t>& shape, torch::ScalarType dtype) const;

  std::shared_ptr<comm::Group> pipe_;
  const Schedule& schedule_;
  std::vector<BoundarySpec> boundaries_;
  Options options_;
  int rank_;
  int64_t step_ = 0;
  // Per receive channel (tag), the header receives posted for this step, in list order.
  std::map<int, std::deque<PendingHeader>> headers_;
  std::vector<PendingSend> sends_;
};

}  // namespace shoal::train::pipeline
