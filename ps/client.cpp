#include "ps/client.h"

#include <algorithm>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>

#include "common/error.h"
#include "common/log.h"
#include "ps/client_replicas.h"
#include "ps/payload_codec.h"
#include "ps/protocol.h"
#include "ps/residual_checkpoint.h"
#include "ps/trace_spans.h"

namespace shoal::ps {

struct Client::Stats {
  std::mutex mu;
  std::vector<int64_t> leads;
  Traffic traffic;
  bool failed = false;  // a call failed
};

namespace {

// Margin over the world timeout: a server that gives up waiting for other workers says so
// (naming them) before this worker's own deadline passes.
constexpr auto kReplyMargin = std::chrono::seconds(15);

// A request the server refused (InvalidArgument: a wrong shape, a step already applied): the
// server keeps serving this worker.
bool refused(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const InvalidArgument&) {
    return true;
  } catch (...) {
    return false;
  }
}

// A Work that finishes once every part did, with the first error; onSuccess runs before it
// finishes when none failed, then onFinish (if any) with the outcome, before any waiter wakes.
std::shared_ptr<comm::Work> allOf(const std::vector<std::shared_ptr<comm::Work>>& parts,
                                  std::function<void()> onSuccess,
                                  std::function<void(std::exception_ptr)> onFinish = nullptr) {
  auto all = std::make_shared<comm::Work>();
  struct State {
    std::mutex mu;
    size_t left;
    std::exception_ptr first;
  };
  auto state = std::make_shared<State>();
  state->left = parts.size();
  auto finishAll = [all, onSuccess, onFinish](std::exception_ptr error) {
    if (!error && onSuccess) {
      try {
        onSuccess();
      } catch (...) {
        error = std::current_exception();
      }
    }
    if (onFinish) {
      try {
        onFinish(error);
      } catch (...) {
        // Only a trace span is made there: losing it must not fail the call.
      }
    }
    all->finish(error);
  };
  if (parts.empty()) {
    finishAll(nullptr);
    return all;
  }
  for (const auto& part : parts) {
    part->onDone([state, finishAll](std::exception_ptr error) {
      std::exception_ptr first;
      {
        std::lock_guard<std::mutex> lock(state->mu);
        if (error && !state->first) state->first = error;
        if (--state->left > 0) return;
        first = state->first;
      }
      finishAll(first);
    });
  }
  return all;
}

void setShape(Request& rq, const std::vector<int64_t>& shape) {
  if (shape.size() > static_cast<size_t>(kMaxDims)) {
    SHOAL_THROW(InvalidArgument, "a tensor of {} dimensions (parameter servers take up to {})",
                shape.size(), kMaxDims);
  }
  rq.ndim = static_cast<uint8_t>(shape.size());
  std::copy(shape.begin(), shape.end(), rq.shape);
}

}  // namespace

