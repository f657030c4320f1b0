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
// parameters and buffers. Gradients are assigned to buckets (default 25 MiB, the first one
// 1 MiB so communication starts early) in reverse registration order, which is roughly the
// order backward produces them. A hook on each parameter copies its gradient into its bucket;
// when a bucket is complete its all-reduce (average) starts on the group's async API while
// backward goes on. Buckets start in bucket order on every rank (collectives match by order).
// After the first iteration the buckets are rebuilt in the order gradients actually became
// ready on rank 0, broadcast so every rank agrees.
//
// Threading: one training thread per rank. Not copyable. The module must outlive this object;
// the hooks it registers stay on the parameters but do nothing once it is destroyed.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "comm/group.h"

namespace shoal::train {

struct DdpOptions {
  size_t bucketBytes = 25u << 20;
  size_t firstBucketBytes = 1u << 20;
  // Start each bucket's all-reduce from the hooks during backward; false: all after backward.
  bool overlap = true;
  // Parameters that get no gradient in an iteration contribute zeros (and still get the
  // others' average). Off: such a parameter is an error that names it.
  bool findUnusedParameters = false;
  // Copy rank 0's buffers (BatchNorm running statistics) to every rank before each forward.
  bool broadcastBuffers = true;
};

class DistributedDataParallel {
 public:
  DistributedDataParallel(std::shared_ptr<torch::nn::Module> module,
                          std::shared_ptr<comm::Group> group, DdpOptions options = {});
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  // Call before each forward: broadcasts buffers (if enabled).
  void beforeForward();

  // loss.backward(), then waits for the gradient all-reduces still in flight and writes the
  // averaged gradients into the parameters' .grad. Inside a noSync() scope: only backward.
  void backward(const torch::Tensor& loss);

  // For callers that run backward themselves: waits for what is still in flight (no-op inside
  // noSync()). backward() calls it.
  void finishGradientSync();

  // Gradient accumulation: while the returned guard lives, backward only accumulates into
  // .grad locally; the next synchronized backward averages the accumulated sum.
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(DistributedDataParallel& d) : d_(d) { d_.sync_ = false; }
    ~NoSyncGuard() { d_.sync_ = true; }
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    DistributedDataParallel& d_;
  };
  NoSyncGuard noSync() { return NoSyncGuard(*this); }

  // The current bucket layout: parameter indices (registration order) per bucket.
  std::vector<std::vector<size_t>> bucketLayout() const;
  comm::Group& group() { return *group_; }

 private:
  struct Bucket {
    torch::Tensor flat;
    std::vector<size_t> params;  // indices into params_
    std::vector<int64_t> offsets;
    size_t pending = 0;
    bool launched = false;
    std::shared_ptr<comm::Work> work;
  };

  void checkSameParameters();
  void broadcastFromRankZero(const std::vector<torch::Tensor>& tensors);
  void buildBuckets(const std::vector<size_t>& order);
  void onGradient(size_t param, const torch::Tensor& grad);
  void launchReadyBuckets();
  void launch(Bucket& b);
  void resetIteration();

  std::shared_ptr<torch::nn::Module> module_;
  std::shared_ptr<comm::Group> group_;
  DdpOptions options_;
  std::vector<torch::Tensor> params_;
  std::vector<std::string> names_;
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucketOf_;    // param -> bucket
  std::vector<size_t> slotOf_;      // param -> position in its bucket
  std::vector<char> ready_;         // per param, this iteration
  std::vector<size_t> readyOrder_;  // first iteration's order, for the rebuild
  size_t nextToLaunch_ = 0;
  bool sync_ = true;
  bool rebuilt_ = false;
  bool inBackward_ = false;
  std::shared_ptr<bool> alive_;  // the hooks hold it weakly
};

}  // namespace shoal::train
