// Training a libtorch module through parameter servers (ps/): the servers hold the parameters
// and the optimizer state and apply the updates; this worker computes gradients.
//
// Keys: every parameter (float32) is a parameter key; every float32 buffer (BatchNorm running
// statistics) is a state key, so the servers keep (and checkpoint) it too; other buffers (the
// int64 batch counter) stay local. Construction connects to the servers; worker 0 of a fresh
// job uploads the initial values, and every worker then starts from the servers' values.
//
// Compression (ps::ClientOptions): pushed gradients may travel as fp16, bf16, top-k or 1-bit and
// the pulled parameters as fp16 (the module's copy then holds fp16-rounded values; the servers'
// master weights stay float32). lastStep() says how many payload bytes a step moved.
//
// Threading: one training thread; blocking calls, each bounded by the world timeout (see
// ps/client.h for the errors).
#pragma once

#include <torch/torch.h>

#include <memory>
#include <vector>

#include "comm/group.h"
#include "ps/client.h"
#include "ps/config.h"

namespace shoal::train {

class PsTrainer {
 public:
  PsTrainer(comm::Group& world, int worker, int numWorkers, int numServers,
            torch::nn::Module& model, const ps::TrainingConfig& config,
            const ps::ClientOptions& options = {});

  // The step to continue from (0 on a fresh job; the servers' checkpoint step on a resumed one).
  int64_t startStep() const { return client_->startStep(); }

  // After backward: pushes the gradients (and current buffers) as step `step`, and loads the
  // parameters for step + 1 into the module.
  void step(int64_t step);
  // Loads the servers' current values for `step` into the module (e.g. before evaluating).
  void refresh(int64_t step);
  // Goodbye to the servers (they end when every worker said it).
  void finish() { client_->finish(); }

  ps::Client& client() { return *client_; }
  // Payload bytes pushed and pulled by the last step() (one push-pull), and since construction.
  const ps::Traffic& lastStep() const { return lastStep_; }
  ps::Traffic traffic() const { return client_->traffic(); }

 private:
  void gather();
  void scatter();

  std::vector<torch::Tensor> tensors_;  // parameters then state buffers, in key order
  size_t parameters_ = 0;
  std::vector<float> values_, grads_;
  std::unique_ptr<ps::Client> client_;
  ps::Traffic lastStep_;
};

}  // namespace shoal::train
