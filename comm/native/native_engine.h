// Shoal's own engine: framed messages over per-pair links (shared memory within a host, TCP or
// TLS across hosts, transport/), the collective algorithms of this folder, and point-to-point
// channels. Made by Group::create with a store; what it offers beyond comm/engine.h (custom
// operations, link kinds) is reached through nativeEngine(group) below.
//
// Failures (Note [Root cause] in native_engine.cpp): abort() tells every peer why and which rank
// failed first, through abort frames and an abort record in the group's store, so every
// survivor names the same rank.
//
// Threading: as comm/engine.h. p2pChannel(), post(), interrupt() and linkKind() are
// thread-safe.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "comm/engine.h"
#include "comm/group.h"
#include "comm/native/algorithms.h"
#include "comm/native/diagnostics.h"
#include "comm/native/op_context.h"
#include "comm/native/p2p_channel.h"
#include "store/store.h"
#include "transport/acceptor.h"
#include "transport/endpoint.h"

namespace shoal::comm {

class NativeEngine final : public Engine {
 public:
  // Blocks until every rank published its record, or options.timeout. Connects nothing: a
  // pair connects when one of them first needs the other (transport/endpoint.h), through
  // `acceptor`, this rank's listener for the world (made by Group::create, shared with every
  // group split or connected from it; null for a group of one). `root` is unscoped; the engine
  // scopes it under `prefix`.
  NativeEngine(std::shared_ptr<store::Store> root, std::string prefix, int rank, int size,
               uint64_t generation, const GroupOptions& options, std::string secret,
               std::shared_ptr<void> secretHolder, std::shared_ptr<transport::Acceptor> acceptor);
  ~NativeEngine() override;

