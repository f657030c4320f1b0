#include "ps/client.h"

#include <algorithm>
#include <mutex>

#include "common/error.h"
#include "ps/payload_codec.h"
#include "ps/protocol.h"

namespace shoal::ps {

struct Client::Stats {
  std::mutex mu;
  std::vector<int64_t> leads;
  Traffic traffic;
};

namespace {

// Margin over the world timeout: a server that gives up waiting for other workers says so
// (naming them) before this worker's own deadline passes.
constexpr auto kReplyMargin = std::chrono::seconds(15);

// A Work that finishes once every part did, with the first error; onSuccess runs before it
// finishes when none failed.
std::shared_ptr<comm::Work> allOf(const std::vector<std::shared_ptr<comm::Work>>& parts,
                                  std::function<void()> onSuccess) {
  auto all = std::make_shared<comm::Work>();
  struct State {
    std::mutex mu;
    size_t left;
    std::exception_ptr first;
  };
  auto state = std::make_shared<State>();
  state->left = parts.size();
  auto finishAll = [all, onSuccess](std::exception_ptr error) {
    if (!error && onSuccess) {
      try {
        onSuccess();
      } catch (...) {
        error = std::current_exception();
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
  for (int s = 0; s < numServers; ++s) links_.push_back(world.connect(pairName(s, worker), 1, 2));

  const std::string hello = config.toText() + "\n" + partition_.keysText();
  std::vector<std::shared_ptr<Exchange>> xs;
  std::vector<std::shared_ptr<comm::Work>> works;
  for (int s = 0; s < numServers; ++s) {
    auto x = std::make_shared<Exchange>();
    x->request.kind = static_cast<uint32_t>(RequestKind::kHello);
    x->request.bytes = hello.size();
    x->payload = hello.data();
    works.push_back(submitExchange(*links_[s], s, worker_, x, timeout_));
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
}

Client::~Client() {
  if (finished_) return;
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
    works.push_back(submitExchange(*links_[s], s, worker_, x, timeout_));
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
    works.push_back(submitExchange(*links_[s], s, worker_, x, timeout_));
    xs.push_back(std::move(x));
  }
  return allExchanges(kind, std::move(xs), std::move(works), into != nullptr);
}

void Client::setPush(Exchange& x, std::span<const Piece> pieces, const float* grad, int64_t step) {
  Request& rq = x.request;
  const Encoding e = encoder_ ? encoder_->encodingAt(step) : Encoding::kRaw;
  rq.encoding = static_cast<uint8_t>(e);
  if (e == Encoding::kRaw) {
    size_t count = 0;
    for (const Piece& p : pieces) count += p.count;
    rq.bytes = count * sizeof(float);
    x.payload = grad;
    return;
  }
  encoder_->encode(e, pieces, grad, x.packed);
  if (e == Encoding::kTopK) rq.density = encoder_->density();
  rq.bytes = x.packed.size();
  x.payload = x.packed.data();
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
                                                 bool leads) {
  const auto k = static_cast<RequestKind>(kind);
  const bool pushes = k == RequestKind::kPush || k == RequestKind::kPushPull;
  const bool pulls = k == RequestKind::kPull || k == RequestKind::kPushPull;
  return allOf(works, [xs = std::move(xs), stats = stats_, pushes, pulls, leads] {
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
  });
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
    works.push_back(submitExchange(*links_[p.server], p.server, worker_, x, timeout_));
    xs.push_back(std::move(x));
  }
  return allExchanges(kind, std::move(xs), std::move(works), false);
}

void Client::finish() {
  if (finished_) return;
  finished_ = true;
  std::vector<std::shared_ptr<comm::Work>> works;
  for (int s = 0; s < numServers_; ++s) {
    auto x = std::make_shared<Exchange>();
    x->request.kind = static_cast<uint32_t>(RequestKind::kBye);
    works.push_back(submitExchange(*links_[s], s, worker_, x, timeout_));
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

const std::vector<float>& Client::residual() const {
  static const std::vector<float> kNone;
  return encoder_ ? encoder_->residual() : kNone;
}

}  // namespace shoal::ps
