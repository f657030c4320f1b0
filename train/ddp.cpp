#include "train/ddp.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <sstream>

#include "comm/collectives.h"
#include "common/error.h"
#include "train/replica_sync.h"
#include "train/tensor_types.h"

namespace shoal::train {

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<torch::nn::Module> module,
                                                 std::shared_ptr<comm::Group> group,
                                                 DdpOptions options)
    : module_(std::move(module)), group_(std::move(group)), options_(std::move(options)) {
  SHOAL_CHECK(module_ && group_, "DistributedDataParallel needs a module and a group");
  bytesAtStart_ = group_->bytesSent();
  SHOAL_CHECK(options_.bucketBytes > 0 && options_.firstBucketBytes > 0,
              "DistributedDataParallel: bucket sizes must be positive");
  for (auto& item : module_->named_parameters(/*recurse=*/true)) {
    if (!item.value().requires_grad()) continue;
    names_.push_back(item.key());
    params_.push_back(item.value());
  }
  if (group_->size() == 1) return;  // a world of one: nothing to check, move or hook

  checkSameParameters(*group_, names_, params_, *module_, "DistributedDataParallel");
  std::vector<torch::Tensor> state(params_.begin(), params_.end());
  for (auto& b : module_->buffers(/*recurse=*/true)) state.push_back(b);
  broadcastFromRankZero(*group_, state);
  if (options_.broadcastBuffers) packBuffers();

  ddp::ReducerOptions r;
  r.bucketBytes = options_.bucketBytes;
  r.firstBucketBytes = options_.firstBucketBytes;
  r.overlap = options_.overlap;
  r.findUnusedParameters = options_.findUnusedParameters;
  reducer_ = std::make_unique<ddp::Reducer>(
      params_, names_, group_, r, options_.commHook ? options_.commHook : ddp::averageAllreduce());
}

DistributedDataParallel::~DistributedDataParallel() = default;

std::vector<std::vector<size_t>> DistributedDataParallel::bucketLayout() const {
  return reducer_ ? reducer_->bucketLayout() : std::vector<std::vector<size_t>>{};
}

void DistributedDataParallel::adoptBucketOrder(const std::vector<size_t>& order) {
  if (reducer_) reducer_->adoptOrder(order);
}

ddp::CommHook* DistributedDataParallel::commHook() {
  return reducer_ ? &reducer_->hook() : nullptr;
}

const torch::Tensor& DistributedDataParallel::bucketBuffer(size_t b) const {
  SHOAL_CHECK(reducer_, "DistributedDataParallel: a world of one has no buckets");
  return reducer_->bucketBuffer(b);
}

void DistributedDataParallel::setSync(bool sync) {
  sync_ = sync;
  if (reducer_) reducer_->setSync(sync);
}

// Note [One broadcast for the buffers]
// beforeForward() runs every step, and a step of a small model is a few milliseconds, so the
// buffer broadcast is laid out once at construction: every buffer's bytes end to end in one
// byte buffer that lives as long as DDP. Each step rank 0 copies its buffers in, one broadcast
// of bytes carries them all whatever their dtypes (BatchNorm's float statistics and int64
// counter alike), and the other ranks copy them out: no module traversal, no concatenation, no
// allocation, and one synchronization instead of one per dtype.
void DistributedDataParallel::packBuffers() {
  size_t at = 0;
  for (auto& item : module_->named_buffers(/*recurse=*/true)) {
    const auto& t = item.value();
    SHOAL_CHECK(t.device().is_cpu(), "DistributedDataParallel: buffer '{}' is not on the CPU",
                item.key());
    const size_t bytes = static_cast<size_t>(t.numel()) * t.element_size();
    buffers_.push_back({item.key(), t, at, bytes});
    at += bytes;
  }
  packedBuffers_.resize(at);
}

namespace {

// The bytes of `t`, in its logical order, to or from `bytes`.
void copyBytes(const torch::Tensor& t, uint8_t* bytes, bool toTensor) {
  if (t.is_contiguous()) {
    const size_t n = static_cast<size_t>(t.numel()) * t.element_size();
    if (n == 0) return;
    if (toTensor) {
      std::memcpy(t.data_ptr(), bytes, n);
    } else {
      std::memcpy(bytes, t.data_ptr(), n);
    }
    return;
  }
  auto flat = torch::from_blob(bytes, t.sizes(), t.options());
  if (toTensor) {
    t.copy_(flat);
  } else {
    flat.copy_(t);
  }
}

}  // namespace

void DistributedDataParallel::beforeForward() {
  if (buffers_.empty()) return;  // one rank, broadcastBuffers off, or no buffers
  const auto t0 = std::chrono::steady_clock::now();
  torch::NoGradGuard noGrad;
  for (auto& b : buffers_) {
    if (static_cast<size_t>(b.tensor.numel()) * b.tensor.element_size() != b.bytes) {
      SHOAL_THROW(InvalidArgument,
                  "rank {}: DistributedDataParallel: buffer '{}' changed size since "
                  "construction ({} bytes, now {})",
                  group_->rank(), b.name, b.bytes,
                  static_cast<size_t>(b.tensor.numel()) * b.tensor.element_size());
    }
  }
  const bool root = group_->rank() == 0;
  if (root) {
    for (auto& b : buffers_) copyBytes(b.tensor, packedBuffers_.data() + b.offset, false);
  }
  comm::broadcast(*group_, packedBuffers_.data(), packedBuffers_.size(), DataType::kUInt8, 0);
  if (!root) {
    for (auto& b : buffers_) copyBytes(b.tensor, packedBuffers_.data() + b.offset, true);
  }
  bufferSeconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

DistributedDataParallel::Stats DistributedDataParallel::stats() const {
  Stats s;
  s.bufferSeconds = bufferSeconds_;
  s.bytesSent = group_->bytesSent() - bytesAtStart_;
  if (reducer_) {
    s.steps = reducer_->stats().steps;
    s.finishSeconds = reducer_->stats().finishSeconds;
  }
  s.lastFinish = lastFinish_;
  return s;
}

void DistributedDataParallel::backward(const torch::Tensor& loss) {
  if (!reducer_) {
    loss.backward();
    return;
  }
  try {
    loss.backward();
  } catch (...) {
    // A hook's failure inside autograd: report the iteration's root cause, with the reducer
    // ready for the next one.
    std::rethrow_exception(reducer_->abandonIteration(std::current_exception()));
  }
  finishTimed();
}

void DistributedDataParallel::finishGradientSync() {
  if (reducer_) finishTimed();
}

void DistributedDataParallel::finishTimed() {
  // Inside noSync() finish() returns at once: the last synchronizing one is the step's.
  if (!sync_) return reducer_->finish();
  const auto begin = Clock::now();
  reducer_->finish();
  lastFinish_ = {begin, Clock::now()};
}

}  // namespace shoal::train