  std::string_view name() const override { return "native"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  uint64_t generation() const override { return generation_; }
  void run(const Operation& op, uint64_t seq, const Deadline& deadline) override;
  AllreduceAlgorithm resolveAllreduce(const Operation& op) const override;
  std::exception_ptr abort(std::exception_ptr error, bool& fatal) noexcept override;
  std::shared_ptr<Engine> split(int color, int key, const Deadline& deadline) override;
  std::shared_ptr<Engine> connect(const std::string& name, int rank, int size,
                                  Duration timeout) override;
  std::shared_ptr<Work> post(const Operation& op, Duration timeout) override;
  bool transferNow(const Operation& op, Duration timeout) override;
  void watchFirstArrival(Clock::time_point* at) override { firstArrival_ = at; }
  void logOperationTimes(std::shared_ptr<OperationTimeLog> log) override;
  void interrupt() noexcept override { endpoint_->interrupt(); }
  uint64_t bytesSent() const override { return endpoint_->bytesSent(); }

  // Runs `body` as the operation `base` describes (its op code, count, type...), with `seq`:
  // what execute() below hands over. Any exception leaves the engine for abort().
  void runBody(const transport::FrameHeader& base, uint64_t seq, const Deadline& deadline,
               const std::function<void(OpContext&)>& body);

  // The direct path of a point-to-point channel's pair group (Note [Direct path] in
  // comm/native/p2p_channel.cpp): moves one transfer now, on the calling thread, outside issue
  // order, as Endpoint::runUntil does (false when `stopEarly` said so, the transfer's progress
  // kept in it). The caller drives the pair's connection alone. A failure aborts this engine as
  // abort() does and throws what abort() returns.
  bool moveNow(transport::Transfer& t, const Deadline& deadline,
               const std::function<bool(Clock::time_point)>& stopEarly);
  // Before moveNow: one attempt, without a deadline (Endpoint::tryNow); fails as moveNow does.
  bool tryNow(transport::Transfer& t);

  uint32_t id() const { return id_; }
  // This group's store, scoped under its prefix (the same keys on every member): for the
  // coordination a layer above needs among the group's members outside any operation (the
  // parameter servers' replacements, ps/replacement.h). Thread-safe as the store is.
  store::Store& store() const { return *store_; }
  const GroupOptions& options() const { return options_; }
  // The link to `peer`: the kind it has, or will have once the pair first talks (planned from
  // the records at creation; links are made on first use).
  transport::LinkKind linkKind(int peer) const { return endpoint_->linkKind(peer); }
  // Every peer is (or will be, see linkKind) reached over shared memory (false for a group of
  // one).
  bool allLinksShm() const { return allShm_; }
  std::string_view transportOf(const Operation& op) const override;
  // Which ranks share a host (the hierarchical all-reduce's shape).
  const algo::HostLayout& hosts() const { return hosts_; }
  transport::Endpoint& endpoint() { return *endpoint_; }
  // The point-to-point channel to `peer` for `tag` (comm/native/p2p_channel.h), made on first
  // use.
  P2pChannel& p2pChannel(int peer, int tag);
  AllreduceAlgorithm allreduceAlgorithm(AllreduceAlgorithm requested) const {
    return requested != AllreduceAlgorithm::kAuto ? requested : options_.allreduce;
  }

 private:
  // In a catch block of the direct path: aborts as abort() does and throws what it returns.
  [[noreturn]] void failDirect(const transport::Transfer& t);
  friend class OpContext;
  friend class P2pChannel;  // records and looks up failures of its channel in this group
  // Where the other ranks are, for a timeout report (Note [Bounded diagnostics]).
  struct ArrivalReport {
    std::string text;
    int silent = -1;        // the one rank that never said it was blocked, if exactly one
    bool answered = false;  // the store answered within the budget
  };
  ArrivalReport arrivalReport();
  // A peer's abort record in the store, if it aborted (Note [Root cause]).
  std::optional<transport::Failure> abortRecord(int peer);
  // Writes this rank's abort record (bounded; Note [Bounded diagnostics]).
  void recordFailure(const transport::Failure& failure);
  std::string withContext(const transport::FrameHeader& base, const std::string& what) const;

  std::shared_ptr<store::Store> root_;  // unscoped, for sub-groups
  std::string prefix_;
  uint64_t generation_;
  std::shared_ptr<store::Store> store_;  // scoped to this group
  BoundedStore diagnostics_;             // store_, for failure reports only
  int rank_;
  int size_;
  uint32_t id_;
  GroupOptions options_;
  transport::EndpointOptions endpointOptions_;
  std::string secret_;
  std::shared_ptr<void> secretHolder_;
  // Before endpoint_, which unregisters from it.
  std::shared_ptr<transport::Acceptor> acceptor_;
  std::unique_ptr<transport::Endpoint> endpoint_;
  bool allShm_ = false;
  std::string_view linkKinds_ = "none";  // the kinds of this rank's links, for transportOf()
  algo::HostLayout hosts_;
  uint64_t splits_ = 0;
  // The operation running (or that ran last): what abort() names.
  transport::FrameHeader current_;
  // Where OpContext::run notes the running operation's first arrival (watchFirstArrival);
  // null when nobody traces it.
  Clock::time_point* firstArrival_ = nullptr;
  // Where runBody records each operation's times (logOperationTimes); null: nowhere.
  std::mutex timesMutex_;
  std::shared_ptr<OperationTimeLog> times_;
  std::atomic<bool> logging_{false};  // times_ is set: read without the lock first
  std::mutex p2pMutex_;
  // Closed by the destructor first: the channels use this engine until they are closed.
  std::map<std::pair<int, int>, std::shared_ptr<P2pChannel>> p2p_;
  // Tag 0's channel per peer, once made (a channel lives as long as the engine): the blocking
  // send / recv find it without the lock and the map (Note [Direct path] in p2p_channel.cpp).
  std::unique_ptr<std::atomic<P2pChannel*>[]> tagZero_;
};

// A world of one that shares the store keys of the last world `rank` created on `store` (the
// world group this rank's earlier process joined; Group::create counts them per rank):
// Group::connect() on it meets that world's members in named groups, while its collectives
// involve no one else. For a rank started again to take its old place in named groups when the
// world itself cannot be formed again (a replacement parameter server, run/init.cpp).
// InvalidArgument if `rank` never created a world on this store. Blocking only to resolve the
// job secret (options.timeout).
std::shared_ptr<Group> attachToWorld(std::shared_ptr<store::Store> store, int rank,
                                     GroupOptions options);

// The native engine under `g`; InvalidArgument naming `what` and g's engine otherwise.
NativeEngine& nativeEngine(Group& g, const char* what = "this");

// Runs `body` as operation `op` of `g` in issue order, under the group's failure policy, on
// the native engine: for operations defined above comm (the parameter server's: ps/protocol.h)
// and for tests. `base` holds what every frame of it carries besides group, op and seq, which
// are filled in. Synchronous: throws what the operation threw; submit() queues it and returns
// its Work.
void execute(Group& g, transport::OpCode op, const transport::FrameHeader& base,
             const CallOptions& call, std::function<void(OpContext&)> body);
std::shared_ptr<Work> submit(Group& g, transport::OpCode op, const transport::FrameHeader& base,
                             const CallOptions& call, std::function<void(OpContext&)> body);

}  // namespace shoal::comm