Client::Client(comm::Group& world, int worker, int numWorkers, int numServers,
               std::vector<KeySpec> keys, const TrainingConfig& config,
               const ClientOptions& options)
    : world_(world),
      worker_(worker),
      numServers_(numServers),
      partition_(std::move(keys), numServers),
      timeout_(world.options().timeout + kReplyMargin),
      pullHalf_(options.pullHalf),
      stats_(std::make_shared<Stats>()) {
  SHOAL_CHECK(numWorkers >= 1 && worker >= 0 && worker < numWorkers, "worker {} of {}", worker,
              numWorkers);
  config.validate();
  if (pushEncoding(options.compression) != Encoding::kRaw) {
    encoder_ = std::make_unique<PushEncoder>(options.compression, partition_);
  }
  if (options.replicas != 1 && options.replicas != 2) {
    SHOAL_THROW(InvalidArgument, "parameter-server replicas {}: 1 or 2", options.replicas);
  }
  const std::string hello = config.toText() + "\n" + partition_.keysText();
  if (options.replicas == 2) {
    if (numServers < 2) {
      SHOAL_THROW(InvalidArgument,
                  "parameter-server replicas 2 need at least 2 servers (the job has {})",
                  numServers);
    }
    std::vector<comm::Group*> links;
    for (int s = 0; s < numServers; ++s) {
      links_.push_back(world.connect(pairName(s, worker), 1, 2));
      links_.push_back(world.connect(backupPairName(s, worker), 1, 2));
      links.push_back(links_[2 * s].get());
      links.push_back(links_[2 * s + 1].get());
    }
    // A replacement's link (Note [Replacement servers]): kept with the others, so that it
    // outlives every operation on it and is interrupted when this worker leaves.
    auto connect = [this](const std::string& name) {
      links_.push_back(world_.connect(name, 1, 2));
      return links_.back().get();
    };
    replicas_ = std::make_shared<Replicas>(std::move(links), worker, numServers, timeout_, hello,
                                           std::move(connect));
  } else {
    for (int s = 0; s < numServers; ++s) {
      links_.push_back(world.connect(pairName(s, worker), 1, 2));
    }
  }

  std::vector<std::shared_ptr<Exchange>> xs;
  std::vector<std::shared_ptr<comm::Work>> works;
  for (int s = 0; s < numServers; ++s) {
    auto x = std::make_shared<Exchange>();
    x->request.kind = static_cast<uint32_t>(RequestKind::kHello);
    x->request.bytes = hello.size();
    x->payload = hello.data();
    works.push_back(submit(s, x));
    xs.push_back(x);
  }
  allOf(works, nullptr)->wait();
  startStep_ = static_cast<int64_t>(xs[0]->reply.step);
  for (int s = 0; s < numServers; ++s) {
    if (static_cast<int64_t>(xs[s]->reply.step) != startStep_) {
      SHOAL_THROW(InvalidArgument,
                  "worker {}: parameter servers 0 and {} resume from different steps ({} and "
                  "{}); their checkpoints do not belong together",
                  worker, s, startStep_, xs[s]->reply.step);
    }
    mustInitialize_ = mustInitialize_ || (xs[s]->reply.flags & kNeedsInit) != 0;
  }
  if (encoder_ && !encoder_->residual().empty() && !options.checkpointDir.empty()) {
    residuals_ = std::make_unique<ResidualCheckpoints>(options.checkpointDir, worker,
                                                       options.checkpointEvery, options.keep,
                                                       partition_.totalElements());
    if (startStep_ > 0) restoreResiduals();
  }
}

void Client::restoreResiduals() {
  std::string why;
  if (auto saved = residuals_->load(startStep_, &why)) {
    encoder_->restoreResidual(*saved);
    return;
  }
  // Not an error: a job may turn compression on when it resumes. But the run is then not the
  // one an uninterrupted job makes, and the user hears of it.
  SHOAL_LOG_WARN(
      "parameter-server worker {}: {}; its error-feedback residuals start from zero, so this run "
      "differs from an uninterrupted one",
      worker_, why);
}

Client::~Client() {
  if (finished_) return;
  bool failed = std::uncaught_exceptions() > 0;
  {
    std::lock_guard<std::mutex> lock(stats_->mu);
    failed = failed || stats_->failed;
  }
  if (failed) {
    // Leaving after a failure: a goodbye would tell the servers that this worker is done, and
    // a synchronous step would then wait for its next push until the timeout, holding every
    // other worker. Leaving fails their waits at once, naming this worker.
    for (const auto& link : links_) {
      if (link) link->interrupt();
    }
    return;
  }
  try {
    finish();
  } catch (const std::exception&) {
    // Destructors must not throw; finish() reports to callers who want to know.
  }
}

void Client::initialize(const float* flat) {
  SHOAL_CHECK(mustInitialize_, "worker {}: the servers are already initialized", worker_);
  std::vector<std::shared_ptr<comm::Work>> works;
  for (int s = 0; s < numServers_; ++s) {
    auto x = std::make_shared<Exchange>();
    x->request.kind = static_cast<uint32_t>(RequestKind::kInit);
    x->request.bytes = partition_.elements(s) * sizeof(float);
    x->payload = flat + partition_.begin(s);
    works.push_back(submit(s, x));
  }
  allOf(works, nullptr)->wait();
  mustInitialize_ = false;
}

std::shared_ptr<comm::Work> Client::push(const float* flat, int64_t step) {
  return whole(static_cast<int>(RequestKind::kPush), flat, nullptr, step);
}

std::shared_ptr<comm::Work> Client::pull(float* flat, int64_t step) {
  return whole(static_cast<int>(RequestKind::kPull), nullptr, flat, step);
}

std::shared_ptr<comm::Work> Client::pushPull(const float* grads, float* values, int64_t step) {
  return whole(static_cast<int>(RequestKind::kPushPull), grads, values, step);
}

