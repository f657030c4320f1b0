#include "comm/native/native_engine.h"

#include <algorithm>
#include <thread>

#include "comm/native/abort_record.h"
#include "comm/native/algorithms.h"
#include "common/error.h"
#include "common/log.h"
#include "store/prefix_store.h"
#include "transport/auth.h"
#include "transport/bootstrap.h"

namespace shoal::comm {

using transport::AbortKind;
using transport::FrameHeader;

namespace {

// The kinds of a rank's links (bit k: transport::LinkKind k) as a name with static storage.
std::string_view linkKindsName(unsigned kinds) {
  static_assert(static_cast<unsigned>(transport::LinkKind::kTcp) == 0 &&
                static_cast<unsigned>(transport::LinkKind::kShm) == 1 &&
                static_cast<unsigned>(transport::LinkKind::kTls) == 2);
  static constexpr std::string_view kNames[] = {"none", "tcp",     "shm",     "shm+tcp",
                                                "tls",  "tcp+tls", "shm+tls", "shm+tcp+tls"};
  return kinds < std::size(kNames) ? kNames[kinds] : "invalid";
}

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

// How many worlds `rank` created on a store (the unscoped store: it numbers the generations).
std::string worldsCreatedKey(int rank) {
  return fmt::format("shoal/worlds/{}", rank);
}

// The frame template of a collective described by `op`.
FrameHeader baseHeader(const Operation& op) {
  FrameHeader h;
  h.op = static_cast<uint8_t>(op.op);
  h.count = op.count;
  h.dtype = static_cast<uint8_t>(op.type);
  h.redop = static_cast<uint8_t>(op.redop);
  h.root = static_cast<uint32_t>(op.root);
  return h;
}

}  // namespace

// ---- Construction

NativeEngine::NativeEngine(std::shared_ptr<store::Store> root, std::string prefix, int rank,
                           int size, uint64_t generation, const GroupOptions& options,
                           std::string secret, std::shared_ptr<void> secretHolder,
                           std::shared_ptr<transport::Acceptor> acceptor)
    : root_(std::move(root)),
      prefix_(std::move(prefix)),
      generation_(generation),
      store_(std::make_shared<store::PrefixStore>(prefix_, root_)),
      diagnostics_(store_),
      rank_(rank),
      size_(size),
      id_(fnv1a(prefix_)),
      options_(options),
      secret_(std::move(secret)),
      secretHolder_(std::move(secretHolder)),
      acceptor_(std::move(acceptor)),
      tagZero_(new std::atomic<P2pChannel*>[static_cast<size_t>(size)]) {
  for (int p = 0; p < size_; ++p) tagZero_[p].store(nullptr, std::memory_order_relaxed);
  // Frames in this group's error messages are named the way comm names its operations.
  endpointOptions_.describe = describeOp;
  // Publish "arrived" only after a quarter of the deadline (at most 1 s) spent blocked.
  endpointOptions_.slowAfter = std::min<Duration>(endpointOptions_.slowAfter, options_.timeout / 4);
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
  b.hostLabel = options_.hostLabel.value_or("");
  b.timeout = options_.timeout;
  b.endpoint = endpointOptions_;
  endpoint_ = transport::bootstrapEndpoint(b);
  allShm_ = size_ > 1;
  unsigned kinds = 0;
  std::vector<std::string> hostOfRank(static_cast<size_t>(size_));
  for (int p = 0; p < size_; ++p) {
    if (p != rank_) {
      allShm_ = allShm_ && endpoint_->linkKind(p) == transport::LinkKind::kShm;
      kinds |= 1u << static_cast<unsigned>(endpoint_->linkKind(p));
    }
    hostOfRank[static_cast<size_t>(p)] =
        endpoint_->mesh().plan().peers[static_cast<size_t>(p)].host;
  }
  hosts_ = algo::hostLayout(hostOfRank, rank_);
  linkKinds_ = linkKindsName(kinds);
}

std::string_view NativeEngine::transportOf(const Operation& op) const {
  if (op.op == op::kSendRecv && op.root >= 0 && op.root < size_ && op.root != rank_)
    return toString(linkKind(op.root));
  return linkKinds_;
}

NativeEngine::~NativeEngine() {
  // A Work may keep its channel alive past this engine: closed, it no longer touches it.
  std::lock_guard<std::mutex> lock(p2pMutex_);
  for (auto& [key, channel] : p2p_) channel->close();
}

std::shared_ptr<Group> Group::create(std::shared_ptr<store::Store> store, int rank, int size,
                                     GroupOptions options) {
  SHOAL_CHECK(store != nullptr, "Group::create needs a store");
  SHOAL_CHECK(size >= 1, "world size {} must be at least 1", size);
  SHOAL_CHECK(rank >= 0 && rank < size, "rank {} outside 0..{}", rank, size - 1);
  const uint64_t generation =
      options.generation ? *options.generation
                         : static_cast<uint64_t>(store->add(worldsCreatedKey(rank), 1) - 1);
  const std::string prefix = worldPrefix(generation);
  store::PrefixStore scoped(prefix, store);
  auto secret = transport::resolveJobSecret(options.secret, options.secretFile, scoped, rank,
                                            options.timeout);
  // One acceptor per world, shared with the groups split or connected from it.
  auto acceptor = size > 1 ? makeAcceptor(options, secret.bytes) : nullptr;
  auto engine = std::make_shared<NativeEngine>(store, prefix, rank, size, generation, options,
                                               std::move(secret.bytes), std::move(secret.holder),
                                               std::move(acceptor));
  return create(std::move(engine), std::move(options));
}

std::shared_ptr<Engine> NativeEngine::split(int color, int key, const Deadline& deadline) {
  const uint64_t n = splits_++;
  current_ = FrameHeader{};
  current_.op = static_cast<uint8_t>(op::kInternal);
  store_->set(fmt::format("split/{}/{}", n, rank_), fmt::format("{} {}", color, key));
  struct Member {
    int color, key, rank;
  };
  std::vector<Member> members;
  for (int p = 0; p < size_; ++p) {
    std::string v = store_->get(fmt::format("split/{}/{}", n, p), deadline.remaining());
    Member m{0, 0, p};
    if (std::sscanf(v.c_str(), "%d %d", &m.color, &m.key) != 2) {
      SHOAL_THROW(ProtocolError, "split: malformed entry '{}' from rank {}", v, p);
    }
    if (m.color == color) members.push_back(m);
  }
  if (color < 0) return nullptr;
  std::stable_sort(members.begin(), members.end(), [](const Member& a, const Member& b) {
    return a.key != b.key ? a.key < b.key : a.rank < b.rank;
  });
  int newRank = 0;
  while (members[newRank].rank != rank_) ++newRank;
  GroupOptions o = options_;
  o.timeout = deadline.remaining();
  auto sub = std::make_shared<NativeEngine>(root_, fmt::format("{}/split{}/c{}", prefix_, n, color),
                                            newRank, static_cast<int>(members.size()), generation_,
                                            o, secret_, secretHolder_, acceptor_);
  sub->options_.timeout = options_.timeout;
  return sub;
}

std::shared_ptr<Engine> NativeEngine::connect(const std::string& name, int rank, int size,
                                              Duration timeout) {
  SHOAL_CHECK(size >= 1 && rank >= 0 && rank < size, "group '{}': rank {} of {}", name, rank, size);
  SHOAL_CHECK(!name.empty() && name.find('/') == std::string::npos,
              "group name '{}' must be non-empty without '/'", name);
  GroupOptions o = options_;
  o.timeout = timeout;
  auto g = std::make_shared<NativeEngine>(root_, fmt::format("{}/named/{}", prefix_, name), rank,
                                          size, generation_, o, secret_, secretHolder_, acceptor_);
  g->options_.timeout = options_.timeout;
  return g;
}

// ---- Operations

void NativeEngine::logOperationTimes(std::shared_ptr<OperationTimeLog> log) {
  std::lock_guard lock(timesMutex_);
  logging_.store(log != nullptr, std::memory_order_relaxed);
  times_ = std::move(log);
}

void NativeEngine::runBody(const FrameHeader& base, uint64_t seq, const Deadline& deadline,
                           const std::function<void(OpContext&)>& body) {
  current_ = base;
  current_.group = id_;
  // Point-to-point frames are numbered per direction by their channel, not in issue order.
  if (static_cast<transport::OpCode>(base.op) != op::kSendRecv) current_.seq = seq;
  std::shared_ptr<OperationTimeLog> times;
  if (logging_.load(std::memory_order_relaxed)) {  // no lock per operation when nobody logs
    std::lock_guard lock(timesMutex_);
    times = times_;
  }
  OpContext ctx(*this, current_, deadline);
  if (!times) {
    body(ctx);
    return;
  }
  // The arrival is watched for the log even where no trace watches it; where one does, both
  // read the trace's (the group cleared it before this operation).
  Clock::time_point arrival{};
  Clock::time_point* const traced = firstArrival_;
  if (traced == nullptr) firstArrival_ = &arrival;
  const auto start = Clock::now();
  try {
    body(ctx);
  } catch (...) {
    firstArrival_ = traced;
    throw;
  }
  firstArrival_ = traced;
  times->add({.thread = std::this_thread::get_id(),
              .start = start,
              .firstArrival = traced != nullptr ? *traced : arrival,
              .end = Clock::now()});
}

AllreduceAlgorithm NativeEngine::resolveAllreduce(const Operation& op) const {
  // AllreduceKind's values are AllreduceAlgorithm's (comm/native/algorithms.h).
  return static_cast<AllreduceAlgorithm>(algo::chooseAllreduce(allreduceAlgorithm(op.algorithm),
                                                               size_, allShm_, hosts_.uniform(),
                                                               op.count * elementSize(op.type)));
}

void NativeEngine::run(const Operation& op, uint64_t seq, const Deadline& deadline) {
  FrameHeader base = baseHeader(op);
  if (op.op == op::kAllreduce) base.algo = static_cast<uint8_t>(resolveAllreduce(op));
  // The algorithm entry point of each collective (comm/native/algorithms.h), by op code.
  using Entry = void (*)(OpContext&, const Operation&);
  static const std::pair<transport::OpCode, Entry> kEntries[] = {
      {op::kAllreduce, algo::allreduce},
      {op::kBroadcast, algo::broadcast},
      {op::kReduce, algo::reduce},
      {op::kAllgather, algo::allgather},
      {op::kReduceScatter, algo::reduceScatter},
      {op::kAlltoall, algo::alltoall},
      {op::kGather, algo::gather},
      {op::kScatter, algo::scatter},
      {op::kBarrier, algo::barrier}};
  const auto* entry = std::find_if(std::begin(kEntries), std::end(kEntries),
                                   [&](const auto& e) { return e.first == op.op; });
  if (entry == std::end(kEntries)) {
    SHOAL_THROW(InternalError, "rank {}: the native engine has no operation {}", rank_,
                opName(op.op));
  }
  runBody(base, seq, deadline, [&](OpContext& ctx) { entry->second(ctx, op); });
}

std::shared_ptr<Work> NativeEngine::post(const Operation& op, Duration timeout) {
  return p2pChannel(op.root, op.tag)
      .post(op.isSend, op.isSend ? const_cast<void*>(op.send) : op.recv, op.count, op.type,
            timeout);
}

bool NativeEngine::transferNow(const Operation& op, Duration timeout) {
  return p2pChannel(op.root, op.tag)
      .transferNow(op.isSend, op.isSend ? const_cast<void*>(op.send) : op.recv, op.count, op.type,
                   timeout);
}

bool NativeEngine::moveNow(transport::Transfer& t, const Deadline& deadline,
                           const std::function<bool(Clock::time_point)>& stopEarly) {
  try {
    return endpoint_->runUntil(&t, 1, deadline, stopEarly);
  } catch (...) {
    failDirect(t);
  }
}

bool NativeEngine::tryNow(transport::Transfer& t) {
  try {
    return endpoint_->tryNow(t);
  } catch (...) {
    failDirect(t);
  }
}

void NativeEngine::failDirect(const transport::Transfer& t) {
  current_ = t.header;  // what abort() names
  bool fatal = true;
  std::rethrow_exception(abort(std::current_exception(), fatal));
}

P2pChannel& NativeEngine::p2pChannel(int peer, int tag) {
  if (tag == 0) {
    if (P2pChannel* known = tagZero_[peer].load(std::memory_order_acquire)) return *known;
  }
  std::lock_guard<std::mutex> lock(p2pMutex_);
  auto& channel = p2p_[{peer, tag}];
  if (!channel) channel = std::make_shared<P2pChannel>(*this, peer, tag);
  if (tag == 0) tagZero_[peer].store(channel.get(), std::memory_order_release);
  return *channel;
}

// ---- Failures

NativeEngine::ArrivalReport NativeEngine::arrivalReport() {
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

std::string NativeEngine::withContext(const FrameHeader& base, const std::string& what) const {
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
std::optional<transport::Failure> NativeEngine::abortRecord(int peer) {
  auto v = diagnostics_.lookup(kLookupBudget, abortRecordKey(peer));
  if (!v) return std::nullopt;
  return decodeAbortRecord(*v, size_);
}

void NativeEngine::recordFailure(const transport::Failure& f) {
  diagnostics_.set(kRecordBudget, abortRecordKey(rank_), encodeAbortRecord(f));
}

std::exception_ptr NativeEngine::abort(std::exception_ptr error, bool& fatal) noexcept {
  fatal = true;
  // Aborted by an earlier operation: its cause was recorded and told then.
  if (endpoint_->aborted()) return error;
  try {
    const FrameHeader& base = current_;
    transport::Failure f;
    std::string heardFrom;
    bool passOriginal = false;
    try {
      std::rethrow_exception(error);
    } catch (const transport::ConnectionLost& e) {
      auto record = abortRecord(e.peer());
      if (!record && e.origin() == e.peer()) {
        // The peer refused a connection because it is aborting (transport/mesh.cpp): its record
        // may not be written yet. Wait for it, within the lookup's budget, rather than report
        // the peer as dead.
        const std::string key = abortRecordKey(e.peer());
        diagnostics_.run(kLookupBudget, [key](store::Store& s) { s.wait({key}, kLookupBudget); });
        record = abortRecord(e.peer());
      }
      if (record) {
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
        // step with this rank all the same, so they are told; the caller gets the error as it
        // was.
        f = {AbortKind::kPeer, rank_, withContext(base, e.what())};
        passOriginal = true;
      }
    } catch (const std::exception& e) {
      f = {AbortKind::kPeer, rank_, withContext(base, e.what())};
      passOriginal = true;
    } catch (...) {
      f = {AbortKind::kPeer, rank_, withContext(base, "unknown exception")};
      passOriginal = true;
    }
    if (f.text.size() > transport::kMaxAbortText) f.text.resize(transport::kMaxAbortText);
    recordFailure(f);
    endpoint_->abort(f);
    if (passOriginal) return error;
    std::string message = f.origin >= 0
                              ? fmt::format("rank {}: {} failed (cause: rank {}): {}{}", rank_,
                                            describeOp(base), f.origin, f.text, heardFrom)
                              : withContext(base, f.text + heardFrom);
    transport::throwFailure(f, message);
  } catch (...) {
    return std::current_exception();
  }
}

std::shared_ptr<Group> attachToWorld(std::shared_ptr<store::Store> store, int rank,
                                     GroupOptions options) {
  SHOAL_CHECK(store != nullptr, "attachToWorld needs a store");
  const int64_t worlds = store->add(worldsCreatedKey(rank), 0);
  if (worlds < 1) {
    SHOAL_THROW(InvalidArgument,
                "rank {} never joined a world on this store, so there is no place to take", rank);
  }
  const auto generation = static_cast<uint64_t>(worlds - 1);
  const std::string prefix = worldPrefix(generation);
  store::PrefixStore scoped(prefix, store);
  auto secret = transport::resolveJobSecret(options.secret, options.secretFile, scoped, rank,
                                            options.timeout);
  options.generation = generation;
  // A group of one: nothing is published under the world's keys, and no acceptor is shared
  // (each connected group makes its own).
  auto engine =
      std::make_shared<NativeEngine>(store, prefix, 0, 1, generation, options,
                                     std::move(secret.bytes), std::move(secret.holder), nullptr);
  return Group::create(std::move(engine), std::move(options));
}

// ---- Access from above

NativeEngine& nativeEngine(Group& g, const char* what) {
  auto* engine = dynamic_cast<NativeEngine*>(&g.engine());
  if (!engine) {
    SHOAL_THROW(InvalidArgument, "rank {}: {} needs the native engine; this group runs on {}",
                g.rank(), what, g.engineName());
  }
  return *engine;
}

namespace {

Group::Task nativeTask(Group& g, transport::OpCode op, const FrameHeader& base,
                       std::function<void(OpContext&)> body) {
  NativeEngine& engine = nativeEngine(g, opName(op).c_str());
  FrameHeader b = base;
  b.op = static_cast<uint8_t>(op);
  return [&engine, b, body = std::move(body)](uint64_t seq, const Deadline& deadline) {
    engine.runBody(b, seq, deadline, body);
  };
}

}  // namespace

void execute(Group& g, transport::OpCode op, const FrameHeader& base, const CallOptions& call,
             std::function<void(OpContext&)> body) {
  g.runTask(op, false, call, nativeTask(g, op, base, std::move(body)));
}

std::shared_ptr<Work> submit(Group& g, transport::OpCode op, const FrameHeader& base,
                             const CallOptions& call, std::function<void(OpContext&)> body) {
  return g.runTask(op, true, call, nativeTask(g, op, base, std::move(body)));
}

}  // namespace shoal::comm
