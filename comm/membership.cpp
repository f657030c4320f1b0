#include "comm/membership.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <charconv>
#include <sstream>
#include <thread>

#include "common/env.h"
#include "common/error.h"

namespace shoal::comm {

namespace {

// Between two looks at a generation's view and arrivals. The store waits for all of several
// keys, never for the first of them (the view, or one more arrival), and a timed-out wait costs
// a new connection, so a member looks again after this pause: a few store round trips per look,
// and only while a view is being agreed.
constexpr auto kPoll = std::chrono::milliseconds(20);
// Set once training ended (Membership::finish): the step it ended at.
constexpr const char* kFinished = "elastic/finished";
// Arrival records, views and ids: far above any real job, so a corrupt value cannot make a
// member allocate or loop without bound.
constexpr int64_t kMaxMembers = 1 << 16;

int64_t parseField(std::string_view text, const std::string& what, int64_t min, int64_t max) {
  int64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || v < min || v > max) {
    SHOAL_THROW(ProtocolError, "elastic membership: malformed {}: '{}'", what, text.substr(0, 64));
  }
  return v;
}

std::vector<std::string_view> split(std::string_view text, char sep) {
  std::vector<std::string_view> out;
  while (true) {
    const auto at = text.find(sep);
    out.push_back(text.substr(0, at));
    if (at == std::string_view::npos) return out;
    text.remove_prefix(at + 1);
  }
}

}  // namespace

ElasticRange ElasticRange::parse(const std::string& text) {
  ElasticRange r;
  const auto colon = text.find(':');
  if (colon == std::string::npos) {
    r.minSize = r.maxSize = static_cast<int>(parseInteger("elastic size", text, 1, kMaxMembers));
  } else {
    r.minSize =
        static_cast<int>(parseInteger("elastic minimum", text.substr(0, colon), 1, kMaxMembers));
    r.maxSize =
        static_cast<int>(parseInteger("elastic maximum", text.substr(colon + 1), 1, kMaxMembers));
  }
  if (r.minSize > r.maxSize) {
    SHOAL_THROW(InvalidArgument, "elastic range '{}': the minimum {} exceeds the maximum {}", text,
                r.minSize, r.maxSize);
  }
  return r;
}

std::string ElasticRange::toString() const {
  return fmt::format("{}:{}", minSize, maxSize);
}

int View::rankOf(int id) const {
  for (size_t r = 0; r < members.size(); ++r) {
    if (members[r].id == id) return static_cast<int>(r);
  }
  return -1;
}

int View::source() const {
  int best = -1;
  for (size_t r = 0; r < members.size(); ++r) {
    if (members[r].committed >= 0 &&
        (best < 0 || members[r].committed > members[static_cast<size_t>(best)].committed)) {
      best = static_cast<int>(r);
    }
  }
  return best;
}

bool View::needsSync() const {
  const int s = source();
  if (s < 0) return false;
  const int64_t step = members[static_cast<size_t>(s)].committed;
  return std::any_of(members.begin(), members.end(),
                     [&](const Member& m) { return m.committed != step; });
}

// "<generation> <id>:<committed> <id>:<committed> ..."
std::string View::encode() const {
  std::string out = std::to_string(generation);
  for (const auto& m : members) out += fmt::format(" {}:{}", m.id, m.committed);
  return out;
}

View View::decode(const std::string& text, const std::string& what) {
  if (text.size() > static_cast<size_t>(kMaxMembers) * 48) {
    SHOAL_THROW(ProtocolError, "elastic membership: {} is {} bytes, too long", what, text.size());
  }
  auto fields = split(text, ' ');
  View v;
  v.generation = static_cast<uint64_t>(parseField(fields[0], what + " (generation)", 0, INT64_MAX));
  for (size_t i = 1; i < fields.size(); ++i) {
    auto parts = split(fields[i], ':');
    if (parts.size() != 2) {
      SHOAL_THROW(ProtocolError, "elastic membership: malformed member '{}' in {}",
                  fields[i].substr(0, 64), what);
    }
    View::Member m;
    m.id = static_cast<int>(parseField(parts[0], what + " (member id)", 0, INT32_MAX));
    m.committed = parseField(parts[1], what + " (committed step)", -1, INT64_MAX);
    if (v.rankOf(m.id) >= 0) {
      SHOAL_THROW(ProtocolError, "elastic membership: member {} twice in {}", m.id, what);
    }
    v.members.push_back(m);
  }
  if (v.members.empty()) SHOAL_THROW(ProtocolError, "elastic membership: {} has no members", what);
  return v;
}

