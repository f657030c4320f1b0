#include "run/elastic_supervisor.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>

#include "common/error.h"
#include "run/process_util.h"

namespace shoal::run {

namespace {

// A new slot of the job: its rank.
int addPlace(std::vector<Placement>& places, const Placement& p) {
  places.push_back(p);
  return static_cast<int>(places.size()) - 1;
}

}  // namespace

ElasticSupervisor::ElasticSupervisor(const LaunchOptions& o, const sigset_t& childMask, Say say)
    : text_(*o.elastic),
      range_(comm::ElasticRange::parse(text_)),
      maxRestarts_(o.maxRestarts),
      graceSeconds_(o.graceSeconds),
      verbose_(o.verbose),
      joinFile_(o.joinFile),
      say_(std::move(say)) {
  if (o.hostDiscoveryScript.empty()) return;
  // Its first run gives the hosts the job starts on.
  if (!o.hosts.empty()) {
    SHOAL_THROW(InvalidArgument,
                "--host-discovery-script gives the hosts: not with --hosts or --hostfile");
  }
  HostDiscoveryOptions d;
  d.program = findProgram(o.hostDiscoveryScript);
  if (d.program.empty()) {
    SHOAL_THROW(InvalidArgument, "host discovery program '{}' not found or not executable",
                o.hostDiscoveryScript);
  }
  d.interval = std::chrono::duration_cast<Duration>(
      std::chrono::duration<double>(o.discoveryIntervalSeconds));
  d.signalMask = childMask;
  discovery_ = std::make_unique<HostDiscovery>(d);
  slots_.offer(discovery_->runNow());
}

ElasticSupervisor::~ElasticSupervisor() {
  if (joinFileWritten_) ::unlink(joinFile_.c_str());
}

void ElasticSupervisor::chooseLaunch(std::vector<HostSlots>& hosts, int& ranks) const {
  if (!discovery_) return;
  hosts = slots_.offered();
  int slots = 0;
  for (auto& h : hosts) slots += h.slots;
  if (ranks == 0) ranks = std::min(slots, range_.maxSize);
}

void ElasticSupervisor::checkLaunch(int ranks, int servers) {
  if (servers > 0) {
    SHOAL_THROW(InvalidArgument, "--elastic with --servers: elastic jobs are workers only");
  }
  const int workers = ranks - servers;
  if (workers < range_.minSize || workers > range_.maxSize) {
    SHOAL_THROW(InvalidArgument, "--elastic {}: {} workers started, outside {}..{}", text_, workers,
                range_.minSize, range_.maxSize);
  }
  nextMember_ = ranks;
}

void ElasticSupervisor::writeJoinFile(const Variables& job) {
  if (joinFile_.empty()) return;
  run::writeJoinFile(joinFile_, job);
  joinFileWritten_ = true;
}

void ElasticSupervisor::started(LaunchedRank& r) {
  workers_.push_back(&r);
  slots_.occupy(r.where);
}

bool ElasticSupervisor::ended(LaunchedRank& r, bool failed, bool stopping) {
  if (!failed) finishing_ = true;
  slots_.release(r.where, failed && !r.removed && !stopping);
  if (r.removed) {
    say("rank {} (member {}) {}, stopped as its slot left the discovered hosts", r.rank, r.member,
        describeRankStatus(r.status, r.where.local));
    return true;
  }
  if (failed && !stopping) {
    // Note [Elastic failures]: the survivors go on without it (comm/membership.h).
    failures_.push_back(&r);
    return true;
  }
  return false;
}

void ElasticSupervisor::supervise(std::vector<Placement>& places, bool stopping,
                                  const StartWorker& start) {
  restartFailed(places, start);
  discover(places, stopping, start);
}

// The launcher's member ids stay below kFirstOutsideMember: those belong to workers started by
// hand (run/join_file.h).
int ElasticSupervisor::newMember() {
  SHOAL_CHECK(nextMember_ < kFirstOutsideMember, "elastic member ids exhausted");
  return nextMember_++;
}

// Each failure once: restarted as a new member while restarts are left.
void ElasticSupervisor::restartFailed(std::vector<Placement>& places, const StartWorker& start) {
  for (; reported_ < failures_.size(); ++reported_) {
    const LaunchedRank* f = failures_[reported_];
    const std::string what = describeRankStatus(f->status, f->where.local);
    const int slot = restarts_ < maxRestarts_ ? slotForRestart(*f, places) : -1;
    if (slot >= 0) {
      const int member = newMember();
      ++restarts_;
      say("rank {} (member {}) {}; restarting it as member {}{} (restart {} of {})", f->rank,
          f->member, what, member,
          slot == f->rank ? "" : fmt::format(", rank {} on {}", slot, places[slot].host), restarts_,
          maxRestarts_);
      start(slot, member);  // the launcher's records stay where they are: `f` stays valid
    } else if (restarts_ < maxRestarts_) {
      say("rank {} (member {}) {}; no discovered slot is free to restart it on, the other "
          "workers go on without it",
          f->rank, f->member, what);
    } else {
      say("rank {} (member {}) {}; the other workers go on without it", f->rank, f->member, what);
    }
  }
}

// Its own slot while that is still offered, else a free one (one where no worker failed first:
// Note [Failed slots]), appended to `places`; -1: none.
int ElasticSupervisor::slotForRestart(const LaunchedRank& f, std::vector<Placement>& places) {
  if (!discovery_ || (slots_.offers(f.where) && !slots_.occupied(f.where))) return f.rank;
  auto p = slots_.freeSlot(false);
  if (!p) p = slots_.freeSlot(true);
  return p ? addPlace(places, *p) : -1;
}

// Note [Host discovery]: the job follows what the discovery program lists. A slot that left has
// its worker stopped (the others see it fail and go on without it); free slots get new workers
// that join, up to MAX, until a worker has finished. A run that failed changes nothing (said
// once per distinct reason).
void ElasticSupervisor::discover(std::vector<Placement>& places, bool stopping,
                                 const StartWorker& start) {
  const auto now = Clock::now();
  for (auto* r : workers_) {
    if (r->running && r->removed && now >= r->killAt) ::kill(-r->pid, SIGKILL);
  }
  if (!discovery_ || stopping) return;
  auto result = discovery_->poll();
  if (!result) return;
  if (result->error) {
    if (*result->error != lastDiscoveryError_)
      say("{}; the hosts stay as they were", *result->error);
    lastDiscoveryError_ = *result->error;
    return;
  }
  lastDiscoveryError_.clear();
  const std::string listed = SlotPool::describe(result->hosts),
                    was = SlotPool::describe(slots_.offered());
  if (listed != was) say("host discovery: {} (was {})", listed, was);
  slots_.offer(result->hosts);
  for (auto* r : workers_) {
    if (!r->running || r->removed || slots_.offers(r->where)) continue;
    r->removed = true;
    r->killAt = now + std::chrono::duration_cast<Clock::duration>(
                          std::chrono::duration<double>(graceSeconds_));
    say("rank {} (member {}): {} no longer offers its slot; stopping it", r->rank, r->member,
        r->where.host);
    ::kill(-r->pid, SIGTERM);
    ::kill(-r->pid, SIGCONT);
  }
  if (finishing_) return;
  int alive = 0;
  for (auto* r : workers_) alive += r->running && !r->removed;
  for (; alive < range_.maxSize; ++alive) {
    auto p = slots_.freeSlot(false);
    if (!p) break;
    const int r = addPlace(places, *p), member = newMember();
    say("rank {} (member {}) starts on {} to join the running job", r, member, p->host);
    start(r, member);
  }
}

// Note [Elastic failures]: failures were the job's business while it ran; at the end it
// succeeded if enough workers finished.
int ElasticSupervisor::finish() const {
  int ok = 0;
  for (auto* r : workers_) ok += WIFEXITED(r->status) && WEXITSTATUS(r->status) == 0;
  if (ok >= range_.minSize) {
    if (verbose_) {
      say("{} worker{} finished; {} failed along the way, {} restart{}", ok, ok == 1 ? "" : "s",
          failures_.size(), restarts_, restarts_ == 1 ? "" : "s");
    }
    return 0;
  }
  const LaunchedRank* first = failures_.empty() ? nullptr : failures_.front();
  for (auto* r : workers_) {
    if (!first && !(WIFEXITED(r->status) && WEXITSTATUS(r->status) == 0)) first = r;
  }
  say("job failed: {} worker{} finished, fewer than the minimum {}{}", ok, ok == 1 ? "" : "s",
      range_.minSize,
      first ? fmt::format("; the first to fail: rank {} (member {}), {}", first->rank,
                          first->member, describeRankStatus(first->status, first->where.local))
            : "");
  return first ? exitCodeOf(first->status) : 1;
}

}  // namespace shoal::run