std::shared_ptr<comm::Work> Client::whole(int kind, const float* payload, float* into,
                                          int64_t step) {
  SHOAL_CHECK(step >= 0, "worker {}: step {}", worker_, step);
  std::optional<TraceSpan> span = beginCallSpan(
      world_.options().trace.get(), static_cast<RequestKind>(kind), worker_, step, nullptr);
  std::vector<std::shared_ptr<Exchange>> xs;
  std::vector<std::shared_ptr<comm::Work>> works;
  for (int s = 0; s < numServers_; ++s) {
    auto x = std::make_shared<Exchange>();
    Request& rq = x->request;
    rq.kind = static_cast<uint32_t>(kind);
    rq.key = kAllKeys;
    rq.dtype = static_cast<uint8_t>(DataType::kFloat32);
    rq.step = static_cast<uint64_t>(step);
    if (payload) setPush(*x, partition_.pieces(s), payload + partition_.begin(s), step);
    if (into) setPull(*x, partition_.elements(s), into + partition_.begin(s));
    xs.push_back(std::move(x));
  }
  // Sent once every piece is encoded: a step's residuals are saved (ResidualCheckpoints) before
  // any of it leaves, and when saving fails nothing was sent that still reads the caller's
  // buffers.
  for (int s = 0; s < numServers_; ++s) works.push_back(submit(s, xs[s]));
  return allExchanges(kind, std::move(xs), std::move(works), into != nullptr, std::move(span));
}

std::shared_ptr<comm::Work> Client::submit(int shard, std::shared_ptr<Exchange> x) {
  if (replicas_) return replicas_->submit(shard, std::move(x));
  return submitExchange(*links_[shard], shard, worker_, std::move(x), timeout_);
}

void Client::setPush(Exchange& x, std::span<const Piece> pieces, const float* grad, int64_t step) {
  Request& rq = x.request;
  const Encoding e = encoder_ ? encoder_->encodingAt(step) : Encoding::kRaw;
  rq.encoding = static_cast<uint8_t>(e);
  size_t count = 0;
  for (const Piece& p : pieces) count += p.count;
  if (e == Encoding::kRaw) {
    rq.bytes = count * sizeof(float);
    x.payload = grad;
  } else {
    encoder_->encode(e, pieces, grad, x.packed);
    if (e == Encoding::kTopK) rq.density = encoder_->density();
    rq.bytes = x.packed.size();
    x.payload = x.packed.data();
  }
  // Warm-up steps push raw: their residuals (zero) are saved as at any other step.
  if (residuals_) residuals_->encoded(step, count, encoder_->residual());
}

void Client::setPull(Exchange& x, size_t count, float* into) {
  Request& rq = x.request;
  rq.pullEncoding = static_cast<uint8_t>(pullHalf_ ? Encoding::kFp16 : Encoding::kRaw);
  rq.pullBytes = pullPayloadBytes(rq.pullEncoding, count);
  x.into = into;
}

std::shared_ptr<comm::Work> Client::allExchanges(int kind,
                                                 std::vector<std::shared_ptr<Exchange>> xs,
                                                 std::vector<std::shared_ptr<comm::Work>> works,
                                                 bool leads, std::optional<TraceSpan> span) {
  const auto k = static_cast<RequestKind>(kind);
  const bool pushes = k == RequestKind::kPush || k == RequestKind::kPushPull;
  const bool pulls = k == RequestKind::kPull || k == RequestKind::kPushPull;
  std::function<void(std::exception_ptr)> onFinish;
  if (span) {
    // Recorded before the Work finishes: a waiter finds the span in the sink.
    onFinish = [sink = world_.options().trace, span = std::move(*span), xs,
                k](std::exception_ptr error) { endCallSpan(*sink, span, k, xs, error); };
  }
  onFinish = [stats = stats_, trace = std::move(onFinish)](std::exception_ptr error) {
    if (error && !refused(error)) {
      std::lock_guard<std::mutex> lock(stats->mu);
      stats->failed = true;
    }
    if (trace) trace(error);
  };
  auto count = [xs = std::move(xs), stats = stats_, pushes, pulls, leads] {
    int64_t lead = 0;
    Traffic t;
    for (const auto& x : xs) {
      lead = std::max(lead,
                      static_cast<int64_t>(x->reply.step) - static_cast<int64_t>(x->reply.slowest));
      t.pushedBytes += x->request.bytes;
      if (x->into) t.pulledBytes += x->reply.bytes;
    }
    std::lock_guard<std::mutex> lock(stats->mu);
    if (leads) stats->leads.push_back(lead);
    Traffic& total = stats->traffic;
    total.pushes += pushes ? 1 : 0;
    total.pulls += pulls ? 1 : 0;
    total.pushedBytes += t.pushedBytes;
    total.pulledBytes += t.pulledBytes;
  };
  return allOf(works, std::move(count), std::move(onFinish));
}