Membership::Membership(std::shared_ptr<store::Store> store, int id, MembershipOptions options)
    : store_(std::move(store)), id_(id), options_(std::move(options)) {
  if (id < 0) SHOAL_THROW(InvalidArgument, "elastic membership: negative member id {}", id);
  if (options_.initialSize < 1) {
    SHOAL_THROW(InvalidArgument, "elastic membership: initial size {} < 1", options_.initialSize);
  }
}

std::string Membership::key(uint64_t generation, const std::string& what) const {
  return fmt::format("elastic/g{}/{}", generation, what);
}

// "elastic/latest" holds the newest agreed generation + 1 (absent: none agreed yet). It only
// moves forward by one (compare-and-set from g to g+1), so a slow member cannot move it back.
uint64_t Membership::latestAgreed() {
  if (!store_->check({"elastic/latest"})) return 0;
  return static_cast<uint64_t>(
      parseField(store_->get("elastic/latest", options_.settle), "elastic/latest", 1, INT64_MAX));
}

std::vector<Membership::Arrival> Membership::arrivals(uint64_t generation) {
  const int64_t n = store_->add(key(generation, "count"), 0);
  if (n < 0 || n > kMaxMembers) {
    SHOAL_THROW(ProtocolError, "elastic membership: generation {} counts {} arrivals", generation,
                n);
  }
  std::vector<Arrival> out;
  for (int64_t i = 0; i < n; ++i) {
    const std::string k = key(generation, fmt::format("arrival{}", i));
    // Counted but not yet written: that arrival is a moment away; it is looked at next time.
    if (!store_->check({k})) continue;
    const std::string text = store_->get(k, options_.settle);
    auto fields = split(text, ' ');
    if (fields.size() != 3) {
      SHOAL_THROW(ProtocolError, "elastic membership: malformed arrival '{}'",
                  std::string_view(text).substr(0, 64));
    }
    Arrival a;
    a.id = static_cast<int>(parseField(fields[0], "arrival id", 0, INT32_MAX));
    a.committed = parseField(fields[1], "arrival step", -1, INT64_MAX);
    if (!fields[2].empty() && fields[2] != "-") {
      for (auto f : split(fields[2], ',')) {
        a.failed.push_back(static_cast<int>(parseField(f, "failed member", 0, INT32_MAX)));
      }
    }
    // A member that arrived twice (left out once, then back) counts once, with its last word.
    auto same =
        std::find_if(out.begin(), out.end(), [&](const Arrival& o) { return o.id == a.id; });
    if (same != out.end()) {
      *same = a;
    } else {
      out.push_back(std::move(a));
    }
  }
  return out;
}

std::optional<View> Membership::previousView(uint64_t generation) {
  if (generation == 0) return std::nullopt;
  if (inView_ && current_.generation + 1 == generation) return current_;
  const std::string k = key(generation - 1, "view");
  if (!store_->check({k})) return std::nullopt;
  return View::decode(store_->get(k, options_.settle), k);
}

// Members of the view before `generation` (for generation 0: the launch's workers) propose it;
// joiners only wait.
bool Membership::proposer(uint64_t generation, const std::optional<View>& previous) const {
  if (generation == 0) return id_ < options_.initialSize;
  return inView_ && previous && previous->rankOf(id_) >= 0;
}

// Proposes `generation`'s view if this member may and the arrivals allow it; returns the agreed
// view if there is one now.
std::optional<View> Membership::tryPropose(uint64_t generation, const std::optional<View>& previous,
                                           bool settled) {
  if (!proposer(generation, previous)) return std::nullopt;
  auto arrived = arrivals(generation);
  std::vector<int> expected;
  if (generation == 0) {
    for (int i = 0; i < options_.initialSize; ++i) expected.push_back(i);
  } else {
    for (const auto& m : previous->members) expected.push_back(m.id);
  }
  std::vector<int> failed;
  for (const auto& a : arrived) failed.insert(failed.end(), a.failed.begin(), a.failed.end());
  bool all = true;
  for (int id : expected) {
    const bool came =
        std::any_of(arrived.begin(), arrived.end(), [&](const Arrival& a) { return a.id == id; });
    const bool gone = std::find(failed.begin(), failed.end(), id) != failed.end();
    all = all && (came || gone);
  }
  if (static_cast<int>(arrived.size()) < options_.range.minSize || !(all || settled)) {
    return std::nullopt;
  }
  // The old rank order first, so survivors keep their relative order (rank 0 stays 0 if it
  // survived), then joiners in arrival order.
  View v;
  v.generation = generation;
  for (int id : expected) {
    for (const auto& a : arrived) {
      if (a.id == id) v.members.push_back({a.id, a.committed});
    }
  }
  for (const auto& a : arrived) {
    if (v.rankOf(a.id) < 0) v.members.push_back({a.id, a.committed});
  }
  if (v.size() > options_.range.maxSize)
    v.members.resize(static_cast<size_t>(options_.range.maxSize));
  const std::string k = key(generation, "view");
  return View::decode(store_->compareSet(k, "", v.encode()), k);
}

