#include "comm/p2p_channel.h"

#include <algorithm>
#include <vector>

#include "comm/collective_util.h"
#include "comm/group.h"
#include "transport/endpoint.h"

namespace shoal::comm {

namespace {

// Note [Waiting chains]: in a pipeline or a ring of point-to-point operations, a stopped rank
// makes its neighbour wait, which makes the next one wait, and so on; each times out on its own
// channel, where its peer looks silent. A channel blocked for a while writes whom it waits on
// (p2pwait/<rank> = peer, in the parent group's store); a channel that times out follows those
// entries from its peer to the first rank that waits on nobody, and names that rank.
constexpr Duration kWaitPostBudget = std::chrono::milliseconds(100);
constexpr Duration kWaitLookupBudget = std::chrono::milliseconds(100);

std::string waitKey(int rank) {
  return fmt::format("p2pwait/{}", rank);
}

}  // namespace

P2pChannel::P2pChannel(Group& parent, int peer, int tag)
    : parent_(parent), peer_(peer), tag_(tag), worker_([this] { loop(); }) {}

P2pChannel::~P2pChannel() {
  std::shared_ptr<Group> pair;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
    pair = pair_;
  }
  changed_.notify_all();
  if (pair) pair->endpoint().wake();
  worker_.join();
}

std::string P2pChannel::what(const Op& op) const {
  return fmt::format("rank {}: {} rank {} (tag {}, {} x {})", parent_.rank(),
                     op.send ? "send to" : "receive from", peer_, tag_, op.count,
                     toString(op.type));
}

std::shared_ptr<Work> P2pChannel::post(bool isSend, void* data, size_t count, DataType type,
                                       Duration timeout) {
  auto work = std::make_shared<Work>();
  std::exception_ptr failed;
  std::shared_ptr<Group> pair;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    failed = failed_;
    if (!failed) {
      incoming_.push_back(Op{isSend, data, count, type, Deadline(timeout), work});
      pair = pair_;
    }
  }
  if (failed) {
    work->finish(failed);
    return work;
  }
  changed_.notify_all();
  if (pair) pair->endpoint().wake();
  return work;
}

// The pair group numbers its ranks 0 and 1; the caller thinks in the parent group's ranks.
// A peer that failed because of a third rank (it died of it, or gave up on it and left) wrote
// that in the parent group's store: the cause travels along chains of channels too
// (Note [Root cause] in comm/group.cpp).
std::exception_ptr P2pChannel::translate(std::exception_ptr error) const {
  const int lo = std::min(parent_.rank(), peer_), hi = std::max(parent_.rank(), peer_);
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    transport::Failure f;
    f.origin = e.origin() == 0 ? lo : e.origin() == 1 ? hi : -1;
    f.kind = dynamic_cast<const TimeoutError*>(&e)    ? transport::AbortKind::kTimeout
             : dynamic_cast<const MismatchError*>(&e) ? transport::AbortKind::kMismatch
             : dynamic_cast<const ProtocolError*>(&e) ? transport::AbortKind::kProtocol
                                                      : transport::AbortKind::kPeer;
    f.text =
        fmt::format("{} [ranks 0 and 1 here are ranks {} and {} of the group]", e.what(), lo, hi);
    if (f.kind == transport::AbortKind::kTimeout && f.origin == peer_) {
      f.origin = endOfWaitingChain();
    }
    if (f.origin >= 0 && f.origin != parent_.rank()) {
      if (auto record = parent_.abortRecord(f.origin); record && record->origin >= 0) {
        f.origin = record->origin;
        f.text = record->text;
      }
    }
    const bool typed = f.kind != transport::AbortKind::kPeer || dynamic_cast<const PeerError*>(&e);
    if (!typed) return error;
    auto& parent = const_cast<Group&>(parent_);
    parent.recordFailure(f);
    const std::string message =
        f.origin >= 0
            ? fmt::format(
                  "rank {}: point-to-point with rank {} (tag {}) failed (cause: rank {}): {}",
                  parent_.rank(), peer_, tag_, f.origin, f.text)
            : fmt::format("rank {}: point-to-point with rank {} (tag {}) failed: {}",
                          parent_.rank(), peer_, tag_, f.text);
    try {
      transport::throwFailure(f, message);
    } catch (...) {
      return std::current_exception();
    }
  } catch (...) {
    return error;
  }
}

int P2pChannel::endOfWaitingChain() const {
  std::vector<char> seen(static_cast<size_t>(parent_.size()), 0);
  seen[parent_.rank()] = 1;
  int at = peer_;
  for (int hop = 0; hop < parent_.size(); ++hop) {
    seen[at] = 1;
    auto next = parent_.diagnostics_.lookup(kWaitLookupBudget, waitKey(at));
    int n = -1;
    if (!next || std::sscanf(next->c_str(), "%d", &n) != 1 || n < 0 || n >= parent_.size() ||
        seen[n]) {
      break;  // `at` waits on nobody (or on a rank already on the chain: a cycle)
    }
    at = n;
  }
  return at;
}

