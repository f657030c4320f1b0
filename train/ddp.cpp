#include "train/ddp.h"

#include <algorithm>
#include <sstream>

#include "comm/collectives.h"
#include "common/error.h"
#include "train/tensor_types.h"

namespace shoal::train {

namespace {

std::string describeParam(const std::string& name, const torch::Tensor& t) {
  std::ostringstream s;
  s << name << " " << t.sizes() << " " << t.dtype();
  return s.str();
}

std::vector<std::string> splitLines(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

// Rank 0's string on every rank.
std::string broadcastString(comm::Group& g, std::string s) {
  int64_t len = static_cast<int64_t>(s.size());
  comm::broadcast(g, &len, 1, DataType::kInt64, 0);
  s.resize(static_cast<size_t>(len));
  comm::broadcast(g, s.data(), s.size(), DataType::kUInt8, 0);
  return s;
}

}  // namespace

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<torch::nn::Module> module,
                                                 std::shared_ptr<comm::Group> group,
                                                 DdpOptions options)
    : module_(std::move(module)),
      group_(std::move(group)),
      options_(options),
      alive_(std::make_shared<bool>(true)) {
  SHOAL_CHECK(module_ && group_, "DistributedDataParallel needs a module and a group");
  SHOAL_CHECK(options_.bucketBytes > 0 && options_.firstBucketBytes > 0,
              "DistributedDataParallel: bucket sizes must be positive");
  for (auto& item : module_->named_parameters(/*recurse=*/true)) {
    if (!item.value().requires_grad()) continue;
    names_.push_back(item.key());
    params_.push_back(item.value());
  }
  if (group_->size() == 1) return;  // a world of one: nothing to check, move or hook

  checkSameParameters();
  std::vector<torch::Tensor> state(params_.begin(), params_.end());
  for (auto& b : module_->buffers(/*recurse=*/true)) state.push_back(b);
  broadcastFromRankZero(state);

  std::vector<size_t> order(params_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = order.size() - 1 - i;
  buildBuckets(order);
  resetIteration();

  std::weak_ptr<bool> alive = alive_;
  for (size_t i = 0; i < params_.size(); ++i) {
    params_[i].register_hook([this, alive, i](const torch::Tensor& grad) {
      if (alive.lock()) onGradient(i, grad);
    });
  }
}

DistributedDataParallel::~DistributedDataParallel() {
  alive_.reset();
  // Buffers of in-flight all-reduces belong to them until they finish.
  for (auto& b : buckets_) {
    if (!b.work) continue;
    try {
      b.work->wait();
    } catch (const std::exception&) {
    }
  }
}

void DistributedDataParallel::checkSameParameters() {
  std::string mine;
  for (size_t i = 0; i < params_.size(); ++i) mine += describeParam(names_[i], params_[i]) + "\n";
  for (auto& b : module_->named_buffers(true)) {
    mine += describeParam("buffer " + b.key(), b.value()) + "\n";
  }
  const std::string reference = broadcastString(*group_, mine);
  std::string difference;
  if (mine != reference) {
    auto a = splitLines(mine), b = splitLines(reference);
    size_t i = 0;
    while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
    difference = fmt::format("rank {} has {} where rank 0 has {}", group_->rank(),
                             i < a.size() ? "'" + a[i] + "'" : "no more parameters",
                             i < b.size() ? "'" + b[i] + "'" : "no more parameters");
  }
  // Every rank learns every difference, so every rank fails with the same message.
  int64_t len = static_cast<int64_t>(difference.size());
  comm::allreduce(*group_, &len, 1, DataType::kInt64, ReduceOp::kMax);
  if (len == 0) return;
  std::string mineFixed = difference;
  mineFixed.resize(static_cast<size_t>(len), '\0');
  std::string all(static_cast<size_t>(len) * group_->size(), '\0');
  comm::allgather(*group_, mineFixed.data(), all.data(), static_cast<size_t>(len),
                  DataType::kUInt8);
  for (int r = 0; r < group_->size(); ++r) {
    std::string d = all.substr(static_cast<size_t>(r * len), static_cast<size_t>(len));
    d = d.substr(0, d.find('\0'));
    if (!d.empty()) {
      SHOAL_THROW(MismatchError,
                  "rank {}: DistributedDataParallel: the ranks registered different parameters: {}",
                  group_->rank(), d);
    }
  }
}

void DistributedDataParallel::broadcastFromRankZero(const std::vector<torch::Tensor>& tensors) {
  torch::NoGradGuard noGrad;
  // One broadcast per dtype: a flat copy of all tensors of that type.
  std::vector<torch::ScalarType> types;
  for (auto& t : tensors) {
    if (std::find(types.begin(), types.end(), t.scalar_type()) == types.end()) {
      types.push_back(t.scalar_type());
    }
  }
  for (auto type : types) {
    std::vector<torch::Tensor> parts;
    for (auto& t : tensors) {
      if (t.scalar_type() == type) parts.push_back(t.reshape(-1));
    }
    auto flat = torch::cat(parts).contiguous();
    comm::broadcast(*group_, flat.data_ptr(), static_cast<size_t>(flat.numel()), toShoalType(type),
                    0);
    int64_t at = 0;
    for (auto& t : tensors) {
      if (t.scalar_type() != type) continue;
      t.copy_(flat.narrow(0, at, t.numel()).view_as(t));
      at += t.numel();
    }
  }
}

void DistributedDataParallel::buildBuckets(const std::vector<size_t>& order) {
  buckets_.clear();
  bucketOf_.assign(params_.size(), 0);
  slotOf_.assign(params_.size(), 0);
  std::vector<std::vector<size_t>> groups;
  std::vector<size_t> bytes;
  for (size_t i : order) {
    const auto& p = params_[i];
    const size_t pb = static_cast<size_t>(p.numel()) * p.element_size();
    // The first bucket is small, so the first all-reduce starts early in backward.
    const size_t cap = groups.size() == 1 ? options_.firstBucketBytes : options_.bucketBytes;
    const bool startNew = groups.empty() ||
                          params_[groups.back().front()].scalar_type() != p.scalar_type() ||
                          bytes.back() + pb > cap;
    if (startNew) {
      groups.emplace_back();
      bytes.push_back(0);
    }
    groups.back().push_back(i);
    bytes.back() += pb;
  }
  for (auto& g : groups) {
    Bucket b;
    int64_t total = 0;
    for (size_t i : g) {
      bucketOf_[i] = buckets_.size();
      slotOf_[i] = b.params.size();
      b.params.push_back(i);
      b.offsets.push_back(total);
      total += params_[i].numel();
    }
    b.flat = torch::zeros({total}, params_[g.front()].options().requires_grad(false));
    buckets_.push_back(std::move(b));
  }
}

std::vector<std::vector<size_t>> DistributedDataParallel::bucketLayout() const {
  std::vector<std::vector<size_t>> out;
  for (auto& b : buckets_) out.push_back(b.params);
  return out;
}

void DistributedDataParallel::resetIteration() {
  ready_.assign(params_.size(), 0);
  for (auto& b : buckets_) {
    b.pending = b.params.size();
    b.launched = false;
    b.work.reset();
  }
  nextToLaunch_ = 0;
}

void DistributedDataParallel::beforeForward() {
  if (group_->size() == 1 || !options_.broadcastBuffers) return;
  auto buffers = module_->buffers(true);
  if (!buffers.empty()) broadcastFromRankZero(buffers);
}

void DistributedDataParallel::onGradient(size_t i, const torch::Tensor& grad) {
  if (!sync_) return;  // accumulating locally (noSync)
  torch::NoGradGuard noGrad;
  Bucket& b = buckets_[bucketOf_[i]];
  auto slot = b.flat.narrow(0, b.offsets[slotOf_[i]], params_[i].numel());
  if (ready_[i]) {
    // A second backward before the gradients were synchronized: the bucket may already be on
    // the wire, so adding to it would race with the all-reduce.
    SHOAL_THROW(InvalidArgument,
                "rank {}: DistributedDataParallel: parameter '{}' got a second gradient before "
                "the first was synchronized; call backward() once per step (accumulate with "
                "noSync())",
                group_->rank(), names_[i]);
  }
  slot.copy_(grad.reshape(-1));
  // What earlier noSync backwards accumulated: autograd adds `grad` to it after this hook.
  const auto& accumulated = params_[i].grad();
  if (accumulated.defined()) slot.add_(accumulated.reshape(-1));
  ready_[i] = 1;
  if (!rebuilt_) readyOrder_.push_back(i);
  if (--b.pending == 0 && options_.overlap) launchReadyBuckets();
}

void DistributedDataParallel::launchReadyBuckets() {
  // In bucket order on every rank, whatever order they filled in: collectives match by order.
  while (nextToLaunch_ < buckets_.size() && buckets_[nextToLaunch_].pending == 0) {
    launch(buckets_[nextToLaunch_++]);
  }
}

void DistributedDataParallel::launch(Bucket& b) {
  b.work = comm::allreduceAsync(*group_, b.flat.data_ptr(), static_cast<size_t>(b.flat.numel()),
                                toShoalType(b.flat.scalar_type()), ReduceOp::kAvg);
  b.launched = true;
}

void DistributedDataParallel::backward(const torch::Tensor& loss) {
  loss.backward();
  finishGradientSync();
}

void DistributedDataParallel::finishGradientSync() {
  if (!sync_ || group_->size() == 1) return;
  torch::NoGradGuard noGrad;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (ready_[i]) continue;
    if (!options_.findUnusedParameters) {
      // Let what already started finish (its buffers are ours), then name the parameter.
      for (auto& b : buckets_) {
        if (b.work) {
          try {
            b.work->wait();
          } catch (const std::exception&) {
          }
        }
      }
      resetIteration();
      SHOAL_THROW(InvalidArgument,
                  "rank {}: DistributedDataParallel: parameter '{}' got no gradient in this "
                  "backward (not used to compute the loss). If that is intended, construct with "
                  "DdpOptions::findUnusedParameters = true",
                  group_->rank(), names_[i]);
    }
    Bucket& b = buckets_[bucketOf_[i]];
    auto slot = b.flat.narrow(0, b.offsets[slotOf_[i]], params_[i].numel());
    const auto& accumulated = params_[i].grad();
    if (accumulated.defined()) {
      slot.copy_(accumulated.reshape(-1));
    } else {
      slot.zero_();
    }
    ready_[i] = 1;
    --b.pending;
  }
  launchReadyBuckets();
  for (auto& b : buckets_) {
    b.work->wait();
    for (size_t k = 0; k < b.params.size(); ++k) {
      auto& p = params_[b.params[k]];
      auto averaged = b.flat.narrow(0, b.offsets[k], p.numel()).view_as(p);
      if (p.grad().defined()) {
        p.mutable_grad().copy_(averaged);
      } else {
        p.mutable_grad() = averaged.clone();
      }
    }
  }
  if (!rebuilt_) {
    // Rank 0's actual order (parameters that never got a gradient last), for every rank.
    std::vector<int64_t> order(readyOrder_.begin(), readyOrder_.end());
    for (size_t i = params_.size(); i-- > 0;) {
      if (std::find(readyOrder_.begin(), readyOrder_.end(), i) == readyOrder_.end()) {
        order.push_back(static_cast<int64_t>(i));
      }
    }
    comm::broadcast(*group_, order.data(), order.size(), DataType::kInt64, 0);
    buildBuckets(std::vector<size_t>(order.begin(), order.end()));
    rebuilt_ = true;
  }
  resetIteration();
}

}  // namespace shoal::train