View Membership::next(int64_t committed, const std::vector<int>& failed) {
  const Deadline admitted(options_.waitForMembers + options_.startup);
  uint64_t notBefore = 0;  // left out of a view: the next one at the earliest
  while (true) {
    const uint64_t generation =
        inView_ ? current_.generation + 1 : std::max(latestAgreed(), notBefore);
    const std::string failedText = fmt::format("{}", fmt::join(failed, ","));
    const int64_t slot = store_->add(key(generation, "count"), 1) - 1;
    store_->set(key(generation, fmt::format("arrival{}", slot)),
                fmt::format("{} {} {}", id_, inView_ ? committed : int64_t{-1},
                            failedText.empty() ? "-" : failedText));
    const std::optional<View> previous = previousView(generation);
    const Deadline settle(generation == 0 ? options_.startup : options_.settle);
    const Deadline below(options_.waitForMembers +
                         (generation == 0 ? options_.startup : Duration(0)));
    const std::string viewKey = key(generation, "view");
    std::optional<View> agreed;
    while (!agreed) {
      if (store_->check({viewKey})) {
        agreed = View::decode(store_->get(viewKey, options_.settle), viewKey);
        break;
      }
      agreed = tryPropose(generation, previous, settle.expired());
      if (agreed) break;
      const bool member = proposer(generation, previous);
      if (!member && store_->check({kFinished})) {
        throw JobFinished(fmt::format(
            "elastic membership: member {}: the job finished (at step {}) before this worker was "
            "admitted",
            id_, store_->get(kFinished, options_.settle)));
      }
      if (member ? below.expired() : admitted.expired()) {
        const auto n = arrivals(generation).size();
        SHOAL_THROW(TimeoutError,
                    "elastic membership: member {}: {} after {:.0f} s at generation {}: {} "
                    "worker{} arrived, the minimum is {}",
                    id_, member ? "too few workers" : "not admitted",
                    member ? below.elapsedSeconds() : admitted.elapsedSeconds(), generation, n,
                    n == 1 ? "" : "s", options_.range.minSize);
      }
      std::this_thread::sleep_for(kPoll);
    }
    // Publish progress: latest moves from generation to generation + 1 (once, by anyone).
    store_->compareSet("elastic/latest", generation == 0 ? "" : std::to_string(generation),
                       std::to_string(generation + 1));
    if (agreed->rankOf(id_) >= 0) {
      current_ = *agreed;
      inView_ = true;
      return current_;
    }
    // Left out (late, or above the maximum): a joiner of the next generation from now on.
    current_ = *agreed;
    inView_ = false;
    notBefore = generation + 1;
    if (admitted.expired()) {
      SHOAL_THROW(TimeoutError,
                  "elastic membership: member {} not admitted to any view in {:.0f} s", id_,
                  admitted.elapsedSeconds());
    }
  }
}

void Membership::finish(int64_t step) {
  store_->compareSet(kFinished, "", std::to_string(step));
}

bool Membership::joinersWaiting() {
  return store_->add(key(current_.generation + 1, "count"), 0) > 0;
}

std::shared_ptr<Group> groupForView(const ElasticContext& ctx, const View& view) {
  const int rank = view.rankOf(ctx.membership->id());
  SHOAL_CHECK(rank >= 0, "member {} is not in view {}", ctx.membership->id(), view.encode());
  GroupOptions o = ctx.groupOptions;
  o.generation = view.generation;
  return Group::create(ctx.store, rank, view.size(), o);
}

}  // namespace shoal::comm
