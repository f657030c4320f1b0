// Elastic membership: the numbered views (generations) of an elastic job, agreed through the
// job's store, so that every member sees the same view or none does.
//
// A view lists its members (stable ids: the launch's ranks 0..n-1, then one new id per worker
// started later) in rank order, each with the last step it committed (-1 for a joiner, whose
// state comes from a peer). Generation g+1 is agreed like this:
// - every member that moves on (after a failure, or to admit joiners) *arrives* at g+1: it
//   appends (id, committed step, the members it saw fail) to g+1's arrival list;
// - a member of view g proposes view g+1 once every member of g that is not known to have failed
//   arrived, or `settle` after its own arrival (a stalled member that never reported is left
//   out), and never with fewer than `minSize` arrivals; the proposal is the arrivals in the old
//   rank order, joiners after them in arrival order, at most `maxSize`;
// - the first proposal wins by compare-and-set on g+1's view key; every arrival reads that one.
// Joiners never propose: a worker that is not in view g only arrives at g+1 and waits until the
// running members decide to move (joinersWaiting()). A member that arrives after the view was
// agreed, or was cut by `maxSize`, is left out of it and arrives at the next generation.
//
// Threads: one Membership per process, used from one thread. Blocking calls are bounded by the
// deadlines in MembershipOptions and throw TimeoutError with what was missing; a store that
// cannot be reached throws StoreError. Malformed store values throw ProtocolError.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/group.h"
#include "common/deadline.h"
#include "common/error.h"
#include "store/store.h"

namespace shoal::comm {

// "MIN:MAX" (or "N" for N:N): 1 <= MIN <= MAX. InvalidArgument, one line, otherwise.
struct ElasticRange {
  int minSize = 1;
  int maxSize = 1;
  static ElasticRange parse(const std::string& text);
  std::string toString() const;
};

struct View {
  struct Member {
    int id = 0;
    int64_t committed = -1;  // the last step it committed; -1: none (a joiner)
  };
  uint64_t generation = 0;
  std::vector<Member> members;  // rank order

  int size() const { return static_cast<int>(members.size()); }
  // This member's rank in the view, or -1.
  int rankOf(int id) const;
  // The rank whose state everyone continues from: the highest committed step, lowest rank on
  // ties. -1 when no member has committed anything.
  int source() const;
  // True when some member's committed step differs from the source's (a joiner, or a survivor
  // that missed the last step): the source's state must be sent.
  bool needsSync() const;
  std::string encode() const;
  // ProtocolError naming `what` for a malformed text.
  static View decode(const std::string& text, const std::string& what);
};

struct MembershipOptions {
  ElasticRange range;
  int initialSize = 1;  // the launch's size: view 0 waits for all of them
  // After arriving at a generation, how long to wait for members of the last view that were
  // not seen to fail before proposing without them.
  Duration settle = std::chrono::seconds(5);
  // How long to wait below the minimum (or, for a joiner, to be admitted) before failing.
  Duration waitForMembers = std::chrono::seconds(120);
  // View 0: how long the initial workers may take to start.
  Duration startup = std::chrono::seconds(60);
};

class Membership {
 public:
  // `store`: the job's store (keys under "elastic/"). `id`: this worker's member id.
  Membership(std::shared_ptr<store::Store> store, int id, MembershipOptions options);

  // Blocking: arrives at the generation after the latest agreed one and returns the agreed view
  // that has this member. `committed`: the last step this member committed (-1 for a joiner);
  // `failed`: member ids this member saw fail. Left out of a view, it arrives at the next one
  // as a joiner. Throws TimeoutError (below the minimum for `waitForMembers`, or never
  // admitted), naming how many members arrived and the minimum.
  View next(int64_t committed, const std::vector<int>& failed = {});

  // Non-blocking (one store round trip): has any worker arrived at the generation after the
  // current view, i.e. is a joiner waiting to be admitted?
  bool joinersWaiting();

  // Records that training ended at `step` (one store round trip; the first call of the job
  // wins). A joiner waiting in next() then stops waiting at once: JobFinished, instead of a
  // TimeoutError after waitForMembers.
  void finish(int64_t step);

  // The view last returned by next(); generation 0 with no members before the first.
  const View& current() const { return current_; }
  int id() const { return id_; }
  const MembershipOptions& options() const { return options_; }

 private:
  struct Arrival {
    int id;
    int64_t committed;
    std::vector<int> failed;
  };
  std::string key(uint64_t generation, const std::string& what) const;
  uint64_t latestAgreed();
  std::vector<Arrival> arrivals(uint64_t generation);
  std::optional<View> previousView(uint64_t generation);
  bool proposer(uint64_t generation, const std::optional<View>& previous) const;
  std::optional<View> tryPropose(uint64_t generation, const std::optional<View>& previous,
                                 bool settled);

  std::shared_ptr<store::Store> store_;
  int id_;
  MembershipOptions options_;
  View current_;
  bool inView_ = false;
};

// Thrown by Membership::next() to a worker not yet admitted when the job's training ended
// (Membership::finish): nothing is left for it to do.
class JobFinished : public shoal::Error {
 public:
  using shoal::Error::Error;
};

// What an elastic worker keeps to form the group of each new view: shoal::init() fills it in
// World::elastic under `shoal run --elastic`.
struct ElasticContext {
  std::shared_ptr<store::Store> store;
  std::shared_ptr<Membership> membership;
  GroupOptions groupOptions;  // generation: set per view
};

// The group of `view` for this member (ctx.membership's id): collective over the view's
// members, bounded by the group timeout. Its generation is the view's, so nothing of an older
// view's group is ever read by it.
std::shared_ptr<Group> groupForView(const ElasticContext& ctx, const View& view);

}  // namespace shoal::comm
