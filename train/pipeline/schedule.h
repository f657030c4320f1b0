// Pipeline schedules as data: for each rank of a pipeline group, the ordered list of actions it
// performs in one training step (one global batch split into m micro-batches).
//
// A model is cut into p * v contiguous pieces, the virtual stages 0 .. p*v-1. Rank r holds v of
// them, its chunks: chunk c of rank r is virtual stage c * p + r (Megatron's interleaving; v = 1
// is the plain pipeline, chunk 0 of rank r is stage r). An activation crosses from virtual stage
// s to s + 1, its gradient from s + 1 back to s; both travel across "boundary s".
//
// One executor (train/pipeline/executor.h) runs any list; each schedule is a function that
// makes the lists (one file per schedule: gpipe.cpp, one_f_one_b.cpp, interleaved.cpp). Before
// running, check() simulates all ranks' lists together and refuses one that would deadlock,
// leaves a transfer unmatched, or computes something before its input exists.
//
// Semantics the lists are written (and checked) against:
// - Actions of one rank run in list order. A send never blocks (it is posted and completes in
//   the background). A receive blocks until the matching send was posted. Forward and backward
//   are local computation.
// - Forward(mb, c) needs its input: on virtual stage 0 the micro-batch itself, elsewhere an
//   earlier RecvActivation(mb, c) of the same rank. Backward(mb, c) needs Forward(mb, c) and,
//   except on the last virtual stage (where the loss is), an earlier RecvGradient(mb, c).
//   SendActivation(mb, c) needs Forward(mb, c) earlier; SendGradient(mb, c) needs
//   Backward(mb, c) earlier. Virtual stage 0 sends no gradient, the last sends no activation.
// - Transfers match per (boundary, direction) in order: the k-th SendActivation across boundary
//   s is the k-th RecvActivation across it; the micro-batch numbers must agree.
// - Every micro-batch runs forward and backward exactly once on every virtual stage.
//
// Pure data: no libtorch, no communication. Thread-compatible (values).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace shoal::train::pipeline {

enum class ActionKind : uint8_t {
  kForward,
  kBackward,
  kSendActivation,  // this chunk's output of micro-batch mb, to the next virtual stage
  kRecvActivation,  // this chunk's input of micro-batch mb, from the previous virtual stage
  kSendGradient,    // the gradient of this chunk's input, to the previous virtual stage
  kRecvGradient,    // the gradient of this chunk's output, from the next virtual stage
};

struct Action {
  ActionKind kind = ActionKind::kForward;
  int microBatch = 0;  // 0 .. m-1
  int chunk = 0;       // this rank's chunk the action belongs to, 0 .. v-1
  bool operator==(const Action&) const = default;
};

struct Schedule {
  std::string name;                        // "gpipe", "1f1b", "interleaved"
  int stages = 1;                          // p: ranks in the pipeline group
  int microBatches = 1;                    // m
  int chunks = 1;                          // v: chunks per rank
  std::vector<std::vector<Action>> ranks;  // ranks[r]: rank r's actions, in order

  int virtualStages() const { return stages * chunks; }
  // Virtual stage of `chunk` on `rank`, and back.
  int virtualStage(int rank, int chunk) const { return chunk * stages + rank; }
  int rankOf(int virtualStage) const { return virtualStage % stages; }
  int chunkOf(int virtualStage) const { return virtualStage / stages; }
  // For a transfer action of `rank`: the rank at the other end, and the boundary it crosses.
  // InvalidArgument for a Forward or Backward, or a transfer off either end of the pipeline.
  int peer(int rank, const Action& a) const;
  int boundary(int rank, const Action& a) const;
};

// For schedule writers: append to ranks[rank] Forward(mb, chunk) with the transfers the
// semantics ask around it (RecvActivation before unless virtual stage 0, SendActivation after
// unless the last virtual stage); Backward likewise (RecvGradient before unless the last,
// SendGradient after unless virtual stage 0).
void appendForward(Schedule& schedule, int rank, int microBatch, int chunk);
void appendBackward(Schedule& schedule, int rank, int microBatch, int chunk);

// All forwards of every micro-batch, then all backwards, both in micro-batch order (GPipe).
// Holds m micro-batches' activations per stage at the peak. v = 1.
Schedule gpipe(int stages, int microBatches);
// PipeDream-flush: rank r runs min(p - r - 1, m) warm-up forwards, then alternates one forward
// and one backward, then drains the remaining backwards. Holds at most p micro-batches (rank 0)
// at the peak. v = 1.
Schedule oneForwardOneBackward(int stages, int microBatches);
// Interleaved 1F1B with `chunks` virtual stages per rank (Megatron): the bubble shrinks by v at
// the price of v times more transfers. Any m >= 1 (not only multiples of p); the bubble is
// (p-1)/(v*m+p-1) for every m >= p (see interleaved.cpp for the ordering, and for m < p).
// With stages == 1 or chunks == 1 there is nothing to interleave: the result is 1F1B's lists
// with chunks == 1, so an executor must cut the model by the returned `chunks`, not the asked.
Schedule interleavedOneForwardOneBackward(int stages, int microBatches, int chunks);

// By name: "gpipe", "1f1b", "interleaved" (chunks used only by the last). InvalidArgument for
// an unknown name or stages, microBatches or chunks < 1 (naming the value).
Schedule makeSchedule(std::string_view name, int stages, int microBatches, int chunks = 1);

// Simulates every rank's list together under the semantics above. Returns normally if all
// lists run to the end; else throws InvalidArgument whose one-line message names the first
// stuck or invalid action ("rank 1 action 4 RecvGradient(mb 2, chunk 0): ..."): a receive no
// send matches (deadlock, or nothing sent), a cycle of receives waiting on each other, a send
// nobody receives, a computation before its input, a micro-batch computed twice or never, a
// chunk or micro-batch out of range, a list count different from `stages`.
// "First" is in simulation order: ranks take one action each in turn, rank 0 first. When ranks
// are stuck, the report follows the wait of the lowest stuck rank to its cause: a cycle, or a
// receive from a rank whose list ended.
void check(const Schedule& schedule);

// The largest number of micro-batches whose forward ran and whose backward has not yet, on
// `rank` (summed over its chunks), at any point of its list: what activation memory scales with.
int peakInFlight(const Schedule& schedule, int rank);

// Cost model of one step (bubble_model.cpp): every Forward takes forwardCost, every Backward
// backwardCost (the cost of one chunk, i.e. 1/v of the model's piece on the rank), a transfer
// arrives transferCost after its send, all ranks start at 0. Returns, per rank, the fraction of
// the step (until the last rank ends) it spends idle. Free transfers give (p-1)/(m+p-1) for
// GPipe and 1F1B and (p-1)/(v*m+p-1) for interleaved (m >= p). check()s the schedule first;
// InvalidArgument for costs that are negative, or forward + backward not positive.
std::vector<double> simulatedBubble(const Schedule& schedule, double forwardCost,
                                    double backwardCost, double transferCost = 0.0);

// "Forward(mb 3, chunk 1)" and the like, for messages and traces.
std::string describe(const Action& action);
std::string_view kindName(ActionKind kind);

}  // namespace shoal::train::pipeline
