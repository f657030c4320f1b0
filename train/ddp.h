// Data parallelism for any torch::nn::Module: every rank holds a replica, computes gradients on
// its own shard of the batch, and the gradients are averaged across ranks while backward is
// still running.
//
//   shoal::train::DistributedDataParallel ddp(model, world.group);
//   for (...) {
//     optimizer.zero_grad();
//     ddp.beforeForward();              // buffers (BatchNorm statistics) from rank 0
//     auto loss = loss_fn(model->forward(x), y);
//     ddp.backward(loss);               // backward; buckets all-reduce as they fill
//     optimizer.step();                 // gradients are the average over ranks
//   }
//
// How: at construction every rank checks that all ranks registered the same parameters (names,
// shapes, dtypes; MismatchError naming the first difference, on every rank) and takes rank 0's
// parameters and buffers. The gradients are then the reducer's (train/ddp/reducer.h): it
// groups them into buckets (default 25 MiB, the first one 1 MiB so communication starts early)
// in reverse registration order, roughly the order backward produces them; each parameter's
// .grad becomes a view into its bucket (Note [Gradients as bucket views]), so backward
// accumulates straight into the bucket. When a bucket is complete its communication hook
// (train/ddp/comm_hook.h; default: one average all-reduce, the division done by the
// collective) starts while backward goes on. Buckets start in bucket order on every rank
// (collectives match by order). After the first iteration the buckets are rebuilt in the order
// gradients actually became ready on rank 0, broadcast so every rank agrees.
//
// Errors: a failed collective (TimeoutError, PeerError, MismatchError, ...) or whatever the
// hook throws reaches the caller of backward() / finishGradientSync() unchanged, after the
// communication still in flight has been waited for; DDP is then ready for a next iteration
// (which will fail again if the group was aborted).
//
// With one rank nothing is checked, moved or hooked, and the hook is not called: backward() is
// plain loss.backward() and beforeForward() returns at once.
//
// Buffers: the module's buffers at construction are the ones broadcast before each forward,
// packed into one byte buffer kept across steps (Note [One broadcast for the buffers] in
// ddp.cpp). Their values may change freely (in place, or load() into them); a buffer whose
// size changes afterwards is an InvalidArgument naming it.
//
// Threading: one training thread per rank. Not copyable. The module must outlive this object;
// the hooks it registers stay on the parameters but do nothing once it is destroyed.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "comm/group.h"
#include "train/ddp/comm_hook.h"
#include "train/ddp/reducer.h"

namespace shoal::train {

struct DdpOptions {
  size_t bucketBytes = 25u << 20;
  size_t firstBucketBytes = 1u << 20;
  // Start each bucket's all-reduce from the hooks during backward; false: all after backward.
  bool overlap = true;
  // Parameters that get no gradient in an iteration contribute zeros (and still get the
  // others' average). Off: such a parameter is an error that names it.
  bool findUnusedParameters = false;
  // Copy rank 0's buffers (BatchNorm running statistics) to every rank before each forward:
  // one broadcast per step, whatever their number and dtypes.
  bool broadcastBuffers = true;
  // What is done to each complete bucket; null means the default, ddp::averageAllreduce().
  // Shared: the hook may be shared by several DDP instances only if it keeps no state of its
  // own beyond the per-bucket BucketState.
  std::shared_ptr<ddp::CommHook> commHook;
};

class DistributedDataParallel {
 public:
  DistributedDataParallel(std::shared_ptr<torch::nn::Module> module,
                          std::shared_ptr<comm::Group> group, DdpOptions options = {});
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  // Call before each forward: broadcasts buffers (if enabled), blocking, bounded by the group's
  // timeout. Throws the broadcast's error, or InvalidArgument if a buffer changed size.
  void beforeForward();

  // loss.backward(), then finishGradientSync(): afterwards every parameter's .grad (a view into
  // its bucket) holds the hook's result, by default the average over ranks. Inside a noSync()
  // scope: only backward. Blocking, bounded by the group's timeout. Throws what backward or the
  // communication threw (see Errors above).
  void backward(const torch::Tensor& loss);

  // For callers that run backward themselves: starts the buckets not started yet and waits for
  // all of them (no-op inside noSync()). backward() calls it. Throws as backward().
  void finishGradientSync();

  // Gradient accumulation: while the returned guard lives, backward only accumulates into
  // .grad locally; the next synchronized backward averages the accumulated sum.
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(DistributedDataParallel& d) : d_(d) { d_.setSync(false); }
    ~NoSyncGuard() { d_.setSync(true); }
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    DistributedDataParallel& d_;
  };
  NoSyncGuard noSync() { return NoSyncGuard(*this); }

  // The current bucket layout: parameter indices (registration order) per bucket; empty with
  // one rank.
  std::vector<std::vector<size_t>> bucketLayout() const;
  // Bucket b's flat gradient buffer (the .grad views point into it). With more than one rank.
  const torch::Tensor& bucketBuffer(size_t b) const;
  // Between iterations: the buckets in `order` (parameter indices in launch order, as the
  // concatenated bucketLayout() of a job that ran), without the rebuild after the first
  // iteration (ddp::Reducer::adoptOrder). A resumed job so encodes the buckets of the job that
  // saved it. No-op with one rank; InvalidArgument unless `order` is a permutation.
  void adoptBucketOrder(const std::vector<size_t>& order);
  // The hook the buckets go through (DdpOptions::commHook, or the default); null with one rank.
  ddp::CommHook* commHook();
  comm::Group& group() { return *group_; }

  // Where this rank's DDP time went since construction (zeros with one rank): to tell
  // computation from communication in a benchmark. Two clock reads per call measured.
  struct Stats {
    int64_t steps = 0;         // synchronized iterations finished
    double bufferSeconds = 0;  // in beforeForward(): the buffer broadcast
    double finishSeconds = 0;  // in finishGradientSync(): the last buckets' start, the
                               // wait for every bucket, the hook's finish()
    uint64_t bytesSent = 0;    // by this rank in the group since construction (every
                               // operation on the group, checks and buffers included; 0 on MPI)
    // When the last synchronized finishGradientSync() began and ended: the caller's thread
    // waited for the buckets then (the Trainer's step-time breakdown); {} before the first.
    comm::TimeSpan lastFinish;
  };
  Stats stats() const;

 private:
  void setSync(bool sync);
  void packBuffers();
  // reducer_->finish(), its span noted in lastFinish_ when it synchronizes.
  void finishTimed();

  std::shared_ptr<torch::nn::Module> module_;
  std::shared_ptr<comm::Group> group_;
  DdpOptions options_;
  std::vector<torch::Tensor> params_;
  std::vector<std::string> names_;
  std::unique_ptr<ddp::Reducer> reducer_;  // null with one rank
  bool sync_ = true;
  uint64_t bytesAtStart_ = 0;

  // Note [One broadcast for the buffers]: each buffer's bytes at `offset` in packedBuffers_.
  struct BufferSlot {
    std::string name;
    torch::Tensor tensor;
    size_t offset = 0;
    size_t bytes = 0;
  };
  std::vector<BufferSlot> buffers_;  // empty with one rank or broadcastBuffers off
  std::vector<uint8_t> packedBuffers_;
  double bufferSeconds_ = 0;
  comm::TimeSpan lastFinish_;
};

}  // namespace shoal::train