void P2pChannel::loop() {
  std::exception_ptr error;
  std::shared_ptr<Group> pair;
  try {
    // Connect once there is work, within the first operation's deadline.
    Duration timeout;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      changed_.wait(lock, [&] { return stop_ || !incoming_.empty(); });
      timeout = stop_ ? Duration(0) : incoming_.front().deadline.remaining();
    }
    const int lo = std::min(parent_.rank(), peer_), hi = std::max(parent_.rank(), peer_);
    if (timeout > Duration(0)) {
      pair = parent_.connect(fmt::format("p2p-{}-{}-t{}", lo, hi, tag_),
                             parent_.rank() == lo ? 0 : 1, 2, timeout);
    }
  } catch (...) {
    error = translate(std::current_exception());
  }
  if (pair) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      pair_ = pair;
    }
    try {
      runConnected(*pair, active_);
    } catch (...) {
      error = std::current_exception();  // already in the parent group's ranks
    }
  }
  std::deque<Op> orphans;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!error) {
      error = std::make_exception_ptr(PeerError(fmt::format(
          "rank {}: point-to-point with rank {} (tag {}) stopped: its group was destroyed",
          parent_.rank(), peer_, tag_)));
    }
    failed_ = error;
    orphans.swap(incoming_);
  }
  for (auto& op : active_) op.work->finish(error);
  active_.clear();
  for (auto& op : orphans) op.work->finish(error);
}

void P2pChannel::runConnected(Group& pair, std::vector<Op>& active) {
  std::vector<transport::Transfer> transfers;
  uint64_t sendSeq = 0, recvSeq = 0;
  bool waitPosted = false;
  const Duration slowAfter =
      std::min<Duration>(std::chrono::seconds(1), parent_.options().timeout / 4);
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      changed_.wait(lock, [&] { return stop_ || !incoming_.empty(); });
      if (stop_) return;
    }
    try {
      pair.execute(transport::OpCode::kSendRecv, transport::FrameHeader{}, {}, [&](OpContext& ctx) {
        for (;;) {
          {
            std::lock_guard<std::mutex> lock(mutex_);
            if (stop_) return;
            for (auto& op : incoming_) {
              auto h = detail::baseHeader(op.count, op.type, ReduceOp::kSum, tag_);
              h.group = pair.id();
              h.op = static_cast<uint8_t>(transport::OpCode::kSendRecv);
              h.seq = op.send ? sendSeq++ : recvSeq++;
              h.bytes = op.count * elementSize(op.type);
              transfers.push_back(op.send ? transport::Transfer::send(1 - pair.rank(), h, op.data)
                                          : transport::Transfer::recv(1 - pair.rank(), h, op.data));
              active.push_back(std::move(op));
            }
            incoming_.clear();
          }
          if (active.empty()) return;
          auto earliest = std::min_element(active.begin(), active.end(), [](auto& a, auto& b) {
            return a.deadline.remaining() < b.deadline.remaining();
          });
          Deadline deadline(earliest->deadline.remaining());
          const auto quietSince = Clock::now();
          ctx.group().endpoint().runUntil(transfers.data(), transfers.size(), deadline, [&] {
            if (!waitPosted && Clock::now() - quietSince > slowAfter) {
              // Note [Waiting chains]: say whom this rank waits on, for a timeout elsewhere.
              waitPosted = parent_.diagnostics_.set(kWaitPostBudget, waitKey(parent_.rank()),
                                                    std::to_string(peer_));
            }
            std::lock_guard<std::mutex> lock(mutex_);
            return stop_ || !incoming_.empty();
          });
          // Complete what is done, keeping the rest in post order.
          size_t kept = 0;
          for (size_t i = 0; i < active.size(); ++i) {
            if (transfers[i].complete()) {
              active[i].work->finish(nullptr);
            } else {
              if (kept != i) {
                active[kept] = std::move(active[i]);
                transfers[kept] = transfers[i];
              }
              ++kept;
            }
          }
          active.resize(kept);
          transfers.resize(kept);
          if (active.empty() && waitPosted) {
            waitPosted = false;
            parent_.diagnostics_.run(Duration(0), [key = waitKey(parent_.rank())](
                                                      store::Store& st) { st.deleteKey(key); });
          }
        }
      });
    } catch (...) {
      // What was in flight fails with the channel's error; loop() fails the rest and later
      // posts with the same error.
      auto error = translate(std::current_exception());
      for (auto& op : active) op.work->finish(error);
      active.clear();
      std::rethrow_exception(error);
    }
    if (!active.empty()) return;  // stopping: loop() fails what is still in flight
  }
}

}  // namespace shoal::comm
