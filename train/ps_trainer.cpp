#include "train/ps_trainer.h"

#include <cstring>

#include "common/error.h"

namespace shoal::train {

namespace {

std::vector<int64_t> shapeOf(const torch::Tensor& t) {
  return std::vector<int64_t>(t.sizes().begin(), t.sizes().end());
}

}  // namespace

PsTrainer::PsTrainer(comm::Group& world, int worker, int numWorkers, int numServers,
                     torch::nn::Module& model, const ps::TrainingConfig& config,
                     const ps::ClientOptions& options) {
  std::vector<ps::KeySpec> keys;
  for (auto& p : model.named_parameters(true)) {
    if (p.value().scalar_type() != torch::kFloat32) {
      SHOAL_THROW(InvalidArgument,
                  "parameter '{}' is {}: parameter servers train float32 parameters", p.key(),
                  c10::toString(p.value().scalar_type()));
    }
    keys.push_back({p.key(), shapeOf(p.value()), DataType::kFloat32, ps::KeyKind::kParameter});
    tensors_.push_back(p.value());
  }
  parameters_ = tensors_.size();
  for (auto& b : model.named_buffers(true)) {
    if (b.value().scalar_type() != torch::kFloat32) continue;
    keys.push_back({b.key(), shapeOf(b.value()), DataType::kFloat32, ps::KeyKind::kState});
    tensors_.push_back(b.value());
  }
  client_ = std::make_unique<ps::Client>(world, worker, numWorkers, numServers, std::move(keys),
                                         config, options);
  const size_t n = client_->partition().totalElements();
  values_.assign(n, 0.0f);
  grads_.assign(n, 0.0f);
  if (client_->mustInitialize()) {
    size_t at = 0;
    for (auto& t : tensors_) {
      auto c = t.detach().contiguous();
      std::memcpy(values_.data() + at, c.data_ptr<float>(), c.numel() * sizeof(float));
      at += static_cast<size_t>(c.numel());
    }
    client_->initialize(values_.data());
  }
  refresh(startStep());
}

void PsTrainer::gather() {
  size_t at = 0;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const torch::Tensor& t = tensors_[i];
    const size_t n = static_cast<size_t>(t.numel());
    // Parameters send their gradient (zero if unused this step), state keys their value.
    torch::Tensor src = i < parameters_ ? t.grad() : t.detach();
    if (src.defined()) {
      auto c = src.contiguous();
      std::memcpy(grads_.data() + at, c.data_ptr<float>(), n * sizeof(float));
    } else {
      std::fill(grads_.begin() + static_cast<ptrdiff_t>(at),
                grads_.begin() + static_cast<ptrdiff_t>(at + n), 0.0f);
    }
    at += n;
  }
}

void PsTrainer::scatter() {
  torch::NoGradGuard noGrad;
  size_t at = 0;
  for (auto& t : tensors_) {
    t.copy_(torch::from_blob(values_.data() + at, t.sizes(), torch::kFloat32));
    at += static_cast<size_t>(t.numel());
  }
}

void PsTrainer::step(int64_t step) {
  gather();
  const ps::Traffic before = client_->traffic();
  client_->pushPull(grads_.data(), values_.data(), step)->wait();
  const ps::Traffic after = client_->traffic();
  lastStep_ = {after.pushes - before.pushes, after.pushedBytes - before.pushedBytes,
               after.pulls - before.pulls, after.pulledBytes - before.pulledBytes};
  scatter();
}

void PsTrainer::refresh(int64_t step) {
  client_->pull(values_.data(), step)->wait();
  scatter();
}

}  // namespace shoal::train
