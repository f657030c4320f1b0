// One server's part of the model: values, optimizer state and one receive slot per worker, with
// the update rules of the consistency modes. Not thread-safe: the server serializes calls
// (ps/server_state.h), except that each worker's slot is written only by that worker's thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ps/config.h"
#include "ps/partition.h"

namespace shoal::ps {

class Shard {
 public:
  Shard(const Partition& partition, int server, int workers, const TrainingConfig& config);

  size_t elements() const { return values_.size(); }
  size_t begin() const { return begin_; }  // flat index of element 0
  float* values() { return values_.data(); }
  // Worker w's receive buffer, as large as the shard.
  float* slot(int worker) { return slots_.at(worker).data(); }

  size_t pieceCount() const { return pieces_.size(); }
  const Piece& piece(size_t i) const { return pieces_[i].piece; }
  size_t localOffset(size_t i) const { return pieces_[i].piece.flat - begin_; }
  // Updates applied to piece i (synchronous: completed steps).
  uint64_t version(size_t i) const { return pieces_[i].version; }
  bool hasArrived(size_t i, int worker) const { return pieces_[i].arrived[worker] != 0; }

  // Synchronous: worker w's slot holds its contribution to pieces [first, last) for their
  // current step. Each piece whose every worker has now arrived is reduced in worker order
  // (bitwise reproducible), averaged and applied. Returns true if a step completed.
  bool arrive(int worker, size_t first, size_t last);
  // Asynchronous / SSP: applies worker w's slot to pieces [first, last) now; `step` is the
  // worker's step (for the learning-rate schedule).
  void applyNow(int worker, size_t first, size_t last, int64_t step);

  // Note [Update from the ring]: a push applied part by part as it arrives (straight out of
  // the transport's receive ring, transport::PieceHandler), not first copied into the worker's
  // slot. The results are bit-identical to arrive() / applyNow() on the whole payload however
  // the payload is cut: the kernels are elementwise and the sum over workers keeps worker order.
  //
  // Synchronous: whether worker w's push completes the current step of every piece in
  // [first, last) (every other worker's contribution is in its slot): only then can it be
  // applied as it arrives.
  bool completesStep(int worker, size_t first, size_t last) const;
  // Whether arrive(worker, first, last) would complete (and so apply) any piece's step.
  bool completesAnyStep(int worker, size_t first, size_t last) const;
  // The plan of one such push, made by beginIncoming() and used by applyIncoming() outside the
  // server's lock: it holds what the update needs, so the parts touch no bookkeeping.
  struct Incoming {
    struct Segment {
      size_t at = 0, count = 0;  // local elements
      double lr = 0;
      int64_t update = 0;  // the 1-based update number (Adam's bias correction)
      bool parameter = true;
    };
    int worker = 0;
    size_t first = 0, last = 0;
    size_t begin = 0;  // local offset of the payload's first element
    float scale = 1.0f;
    bool sum = false;  // synchronous with several workers: reduce the slots in worker order
    std::vector<Segment> segments;
    size_t cursor = 0;
  };
  // Plans worker w's push to pieces [first, last) (contiguous). Synchronous: completesStep()
  // must hold. Asynchronous: `step` is the worker's step (for the schedule). Reuses `in`.
  void beginIncoming(int worker, size_t first, size_t last, int64_t step, Incoming& in) const;
  // Applies elements [offset, offset + n) of the payload, `g` (parts in payload order).
  void applyIncoming(Incoming& in, const float* g, size_t offset, size_t n);
  // Once every part was applied: the versions (and the synchronous arrivals) move on.
  void endIncoming(const Incoming& in);

  // Serialized values, optimizer state, versions, plus the caller's round and clocks. Pending
  // synchronous contributions are not saved: resuming workers push that step again.
  std::string snapshot(const std::string& header, uint64_t round,
                       const std::vector<uint64_t>& clocks) const;
  // The header of a snapshot, read before a shard exists to restore it into (InvalidArgument
  // if the payload is too short to hold one). `source` names the file in errors.
  static std::string snapshotHeader(const std::string& payload,
                                    std::string_view source = "shard checkpoint");
  // Call before building a Shard from a snapshot's header: the header's keys size the shard
  // (values, optimizer state and one slot per worker), so a crafted header claiming 2^60
  // elements must be refused before that allocation. Throws InvalidArgument naming `source`
  // unless `payloadBytes` can hold this server's values and optimizer state.
  static void checkSnapshotFits(const Partition& partition, int server,
                                const TrainingConfig& config, size_t payloadBytes,
                                std::string_view source = "shard checkpoint");
  // Restores a snapshot written for the same partition; returns its header and fills round and
  // clocks. InvalidArgument naming `source` if it does not fit this shard; every count and
  // length in the payload is checked against the bytes left and this shard before use.
  std::string restore(const std::string& payload, uint64_t& round, std::vector<uint64_t>& clocks,
                      std::string_view source = "shard checkpoint");
  // Note [Resharding checkpoints] (ps/shard_restore.cpp): copies from `from`, a shard of the same
  // keys under another partition (another server count), the elements both hold: values and
  // optimizer state. Each of this shard's pieces that overlaps `from` takes the largest version
  // of the pieces of `from` it overlaps (equal in synchronous mode; asynchronous versions count
  // updates, which differ between servers, and only Adam's bias correction reads them). Returns
  // the number of elements copied. InvalidArgument if the optimizer state slots differ.
  size_t copyOverlap(const Shard& from);

 private:
  struct PieceState {
    Piece piece;
    bool parameter = true;
    uint64_t version = 0;
    int arrivals = 0;
    std::vector<char> arrived;
  };
  void update(bool parameter, int64_t updateNumber, const float* g, float scale, double lr,
              size_t at, size_t n);
  void update(PieceState& ps, const float* g, float scale, double lr, size_t at, size_t n) {
    update(ps.parameter, static_cast<int64_t>(ps.version) + 1, g, scale, lr, at, n);
  }

  TrainingConfig config_;
  int workers_;
  size_t begin_ = 0;
  std::vector<PieceState> pieces_;
  std::vector<float> values_;
  std::vector<float> state0_, state1_;
  std::vector<std::vector<float>> slots_;
  std::vector<float> sum_;  // synchronous reduction scratch
};

}  // namespace shoal::ps
