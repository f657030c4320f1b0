#include "comm/group.h"

#include "common/error.h"
#include "common/flight_recorder.h"
#include "common/log.h"

namespace shoal::comm {

namespace {

constexpr std::string_view kAlgorithmNames[] = {"auto",   "ring",         "recursive_doubling",
                                                "driver", "rabenseifner", "hierarchical"};

// A span's name: the operation's, with send / receive told apart.
std::string spanName(transport::OpCode op, const Operation* described) {
  if (op == op::kSendRecv && described != nullptr) return described->isSend ? "send" : "recv";
  return opName(op);
}

// Ends `span` with wait_us and transfer_us split at `firstArrival` (Note [Operation spans]);
// without an arrival it adds nothing and the span ends when it goes.
void splitAtFirstArrival(TraceScope& span, const TraceSink& sink, Clock::time_point firstArrival) {
  if (firstArrival == Clock::time_point{}) return;
  // Noted on the steady clock between the span's begin and this end, and mapped onto the
  // sink's the way now() maps it: the two parts are never negative and add up to the span.
  const int64_t arrival = sink.at(firstArrival);
  const int64_t end = span.stop();
  span.arg("wait_us", static_cast<double>(arrival - span.beginNs()) / 1e3)
      .arg("transfer_us", static_cast<double>(end - arrival) / 1e3);
}

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
              "recursive_doubling, rabenseifner, driver, hierarchical)",
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
  if (env.traceDir)
    o.trace = std::make_shared<TraceSink>(TraceSinkOptions{.capacity = env.traceEvents});
  return o;
}

GroupOptions GroupOptions::fromEnv() {
  EnvConfig env = readEnvConfig();
  setLogLevel(env.logLevel);
  SHOAL_LOG_INFO("configuration: {}", describe(env));
  return from(env);
}

std::shared_ptr<Engine> Engine::connect(const std::string& name, int, int, Duration) {
  SHOAL_THROW(InvalidArgument,
              "rank {}: group '{}': named groups need the native engine; this group runs on "
              "{} (unset SHOAL_BACKEND)",
              rank(), name, this->name());
}

Group::Group(std::shared_ptr<Engine> engine, GroupOptions options)
    : engine_(std::move(engine)),
      rank_(engine_->rank()),
      size_(engine_->size()),
      options_(std::move(options)) {}

Group::~Group() = default;

std::shared_ptr<Group> Group::create(std::shared_ptr<Engine> engine, GroupOptions options) {
  return create(std::move(engine), std::move(options), "world");
}

std::shared_ptr<Group> Group::create(std::shared_ptr<Engine> engine, GroupOptions options,
                                     std::string label) {
  SHOAL_CHECK(engine != nullptr, "Group::create needs an engine");
  auto group = std::shared_ptr<Group>(new Group(std::move(engine), std::move(options)));
  group->label_ = std::move(label);
  return group;
}

std::shared_ptr<Group> Group::split(int color, int key) {
  // Runs in issue order like a collective: the engine's split must happen in the same place in
  // every rank's sequence.
  std::shared_ptr<Engine> sub;
  runTask(op::kInternal, false, {},
          [&](uint64_t, const Deadline& deadline) { sub = engine_->split(color, key, deadline); });
  // Counted on every rank, with or without a group: labels stay the same on all members.
  const uint64_t n = splits_++;
  return sub ? create(std::move(sub), options_, fmt::format("{}/split{}.{}", label_, n, color))
             : nullptr;
}

std::shared_ptr<Group> Group::connect(const std::string& name, int rank, int size,
                                      std::optional<Duration> timeout) {
  return create(engine_->connect(name, rank, size, timeout.value_or(options_.timeout)), options_,
                name);
}

// Note [Operation spans]
// With GroupOptions::trace set, each operation run in issue order records one span (category
// "comm"), from when it starts running on the thread that runs it to when it finished or
// failed. Its arguments:
//   seq          the group's sequence number (the same on every rank for the same collective);
//                point-to-point run in issue order has peer and tag instead
//   bytes        this rank's buffer: count x element size (collectives and send / receive)
//   algorithm    all-reduce only: the algorithm that ran (what kAuto resolved to)
//   transport    the kinds of link the operation's messages take (Engine::transportOf):
//                shm, tcp, tls, several joined by '+' (a group across hosts), mpi
//   group        the group's label (Group::label(): "world", or what split / connect named)
//   generation   the world generation; group_rank, group_size: this rank in the group
//   queued_us    asynchronous operations only: how long it waited behind earlier ones
//   error        only if it failed: the error's first line, shortened
//   wait_us      from the span's begin until the first message of this operation from any
//                peer arrived on this rank (the transport read its frame header): how late the
//                peers this rank hears from first were, their latency included
//   transfer_us  the rest of the span: moving and reducing data, and any wait for a peer the
//                operation meets only later. wait_us + transfer_us is the span's duration.
// The two are there only where a message of the operation arrived on this rank and the engine
// saw it. Not on ranks that receive nothing: the root of a broadcast or a scatter, the leaves
// of a reduce, the non-roots of a gather, a group of one. A send is done once the link took its
// bytes, whether the peer is there yet or not, so nothing there tells waiting from moving, and
// no value is made up. Not on an operation that failed before anything arrived, nor on tasks
// that move no frames of their own (split, the point-to-point channels' drive). Never under
// the MPI engine: the library's progress is out of sight (comm/mpi/mpi_engine.h).
// Only the first message counts: where it comes from a peer that was on time while another was
// late (the ring with more than 2 ranks, recursive doubling's first partner), the late peer
// shows in transfer_us. The arrival is one clock read per operation, noted by the transport's
// progress loop (transport::Endpoint::run) only while the span watches for it
// (Engine::watchFirstArrival), or while an OperationTimeLog is attached (the Trainer's
// step-time breakdown, comm/operation_times.h: then three clock reads per operation, trace or
// not); with neither, nothing is read.
// Point-to-point messages on the engine's own channels are asynchronous spans (category "p2p",
// named send / recv, from post to completion, with peer, tag and bytes): many overlap on one
// thread.
void Group::runOrdered(transport::OpCode op, const CallOptions& call, const Task& task,
                       const Operation* described, int64_t issuedNs) {
  if (failure_) {
    // One failure ends the group (the class comment): later calls are refused at once, with
    // the cause of the first.
    try {
      std::rethrow_exception(failure_);
    } catch (const Error& e) {
      PeerError refused(fmt::format("rank {}: {}: this group failed earlier and cannot be used: {}",
                                    rank_, opName(op), e.what()));
      refused.setOrigin(e.origin());
      throw refused;
    } catch (const std::exception& e) {
      SHOAL_THROW(PeerError, "rank {}: {}: this group failed earlier and cannot be used: {}", rank_,
                  opName(op), e.what());
    }
  }
  const uint64_t seq = op == op::kSendRecv ? 0 : nextSeq_++;
  const Deadline deadline(call.timeout.value_or(options_.timeout));
  TraceSink* sink = options_.trace.get();
  TraceScope span(sink, sink ? spanName(op, described) : std::string(), "comm");
  if (span.active()) {
    // Point-to-point run in issue order (engines without channels) is not numbered: its peer
    // and tag say which message it is.
    if (op == op::kSendRecv && described != nullptr) {
      span.arg("peer", described->root).arg("tag", described->tag);
    } else {
      span.arg("seq", seq);
    }
    if (described != nullptr) {
      span.arg("bytes", described->count * elementSize(described->type));
      if (op == op::kAllreduce)
        span.arg("algorithm", StaticText{toString(engine_->resolveAllreduce(*described))});
      span.arg("transport", StaticText{engine_->transportOf(*described)});
    }
    span.arg("group", std::string_view(label_));
    span.arg("generation", generation()).arg("group_rank", rank_).arg("group_size", size_);
    if (issuedNs != 0) span.arg("queued_us", static_cast<double>(sink->now() - issuedNs) / 1e3);
  }
  FlightRecorder* flight = options_.flight.get();
  const uint64_t flightId = flight ? flight->begin(flightOp(op, seq, described)) : 0;
  // Watched only while the task runs: the engine must not keep a pointer to this frame.
  Clock::time_point firstArrival{};
  if (span.active()) engine_->watchFirstArrival(&firstArrival);
  try {
    task(seq, deadline);
  } catch (...) {
    if (span.active()) engine_->watchFirstArrival(nullptr);
    if (span.active() || flight) {
      const std::string error = traceErrorLine(std::current_exception());
      if (span.active()) span.arg("error", error);
      if (flight) flight->end(flightId, error);
    }
    // One policy: whatever failed inside an operation fails the group; the engine tells the
    // peers and names the cause.
    bool fatal = true;
    std::exception_ptr error = engine_->abort(std::current_exception(), fatal);
    if (fatal) failure_ = error;
    if (span.active()) splitAtFirstArrival(span, *sink, firstArrival);
    std::rethrow_exception(error);
  }
  if (span.active()) {
    engine_->watchFirstArrival(nullptr);
    splitAtFirstArrival(span, *sink, firstArrival);
  }
  if (flight) flight->end(flightId);
}

FlightOp Group::flightOp(transport::OpCode op, uint64_t seq, const Operation* described) const {
  FlightOp f{.group = label_,
             .op = spanName(op, described),
             .seq = seq,
             .generation = generation(),
             .groupRank = rank_,
             .groupSize = size_};
  if (op == op::kSendRecv && described != nullptr) f.peer = described->root;
  if (described != nullptr) {
    f.bytes = described->count * elementSize(described->type);
    if (op == op::kAllreduce) f.detail = toString(engine_->resolveAllreduce(*described));
  }
  return f;
}

std::shared_ptr<Work> Group::runTask(transport::OpCode op, bool async, const CallOptions& call,
                                     Task task) {
  return schedule(op, async, call, std::move(task), std::nullopt);
}

std::shared_ptr<Work> Group::schedule(transport::OpCode op, bool async, const CallOptions& call,
                                      Task task, std::optional<Operation> described) {
  const Operation* d = described ? &*described : nullptr;
  if (!async) {
    inOrder([&] { runOrdered(op, call, task, d, 0); });
    return nullptr;
  }
  const int64_t issuedNs = options_.trace ? options_.trace->now() : 0;
  return queue([this, op, call, task = std::move(task), described, issuedNs] {
    runOrdered(op, call, task, described ? &*described : nullptr, issuedNs);
  });
}

std::shared_ptr<Work> Group::run(const Operation& o, const CallOptions& call, bool async) {
  Operation op = o;
  if (op.algorithm == AllreduceAlgorithm::kAuto) op.algorithm = call.algorithm;
  return schedule(
      op.op, async, call,
      [this, op](uint64_t seq, const Deadline& deadline) { engine_->run(op, seq, deadline); },
      // Only a span or the flight recorder reads the description: otherwise operations carry
      // no second copy.
      options_.trace || options_.flight ? std::optional<Operation>(op) : std::nullopt);
}

std::shared_ptr<Work> Group::post(const Operation& op, const CallOptions& call) {
  const int64_t postedNs = options_.trace ? options_.trace->now() : 0;
  if (auto work = engine_->post(op, call.timeout.value_or(options_.timeout))) {
    if (options_.trace) traceMessage(*work, op, postedNs);
    return work;
  }
  return run(op, call, true);
}

void Group::transfer(const Operation& op, const CallOptions& call) {
  if (!options_.trace && engine_->transferNow(op, call.timeout.value_or(options_.timeout))) return;
  post(op, call)->wait();
}

void Group::traceMessage(Work& work, const Operation& op, int64_t postedNs) {
  TraceSpan span;
  span.name = op.isSend ? "send" : "recv";
  span.category = "p2p";
  span.thread = TraceSink::currentThread();
  span.beginNs = postedNs;
  span.asyncId = options_.trace->nextAsyncId();
  span.add("peer", op.root);
  span.add("tag", op.tag);
  span.add("bytes", op.count * elementSize(op.type));
  span.add("transport", StaticText{engine_->transportOf(op)});
  span.add("group", std::string_view(label_));
  span.add("group_rank", rank_);
  // The callback may run on another thread after this group is gone: it holds the sink, not
  // the group.
  work.onDone([sink = options_.trace, span = std::move(span)](std::exception_ptr error) mutable {
    span.endNs = sink->now();
    if (error) span.add("error", traceErrorLine(error));
    sink->record(std::move(span));
  });
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

}  // namespace shoal::comm
