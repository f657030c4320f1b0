#include "comm/group.h"

#include "common/error.h"
#include "common/log.h"

namespace shoal::comm {

namespace {

constexpr std::string_view kAlgorithmNames[] = {"auto", "ring", "recursive_doubling", "driver",
                                                "rabenseifner", "hierarchical"};

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
  SHOAL_CHECK(engine != nullptr, "Group::create needs an engine");
  return std::shared_ptr<Group>(new Group(std::move(engine), std::move(options)));
}

std::shared_ptr<Group> Group::split(int color, int key) {
  // Runs in issue order like a collective: the engine's split must happen in the same place in
  // every rank's sequence.
  std::shared_ptr<Engine> sub;
  runTask(op::kInternal, false, {},
          [&](uint64_t, const Deadline& deadline) { sub = engine_->split(color, key, deadline); });
  return sub ? create(std::move(sub), options_) : nullptr;
}

std::shared_ptr<Group> Group::connect(const std::string& name, int rank, int size,
                                      std::optional<Duration> timeout) {
  return create(engine_->connect(name, rank, size, timeout.value_or(options_.timeout)), options_);
}

void Group::runOrdered(transport::OpCode op, const CallOptions& call, const Task& task) {
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
  try {
    task(seq, deadline);
  } catch (...) {
    // One policy: whatever failed inside an operation fails the group; the engine tells the
    // peers and names the cause.
    bool fatal = true;
    std::exception_ptr error = engine_->abort(std::current_exception(), fatal);
    if (fatal) failure_ = error;
    std::rethrow_exception(error);
  }
}

std::shared_ptr<Work> Group::runTask(transport::OpCode op, bool async, const CallOptions& call,
                                     Task task) {
  if (!async) {
    inOrder([&] { runOrdered(op, call, task); });
    return nullptr;
  }
  return queue([this, op, call, task = std::move(task)] { runOrdered(op, call, task); });
}

std::shared_ptr<Work> Group::run(const Operation& o, const CallOptions& call, bool async) {
  Operation op = o;
  if (op.algorithm == AllreduceAlgorithm::kAuto) op.algorithm = call.algorithm;
  return runTask(op.op, async, call, [this, op](uint64_t seq, const Deadline& deadline) {
    engine_->run(op, seq, deadline);
  });
}

std::shared_ptr<Work> Group::post(const Operation& op, const CallOptions& call) {
  if (auto work = engine_->post(op, call.timeout.value_or(options_.timeout))) return work;
  return run(op, call, true);
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
