#include "train/ddp/reducer.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <chrono>
#include <functional>

#include "comm/collectives.h"
#include "common/error.h"
#include "common/trace.h"
#include "train/autograd_hooks.h"

namespace shoal::train::ddp {

Reducer::Reducer(std::vector<torch::Tensor> params, std::vector<std::string> names,
                 std::shared_ptr<comm::Group> group, ReducerOptions options,
                 std::shared_ptr<CommHook> hook)
    : params_(std::move(params)),
      names_(std::move(names)),
      group_(std::move(group)),
      options_(options),
      hook_(std::move(hook)),
      alive_(std::make_shared<bool>(true)) {
  SHOAL_CHECK(group_ && hook_, "Reducer needs a group and a communication hook");
  SHOAL_CHECK(options_.bucketBytes > 0 && options_.firstBucketBytes > 0,
              "DistributedDataParallel: bucket sizes must be positive");
  SHOAL_CHECK(params_.size() == names_.size(), "Reducer: one name per parameter");

  // Reverse registration order: roughly the order backward produces the gradients.
  std::vector<size_t> order(params_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = order.size() - 1 - i;
  buildBuckets(order);
  resetIteration();

  std::weak_ptr<bool> alive = alive_;
  for (size_t i = 0; i < params_.size(); ++i) {
    auto acc = torch::autograd::impl::grad_accumulator(params_[i]);
    if (!acc) {
      SHOAL_THROW(InvalidArgument,
                  "DistributedDataParallel: parameter '{}' is not a leaf that requires grad",
                  names_[i]);
    }
    acc->add_pre_hook(std::make_unique<BeforeAccumulate>([this, alive, i] {
      if (alive.lock()) beforeAccumulate(i);
    }));
    postHookKeys_.push_back(acc->add_post_hook(std::make_unique<AfterAccumulate>([this, alive, i] {
      if (alive.lock()) afterAccumulate(i);
    })));
    accumulators_.push_back(std::move(acc));
  }
}

Reducer::~Reducer() {
  drain();
  alive_.reset();
  for (size_t i = 0; i < accumulators_.size(); ++i) {
    accumulators_[i]->del_post_hook(postHookKeys_[i]);
  }
}

void Reducer::buildBuckets(const std::vector<size_t>& order) {
  std::vector<std::vector<size_t>> groups;
  std::vector<size_t> bytes;
  for (size_t i : order) {
    const auto& p = params_[i];
    const size_t pb = static_cast<size_t>(p.numel()) * p.element_size();
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

  torch::NoGradGuard noGrad;
  ++layoutVersion_;
  std::vector<Bucket> buckets;
  std::vector<torch::Tensor> views(params_.size());
  bucketOf_.assign(params_.size(), 0);
  for (auto& g : groups) {
    Bucket b;
    b.index = buckets.size();
    b.layoutVersion = layoutVersion_;
    int64_t total = 0;
    for (size_t i : g) {
      bucketOf_[i] = buckets.size();
      b.params.push_back(i);
      b.offsets.push_back(total);
      b.numels.push_back(params_[i].numel());
      b.shapes.push_back(params_[i].sizes().vec());
      total += params_[i].numel();
    }
    b.buffer = torch::zeros({total}, params_[g.front()].options().requires_grad(false));
    for (size_t k = 0; k < b.params.size(); ++k) {
      const size_t i = b.params[k];
      views[i] = aliasOf(b.buffer, b.offsets[k], params_[i].sizes());
      // A rebuild moves the gradients the optimizer is about to read: the only copy, once.
      const auto& grad = params_[i].grad();
      if (grad.defined()) {
        views[i].copy_(grad);
        params_[i].mutable_grad() = views[i];
      }
    }
    buckets.push_back(std::move(b));
  }
  buckets_ = std::move(buckets);
  views_ = std::move(views);
  for (auto& b : buckets_) b.state = hook_->makeState(*group_, b);
}

std::vector<std::vector<size_t>> Reducer::bucketLayout() const {
  std::vector<std::vector<size_t>> out;
  for (auto& b : buckets_) out.push_back(b.params);
  return out;
}

void Reducer::resetIteration() {
  ready_.assign(params_.size(), 0);
  for (auto& b : buckets_) {
    b.pending = b.params.size();
    b.started = false;
    b.work.reset();
    b.readyNs = b.launchedNs = 0;
  }
  nextToStart_ = 0;
  hookFailure_ = nullptr;
}

void Reducer::pointGradAtView(size_t i) {
  auto& p = params_[i];
  const auto& grad = p.grad();
  if (grad.defined() && grad.is_same(views_[i])) return;
  // See Note [Gradients as bucket views]: set to none, replaced, or first use.
  torch::NoGradGuard noGrad;
  if (grad.defined()) {
    views_[i].copy_(grad);
  } else {
    views_[i].zero_();
  }
  p.mutable_grad() = views_[i];
}

void Reducer::beforeAccumulate(size_t i) {
  // An earlier backward of this iteration threw inside autograd and nobody cleaned up (the
  // caller ran backward itself): start afresh rather than report a "second gradient".
  if (hookFailure_) abandonIteration(nullptr);
  if (sync_ && ready_[i]) {
    // The bucket may already be on the wire: accumulating into it would race with the hook.
    SHOAL_THROW(InvalidArgument,
                "rank {}: DistributedDataParallel: parameter '{}' got a second gradient before "
                "the first was synchronized; call backward() once per step (accumulate with "
                "noSync())",
                group_->rank(), names_[i]);
  }
  pointGradAtView(i);
}

void Reducer::afterAccumulate(size_t i) {
  if (!sync_) return;  // noSync: the views accumulate locally
  try {
    // AccumulateGrad adds in place into the view, except when it cannot (create_graph):
    // then it replaced .grad, and the value moves into the view once.
    pointGradAtView(i);
    markReady(i);
  } catch (...) {
    hookFailure_ = std::current_exception();
    // A bucket that already failed is the likelier root cause (an aborted group refuses the
    // next bucket with a less telling error).
    for (auto& b : buckets_) {
      if (b.work && b.work->test() && b.work->error()) std::rethrow_exception(b.work->error());
    }
    throw;
  }
}

void Reducer::markReady(size_t i) {
  ready_[i] = 1;
  if (!rebuilt_) readyOrder_.push_back(i);
  if (settle(buckets_[bucketOf_[i]]) && options_.overlap) startReadyBuckets();
}

bool Reducer::settle(Bucket& b) {
  if (--b.pending > 0) return false;
  if (const auto& sink = group_->options().trace) b.readyNs = sink->now();
  return true;
}

void Reducer::startReadyBuckets() {
  // In bucket order on every rank, whatever order they filled in: collectives match by order.
  while (nextToStart_ < buckets_.size() && buckets_[nextToStart_].pending == 0) {
    Bucket& b = buckets_[nextToStart_++];
    b.started = true;
    if (const auto& sink = group_->options().trace) b.launchedNs = sink->now();
    b.work = hook_->start(*group_, b);
  }
}

void Reducer::traceBucket(const Bucket& b) const {
  const auto& sink = group_->options().trace;
  if (!sink) return;
  TraceSpan span;
  span.name = "ddp bucket";
  span.category = "ddp";
  span.thread = TraceSink::currentThread();
  // Buckets are on the wire while backward goes on: a track of their own.
  span.asyncId = sink->nextAsyncId();
  span.beginNs = b.readyNs > 0 ? b.readyNs : b.launchedNs;
  span.endNs = sink->now();
  span.add("bucket", b.index);
  span.add("bytes", b.buffer.numel() * b.buffer.element_size());
  span.add("parameters", b.params.size());
  // Ready before launched: an earlier bucket was not (they launch in order on every rank).
  span.add("waited_for_launch_us", (b.launchedNs - span.beginNs) / 1000);
  span.add("in_flight_us", (span.endNs - b.launchedNs) / 1000);
  sink->record(std::move(span));
}

void Reducer::finish() {
  if (!sync_) return;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    if (hookFailure_) std::rethrow_exception(hookFailure_);
    for (size_t i = 0; i < params_.size(); ++i) {
      if (ready_[i]) continue;
      if (!options_.findUnusedParameters) {
        SHOAL_THROW(InvalidArgument,
                    "rank {}: DistributedDataParallel: parameter '{}' got no gradient in this "
                    "backward (not used to compute the loss). If that is intended, construct "
                    "with DdpOptions::findUnusedParameters = true",
                    group_->rank(), names_[i]);
      }
      // Contributes what it holds: noSync accumulation, or zero.
      pointGradAtView(i);
      ready_[i] = 1;
      settle(buckets_[bucketOf_[i]]);
    }
    startReadyBuckets();
    for (auto& b : buckets_) {
      if (b.work) b.work->wait();
      hook_->finish(*group_, b);
      traceBucket(b);
    }
    if (!rebuilt_) rebuildFromReadyOrder();
  } catch (...) {
    std::rethrow_exception(abandonIteration(std::current_exception()));
  }
  resetIteration();
  ++stats_.steps;
  stats_.finishSeconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void Reducer::adoptOrder(const std::vector<size_t>& order) {
  std::vector<char> seen(params_.size(), 0);
  for (size_t i : order) {
    if (i >= params_.size() || seen[i]) {
      SHOAL_THROW(InvalidArgument,
                  "DistributedDataParallel: a bucket order of {} entries is not one of its {} "
                  "parameters (entry {})",
                  order.size(), params_.size(), i);
    }
    seen[i] = 1;
  }
  if (order.size() != params_.size()) {
    SHOAL_THROW(InvalidArgument,
                "DistributedDataParallel: a bucket order of {} entries for {} parameters",
                order.size(), params_.size());
  }
  buildBuckets(order);
  rebuilt_ = true;
  readyOrder_.clear();
  resetIteration();  // the new buckets' counts of pending gradients
}

void Reducer::rebuildFromReadyOrder() {
  // Rank 0's actual order (parameters that never got a gradient last), for every rank.
  std::vector<int64_t> order(readyOrder_.begin(), readyOrder_.end());
  std::vector<char> seen(params_.size(), 0);
  for (size_t i : readyOrder_) seen[i] = 1;
  for (size_t i = params_.size(); i-- > 0;) {
    if (!seen[i]) order.push_back(static_cast<int64_t>(i));
  }
  comm::broadcast(*group_, order.data(), order.size(), DataType::kInt64, 0);
  for (int64_t i : order) {
    if (i < 0 || static_cast<size_t>(i) >= params_.size()) {
      SHOAL_THROW(InternalError,
                  "rank {}: DistributedDataParallel: rank 0 sent bucket order "
                  "entry {} for {} parameters",
                  group_->rank(), i, params_.size());
    }
  }
  buildBuckets(std::vector<size_t>(order.begin(), order.end()));
  rebuilt_ = true;
  readyOrder_.clear();
}

std::exception_ptr Reducer::drain() noexcept {
  std::exception_ptr first;
  for (auto& b : buckets_) {
    if (!b.work) continue;
    try {
      b.work->wait();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  return first;
}

std::exception_ptr Reducer::abandonIteration(std::exception_ptr caught) noexcept {
  // The buffers belong to the communication still in flight: wait before touching them.
  std::exception_ptr first = drain();
  if (!first) first = hookFailure_;
  if (!rebuilt_) readyOrder_.clear();  // a partial order is no basis for the rebuild
  resetIteration();
  return first ? first : caught;
}

}  // namespace shoal::train::ddp