std::shared_ptr<comm::Work> Client::pushKey(const std::string& key, const void* data,
                                            DataType dtype, const std::vector<int64_t>& shape,
                                            int64_t step) {
  return keyed(static_cast<int>(RequestKind::kPush), key, data, nullptr, dtype, shape, step);
}

std::shared_ptr<comm::Work> Client::pullKey(const std::string& key, void* data, DataType dtype,
                                            const std::vector<int64_t>& shape, int64_t step) {
  return keyed(static_cast<int>(RequestKind::kPull), key, nullptr, data, dtype, shape, step);
}

std::shared_ptr<comm::Work> Client::keyed(int kind, const std::string& key, const void* payload,
                                          void* into, DataType dtype,
                                          const std::vector<int64_t>& shape, int64_t step) {
  const int k = partition_.find(key);
  if (k < 0) SHOAL_THROW(InvalidArgument, "worker {}: no parameter-server key '{}'", worker_, key);
  std::optional<TraceSpan> span = beginCallSpan(
      world_.options().trace.get(), static_cast<RequestKind>(kind), worker_, step, &key);
  const KeySpec& spec = partition_.keys()[k];
  auto pieces = partition_.piecesOf(k);
  const bool matches = dtype == spec.dtype && shape == spec.shape;
  if (!matches) {
    // Sent whole and without data, so the server (which decides) refuses it; a buffer of
    // another shape is never sliced by this key's pieces.
    Piece first;
    first.server = pieces.empty() ? 0 : pieces[0].server;
    pieces.assign(1, first);
  }
  // A matching buffer is float32 (every key is: Partition).
  std::vector<std::shared_ptr<Exchange>> xs;
  std::vector<std::shared_ptr<comm::Work>> works;
  for (const Piece& p : pieces) {
    auto x = std::make_shared<Exchange>();
    Request& rq = x->request;
    rq.kind = static_cast<uint32_t>(kind);
    rq.key = k;
    rq.dtype = static_cast<uint8_t>(dtype);
    setShape(rq, shape);
    rq.step = static_cast<uint64_t>(step);
    if (matches && payload) {
      setPush(*x, std::span(&p, 1), static_cast<const float*>(payload) + p.offset, step);
    }
    if (matches && into) setPull(*x, p.count, static_cast<float*>(into) + p.offset);
    xs.push_back(std::move(x));
  }
  // As in whole(): every piece encoded before any is sent.
  for (size_t i = 0; i < pieces.size(); ++i) works.push_back(submit(pieces[i].server, xs[i]));
  return allExchanges(kind, std::move(xs), std::move(works), false, std::move(span));
}

void Client::finish() {
  if (finished_) return;
  // Before the goodbyes: the servers write their last checkpoint once every worker said it. A
  // failure leaves this worker unfinished, so that unwinding leaves instead (~Client).
  if (residuals_) residuals_->finish(encoder_->residual());
  finished_ = true;
  std::vector<std::shared_ptr<comm::Work>> works;
  for (int s = 0; s < numServers_; ++s) {
    auto x = std::make_shared<Exchange>();
    x->request.kind = static_cast<uint32_t>(RequestKind::kBye);
    works.push_back(submit(s, x));
  }
  allOf(works, nullptr)->wait();
}

std::vector<int64_t> Client::leads() const {
  std::lock_guard<std::mutex> lock(stats_->mu);
  return stats_->leads;
}

Traffic Client::traffic() const {
  std::lock_guard<std::mutex> lock(stats_->mu);
  return stats_->traffic;
}

comm::Group& Client::link(int server) {
  SHOAL_CHECK(server >= 0 && server < numServers_, "server {} of {}", server, numServers_);
  if (replicas_) return replicas_->link(2 * static_cast<size_t>(server));
  return *links_.at(static_cast<size_t>(server));
}

uint64_t Client::failovers() const {
  return replicas_ ? replicas_->failovers() : 0;
}

const std::vector<float>& Client::residual() const {
  static const std::vector<float> kNone;
  return encoder_ ? encoder_->residual() : kNone;
}

}  // namespace shoal::ps
