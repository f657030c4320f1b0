#include "ps/client.h"

#include <algorithm>
#include <mutex>

#include "common/error.h"
#include "ps/protocol.h"

namespace shoal::ps {

struct Client::Leads {
  std::mutex mu;
  std::vector<int64_t> values;
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
               std::vector<KeySpec> keys, const TrainingConfig& config)
    : world_(world),
      worker_(worker),
      numServers_(numServers),
      partition_(std::move(keys), numServers),
      timeout_(world.options().timeout + kReplyMargin),
      leads_(std::make_shared<Leads>()) {
  SHOAL_CHECK(numWorkers >= 1 && worker >= 0 && worker < numWorkers, "worker {} of {}", worker,
              numWorkers);
  config.validate();
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
    const size_t bytes = partition_.elements(s) * sizeof(float);
    if (payload) {
      rq.bytes = bytes;
      x->payload = payload + partition_.begin(s);
    }
    if (into) {
      rq.pullBytes = bytes;
      x->into = into + partition_.begin(s);
    }
    works.push_back(submitExchange(*links_[s], s, worker_, x, timeout_));
    xs.push_back(std::move(x));
  }
  std::function<void()> record;
  if (into) {
    record = [xs, leads = leads_] {
      int64_t lead = 0;
      for (const auto& x : xs) {
        lead = std::max(
            lead, static_cast<int64_t>(x->reply.step) - static_cast<int64_t>(x->reply.slowest));
      }
      std::lock_guard<std::mutex> lock(leads->mu);
      leads->values.push_back(lead);
    };
  }
  return allOf(works, record);
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
  const size_t esize = elementSize(dtype);
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
      rq.bytes = p.count * esize;
      x->payload = static_cast<const uint8_t*>(payload) + p.offset * esize;
    }
    if (matches && into) {
      rq.pullBytes = p.count * esize;
      x->into = static_cast<uint8_t*>(into) + p.offset * esize;
    }
    works.push_back(submitExchange(*links_[p.server], p.server, worker_, x, timeout_));
  }
  return allOf(works, nullptr);
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
  std::lock_guard<std::mutex> lock(leads_->mu);
  return leads_->values;
}

}  // namespace shoal::ps
