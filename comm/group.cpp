#include "comm/group.h"

#include <algorithm>

#include "common/error.h"
#include "common/log.h"
#include "common/reduce.h"
#include "store/prefix_store.h"
#include "transport/auth.h"
#include "transport/bootstrap.h"

namespace shoal::comm {

using transport::AbortKind;
using transport::FrameHeader;
using transport::OpCode;
using transport::Transfer;

namespace {

uint32_t fnv1a(const std::string& s) {
  uint32_t h = 2166136261u;
  for (unsigned char c : s) {
    h ^= c;
    h *= 16777619u;
  }
  return h;
}

// Note [Bounded diagnostics]: store calls made to explain a failure must not make a survivor
// overrun its deadline when the store's host is itself stopped or dead. Each has a small fixed
// budget; together they stay well under the 1 s a failure report may add to the timeout.
constexpr Duration kPostBudget = std::chrono::milliseconds(100);    // "blocked" marker
constexpr Duration kReportBudget = std::chrono::milliseconds(400);  // who is where
constexpr Duration kRecordBudget = std::chrono::milliseconds(200);  // our abort record
constexpr Duration kLookupBudget = std::chrono::milliseconds(300);  // a peer's abort record

std::shared_ptr<transport::Acceptor> makeAcceptor(const GroupOptions& o,
                                                  const std::string& secret) {
  transport::AcceptorOptions a;
  a.listenAddress = o.listenAddress;
  a.secret = secret;
  a.parkTimeout = o.timeout;  // a peer's sub-group may be created up to a timeout before ours
  return std::make_shared<transport::Acceptor>(std::move(a));
}

constexpr std::string_view kAlgorithmNames[] = {"auto", "ring", "recursive_doubling", "driver",
                                                "rabenseifner"};

}  // namespace

std::string_view toString(AllreduceAlgorithm a) {
  const auto i = static_cast<size_t>(a);
  return i < std::size(kAlgorithmNames) ? kAlgorithmNames[i] : std::string_view("unknown");
}

AllreduceAlgorithm parseAllreduceAlgorithm(std::string_view name) {
  for (size_t i = 0; i < std::size(kAlgorithmNames); ++i) {
    if (kAlgorithmNames[i] == name) return static_cast<AllreduceAlgorithm>(i);
  }
  SHOAL_THROW(InvalidArgument,
              "unknown all-reduce algorithm '{}' (auto, ring, "
              "recursive_doubling, rabenseifner, driver)",
              name);
}

GroupOptions GroupOptions::from(const EnvConfig& env) {
  GroupOptions o;
  o.timeout = seconds(env.timeoutSeconds);
  o.transport = env.transport;
  o.encrypt = env.encrypt;
  try {
    o.allreduce = parseAllreduceAlgorithm(env.allreduceAlgorithm);
  } catch (const InvalidArgument& e) {
    SHOAL_THROW(InvalidArgument, "SHOAL_ALLREDUCE_ALGORITHM: {}", e.what());
  }
  o.listenAddress = env.listenAddress.value_or("127.0.0.1");
  o.shmRingBytes = env.shmRingBytes;
  o.secret = env.secret;
  o.secretFile = env.secretFile;
  return o;
}

GroupOptions GroupOptions::fromEnv() {
  EnvConfig env = readEnvConfig();
  setLogLevel(env.logLevel);
  SHOAL_LOG_INFO("configuration: {}", describe(env));
  return from(env);
}

// ---- OpContext

OpContext::OpContext(Group& group, FrameHeader base, Duration timeout)
    : group_(group), base_(base), deadline_(timeout) {}

int OpContext::rank() const {
  return group_.rank();
}
int OpContext::size() const {
  return group_.size();
}

FrameHeader OpContext::header(uint32_t step, uint64_t bytes) const {
  FrameHeader h = base_;
  h.step = step;
  h.bytes = bytes;
  return h;
}

Transfer OpContext::send(int peer, uint32_t step, const void* data, size_t bytes) const {
  return Transfer::send(peer, header(step, bytes), data);
}
Transfer OpContext::sendAsReady(int peer, uint32_t step, const void* data, size_t bytes,
                                const size_t* ready) const {
  return Transfer::sendAsReady(peer, header(step, bytes), data, ready);
}
Transfer OpContext::recv(int peer, uint32_t step, void* data, size_t bytes) const {
  return Transfer::recv(peer, header(step, bytes), data);
}
Transfer OpContext::recvReduce(int peer, uint32_t step, void* data, size_t bytes) const {
  return Transfer::recvReduce(peer, header(step, bytes), data, static_cast<DataType>(base_.dtype),
                              static_cast<ReduceOp>(base_.redop));
}
Transfer OpContext::recvReduceFinal(int peer, uint32_t step, void* data, size_t bytes) const {
  const auto op = static_cast<ReduceOp>(base_.redop);
  return Transfer::recvReduce(peer, header(step, bytes), data, static_cast<DataType>(base_.dtype),
                              op, op == ReduceOp::kAvg ? size() : 1);
}

Transfer OpContext::recvApply(int peer, uint32_t step, size_t bytes,
                              transport::PieceHandler handler) const {
  return Transfer::recvApply(peer, header(step, bytes), handler);
}

void OpContext::run(std::vector<Transfer>& batch) {
  if (batch.empty()) return;
  // Only an operation blocked for a while says so in the store, for the timeout report of
  // whichever rank gives up first (see Group::arrivalReport). Nothing is done on the fast path,
  // and the slow path never waits long on the store (Note [Bounded diagnostics]).
  bool posted = false;
  auto onSlow = [&] {
    posted = group_.diagnostics_.set(kPostBudget, fmt::format("blocked/{}", group_.rank()),
                                     describeOp(base_));
  };
  group_.endpoint_->run(batch.data(), batch.size(), deadline_, onSlow);
  if (posted) {
    group_.diagnostics_.run(Duration(0), [key = fmt::format("blocked/{}", group_.rank())](
                                             store::Store& s) { s.deleteKey(key); });
  }
}

// ---- Group

Group::Group(std::shared_ptr<store::Store> root, std::string prefix, int rank, int size,
             uint32_t id, GroupOptions options, std::string secret,
             std::shared_ptr<void> secretHolder, std::shared_ptr<transport::Acceptor> acceptor)
    : root_(std::move(root)),
      prefix_(std::move(prefix)),
      store_(std::make_shared<store::PrefixStore>(prefix_, root_)),
      diagnostics_(store_),
      rank_(rank),
      size_(size),
      id_(id),
      options_(std::move(options)),
      secret_(std::move(secret)),
      secretHolder_(std::move(secretHolder)),
      acceptor_(std::move(acceptor)) {
  // Frames in this group's error messages are named the way comm names its operations.
  if (options_.endpoint.describe == transport::describeFrame)
    options_.endpoint.describe = describeOp;
  // Publish "arrived" only after a quarter of the deadline (at most 1 s) spent blocked.
  options_.endpoint.slowAfter =
      std::min<Duration>(options_.endpoint.slowAfter, options_.timeout / 4);
  // A group of several ranks connected from a world of one: it has no acceptor to share.
  if (!acceptor_ && size_ > 1) acceptor_ = makeAcceptor(options_, secret_);
  transport::BootstrapOptions b;
  b.rank = rank_;
  b.size = size_;
  b.groupId = id_;
  b.store = store_;
  b.secret = secret_;
  b.acceptor = acceptor_;
  b.transport = options_.transport;
  b.encrypt = options_.encrypt;
  b.shmRingBytes = options_.shmRingBytes;
  b.timeout = options_.timeout;
  b.endpoint = options_.endpoint;
  endpoint_ = transport::bootstrapEndpoint(b);
  allShm_ = size_ > 1;
  for (int p = 0; p < size_; ++p) {
    if (p != rank_) allShm_ = allShm_ && endpoint_->linkKind(p) == transport::LinkKind::kShm;
  }
}

Group::Group(std::shared_ptr<Backend> backend, GroupOptions options)
    : diagnostics_(nullptr),
      rank_(backend->rank()),
      size_(backend->size()),
      id_(0),
      options_(std::move(options)),
      backend_(std::move(backend)) {}

Group::~Group() {
  // A Work may keep its channel alive past this group: closed, it no longer touches the group.
  std::lock_guard<std::mutex> lock(p2pMutex_);
  for (auto& [key, channel] : p2p_) channel->close();
}

std::shared_ptr<Group> Group::create(std::shared_ptr<Backend> backend, GroupOptions options) {
  SHOAL_CHECK(backend != nullptr, "Group::create needs a backend");
  return std::shared_ptr<Group>(new Group(std::move(backend), std::move(options)));
}

transport::LinkKind Group::linkKind(int peer) const {
  if (!endpoint_) {
    SHOAL_THROW(InvalidArgument, "rank {}: the {} backend does not expose links", rank_,
                backendName());
  }
  return endpoint_->linkKind(peer);
}

std::shared_ptr<Group> Group::create(std::shared_ptr<store::Store> store, int rank, int size,
                                     GroupOptions options) {
  SHOAL_CHECK(store != nullptr, "Group::create needs a store");
  SHOAL_CHECK(size >= 1, "world size {} must be at least 1", size);
  SHOAL_CHECK(rank >= 0 && rank < size, "rank {} outside 0..{}", rank, size - 1);
  const uint64_t generation =
      options.generation
          ? *options.generation
          : static_cast<uint64_t>(store->add(fmt::format("shoal/worlds/{}", rank), 1) - 1);
  const std::string prefix = fmt::format("shoal/g{}", generation);
  store::PrefixStore scoped(prefix, store);
  auto secret = transport::resolveJobSecret(options.secret, options.secretFile, scoped, rank,
                                            options.timeout);
  // One acceptor per world, shared with the groups split or connected from it.
  auto acceptor = size > 1 ? makeAcceptor(options, secret.bytes) : nullptr;
  auto g = std::shared_ptr<Group>(new Group(store, prefix, rank, size, fnv1a(prefix),
                                            std::move(options), std::move(secret.bytes),
                                            std::move(secret.holder), std::move(acceptor)));
  g->generation_ = generation;
  return g;
}

std::shared_ptr<Group> Group::split(int color, int key) {
  // Runs in issue order like a collective: the split number must agree on every rank.
  std::shared_ptr<Group> result;
  if (backend_) {
    std::shared_ptr<Backend> sub;
    inOrder([&] {
      throwIfBackendFailed(fmt::format("{} split", backendName()));
      sub = backend_->split(color, key);
    });
    return sub ? std::shared_ptr<Group>(new Group(std::move(sub), options_)) : nullptr;
  }
  FrameHeader base;
  execute(op::kInternal, base, {}, [&](OpContext& ctx) {
    const uint64_t n = splits_++;
    store_->set(fmt::format("split/{}/{}", n, rank_), fmt::format("{} {}", color, key));
    struct Member {
      int color, key, rank;
    };
    std::vector<Member> members;
    for (int p = 0; p < size_; ++p) {
      std::string v = store_->get(fmt::format("split/{}/{}", n, p), ctx.deadline().remaining());
      Member m{0, 0, p};
      if (std::sscanf(v.c_str(), "%d %d", &m.color, &m.key) != 2) {
        SHOAL_THROW(ProtocolError, "split: malformed entry '{}' from rank {}", v, p);
      }
      if (m.color == color) members.push_back(m);
    }
    if (color < 0) return;
    std::stable_sort(members.begin(), members.end(), [](const Member& a, const Member& b) {
      return a.key != b.key ? a.key < b.key : a.rank < b.rank;
    });
    int newRank = 0;
    while (members[newRank].rank != rank_) ++newRank;
    std::string prefix = fmt::format("{}/split{}/c{}", prefix_, n, color);
    GroupOptions o = options_;
    o.timeout = ctx.deadline().remaining();
    result =
        std::shared_ptr<Group>(new Group(root_, prefix, newRank, static_cast<int>(members.size()),
                                         fnv1a(prefix), o, secret_, secretHolder_, acceptor_));
    result->options_.timeout = options_.timeout;
    result->generation_ = generation_;
  });
  return result;
}

std::shared_ptr<Group> Group::connect(const std::string& name, int rank, int size,
                                      std::optional<Duration> timeout) {
  if (backend_) {
    SHOAL_THROW(InvalidArgument,
                "rank {}: group '{}': named groups need the native engine; this group runs on "
                "{} (unset SHOAL_BACKEND)",
                rank_, name, backendName());
  }
  SHOAL_CHECK(size >= 1 && rank >= 0 && rank < size, "group '{}': rank {} of {}", name, rank, size);
  SHOAL_CHECK(!name.empty() && name.find('/') == std::string::npos,
              "group name '{}' must be non-empty without '/'", name);
  const std::string prefix = fmt::format("{}/named/{}", prefix_, name);
  GroupOptions o = options_;
  if (timeout) o.timeout = *timeout;
  auto g = std::shared_ptr<Group>(
      new Group(root_, prefix, rank, size, fnv1a(prefix), o, secret_, secretHolder_, acceptor_));
  g->options_.timeout = options_.timeout;
  g->generation_ = generation_;
  return g;
}

P2pChannel& Group::p2pChannel(int peer, int tag) {
  std::lock_guard<std::mutex> lock(p2pMutex_);
  auto& channel = p2p_[{peer, tag}];
  if (!channel) channel = std::make_shared<P2pChannel>(*this, peer, tag);
  return *channel;
}

AllreduceAlgorithm Group::allreduceAlgorithm(const CallOptions& call) const {
  return call.algorithm != AllreduceAlgorithm::kAuto ? call.algorithm : options_.allreduce;
}

Group::ArrivalReport Group::arrivalReport() {
  struct Found {
    std::vector<std::string> blocked;
    std::vector<int> silent;
  };
  auto found = std::make_shared<Found>();
  const int me = rank_, n = size_;
  bool answered = diagnostics_.run(kReportBudget, [found, me, n](store::Store& s) {
    for (int p = 0; p < n; ++p) {
      std::string key = fmt::format("blocked/{}", p);
      if (s.check({key})) {
        found->blocked.push_back(
            fmt::format("{} in {}", p, s.get(key, std::chrono::milliseconds(100))));
      } else if (p != me) {
        found->silent.push_back(p);
      }
    }
  });
  ArrivalReport r;
  r.answered = answered;
  if (!answered) {
    r.text = fmt::format(
        " (diagnostics skipped: the store did not answer within {} ms; its host may be stopped "
        "or dead)",
        std::chrono::duration_cast<std::chrono::milliseconds>(kReportBudget).count());
    return r;
  }
  if (found->silent.size() == 1) r.silent = found->silent[0];
  r.text = fmt::format(
      "; ranks blocked: {}; silent ranks (stopped, dead, or busy outside this group): [{}]",
      found->blocked.empty() ? std::string("none")
                             : fmt::format("{}", fmt::join(found->blocked, ", ")),
      fmt::join(found->silent, ", "));
  return r;
}

std::string Group::withContext(const FrameHeader& base, const std::string& what) const {
  return fmt::format("rank {}: {} failed: {}", rank_, describeOp(base), what);
}

// Note [Root cause]
// When one rank fails, every other rank of the group reports the same cause and names the rank
// where it started, not the peer through which it heard of it:
// - A rank that fails by itself (its own timeout, a bad frame, any exception inside the
//   operation) is the origin of the Failure; a timeout with exactly one silent rank names that
//   rank as the origin instead (it stopped; the others only waited for it).
// - Before shutting its links down, an aborting rank writes its Failure to the store under
//   abort/<rank> (bounded, Note [Bounded diagnostics]), then sends it in an abort frame to every
//   peer that can take one. A TCP peer in the middle of a data frame cannot: it only sees the
//   connection close.
// - A rank that receives an abort frame forwards that Failure unchanged.
// - A rank whose connection to a peer ends without a word (transport::ConnectionLost) first
//   looks up the peer's abort record: if the peer aborted, its Failure is adopted; otherwise the
//   peer died and is the origin.
// Every message then reads "rank r: <op> failed (cause: rank k): <k's account>".
std::optional<transport::Failure> Group::abortRecord(int peer) {
  auto v = diagnostics_.lookup(kLookupBudget, fmt::format("abort/{}", peer));
  if (!v) return std::nullopt;
  // "<kind> <origin>\n<text>", written by fail() below; checked like any outside input.
  transport::Failure f;
  int kind = 0;
  size_t nl = v->find('\n');
  if (nl == std::string::npos || std::sscanf(v->c_str(), "%d %d", &kind, &f.origin) != 2 ||
      kind < 0 || kind > static_cast<int>(AbortKind::kProtocol) || f.origin < -1 ||
      f.origin >= size_) {
    return std::nullopt;
  }
  f.kind = static_cast<AbortKind>(kind);
  f.text = v->substr(nl + 1, transport::kMaxAbortText);
  return f;
}

void Group::recordFailure(const transport::Failure& f) {
  diagnostics_.set(kRecordBudget, fmt::format("abort/{}", rank_),
                   fmt::format("{} {}\n{}", static_cast<int>(f.kind), f.origin, f.text));
}

void Group::fail(const FrameHeader& base, std::exception_ptr error) {
  // Aborted by an earlier operation: its cause was recorded and told then; the endpoint's
  // "failed earlier" error says which.
  if (endpoint_->aborted()) std::rethrow_exception(error);
  transport::Failure f;
  std::string heardFrom;
  bool rethrowOriginal = false;
  try {
    std::rethrow_exception(error);
  } catch (const transport::ConnectionLost& e) {
    if (auto record = abortRecord(e.peer())) {
      f = *record;
      heardFrom = fmt::format(" (heard from rank {}, which aborted and closed)", e.peer());
    } else {
      f = {AbortKind::kPeer, e.peer(), std::string(e.what()) + " (it exited or died)"};
    }
  } catch (const Error& e) {
    if (const auto& told = endpoint_->receivedAbort()) {
      f = *told;
      heardFrom = fmt::format(" (heard from: {})", e.what());
      if (heardFrom.size() > 300) heardFrom.clear();
    } else if (dynamic_cast<const TimeoutError*>(&e)) {
      ArrivalReport report = arrivalReport();
      // The silent rank if the store could say; else the one peer waited on, if only one.
      const int origin = report.silent >= 0                    ? report.silent
                         : !report.answered && e.origin() >= 0 ? e.origin()
                                                               : rank_;
      f = {AbortKind::kTimeout, origin, std::string(e.what()) + report.text};
    } else if (dynamic_cast<const MismatchError*>(&e)) {
      f = {AbortKind::kMismatch, -1, e.what()};
    } else if (dynamic_cast<const ProtocolError*>(&e)) {
      f = {AbortKind::kProtocol, rank_, e.what()};
    } else if (dynamic_cast<const PeerError*>(&e)) {
      f = {AbortKind::kPeer, e.origin() >= 0 ? e.origin() : rank_, e.what()};
    } else {
      // Store, system, argument or internal errors inside an operation: the peers are out of
      // step with this rank all the same, so they are told; the caller gets the error as it was.
      f = {AbortKind::kPeer, rank_, withContext(base, e.what())};
      rethrowOriginal = true;
    }
  } catch (const std::exception& e) {
    f = {AbortKind::kPeer, rank_, withContext(base, e.what())};
    rethrowOriginal = true;
  } catch (...) {
    f = {AbortKind::kPeer, rank_, withContext(base, "unknown exception")};
    rethrowOriginal = true;
  }
  if (f.text.size() > transport::kMaxAbortText) f.text.resize(transport::kMaxAbortText);
  recordFailure(f);
  endpoint_->abort(f);
  if (rethrowOriginal) std::rethrow_exception(error);
  std::string message = f.origin >= 0
                            ? fmt::format("rank {}: {} failed (cause: rank {}): {}{}", rank_,
                                          describeOp(base), f.origin, f.text, heardFrom)
                            : withContext(base, f.text + heardFrom);
  transport::throwFailure(f, message);
}

void Group::runOp(OpCode op, FrameHeader base, const CallOptions& call,
                  const std::function<void(OpContext&)>& body) {
  base.group = id_;
  base.op = static_cast<uint8_t>(op);
  if (op != op::kSendRecv) base.seq = nextSeq_++;
  OpContext ctx(*this, base, call.timeout.value_or(options_.timeout));
  try {
    body(ctx);
  } catch (...) {
    // One policy: whatever failed inside an operation aborts the group (Note [Root cause]).
    fail(ctx.base(), std::current_exception());
  }
}

void Group::throwIfBackendFailed(const std::string& what) const {
  if (!backendFailure_.empty()) {
    SHOAL_THROW(PeerError, "rank {}: {}: this group failed earlier and cannot be used: {}", rank_,
                what, backendFailure_);
  }
}

void Group::runBackendOp(const BackendOp& op, const CallOptions& call) {
  const uint64_t seq = op.op == op::kSendRecv ? 0 : nextSeq_++;
  const std::string what =
      op.op == op::kSendRecv
          ? fmt::format("{} {} {}", backendName(), op.isSend ? "send to" : "recv from", op.root)
          : fmt::format("{} {} (seq {})", backendName(), opName(op.op), seq);
  throwIfBackendFailed(what);
  const Duration timeout = call.timeout.value_or(options_.timeout);
  try {
    backend_->run(op, Deadline(timeout));
  } catch (const TimeoutError& e) {
    // The library cannot cancel a collective it started: the group is done.
    backendFailure_ = e.what();
    SHOAL_THROW(TimeoutError, "rank {}: {} timed out after {:.1f} s: {}", rank_, what,
                std::chrono::duration<double>(timeout).count(), e.what());
  } catch (const InvalidArgument&) {
    throw;  // refused before anything moved: the group is still usable
  } catch (const Error& e) {
    backendFailure_ = e.what();
    SHOAL_THROW(PeerError, "rank {}: {} failed: {}", rank_, what, e.what());
  }
  // MPI has no average and its reductions give no hook into their last step, so an average
  // runs as MPI's sum followed by one pass of division here (the native engine folds the
  // division into its last receive-reduce: Note [Average in the last step]).
  if (op.redop == ReduceOp::kAvg && size_ > 1 &&
      (op.op == op::kAllreduce || op.op == op::kReduce || op.op == op::kReduceScatter)) {
    if (op.op != op::kReduce || rank_ == op.root) {
      scaleAverage(op.recv, op.count, op.type, size_);
    }
  }
}

std::shared_ptr<Work> Group::runOnBackend(bool async, const BackendOp& op,
                                          const CallOptions& call) {
  if (!async) {
    inOrder([&] { runBackendOp(op, call); });
    return nullptr;
  }
  return queue([this, op, call] { runBackendOp(op, call); });
}

void Group::inOrder(const std::function<void()>& task) {
  if (!executor_.tryRunInline(task)) queue(task)->wait();
}

std::shared_ptr<Work> Group::queue(std::function<void()> task) {
  auto work = std::make_shared<Work>();
  // `this` outlives the task: the executor is the first member destroyed, and it drains.
  executor_.submit([work, task = std::move(task)] {
    try {
      task();
      work->finish(nullptr);
    } catch (...) {
      work->finish(std::current_exception());
    }
  });
  return work;
}

void Group::execute(OpCode op, const FrameHeader& base, const CallOptions& call,
                    std::function<void(OpContext&)> body) {
  inOrder([&] { runOp(op, base, call, body); });
}

std::shared_ptr<Work> Group::submit(OpCode op, const FrameHeader& base, const CallOptions& call,
                                    std::function<void(OpContext&)> body) {
  return queue([this, op, base, call, body = std::move(body)] { runOp(op, base, call, body); });
}

}  // namespace shoal::comm
