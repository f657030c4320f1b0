// What shoal run does when a parameter server's process fails in a job whose shards are
// replicated (--ps-replicas 2): the launcher's policy, apart from the processes it watches so
// that it can be tested alone (tests/server_loss_test.cpp).
//
// Note [Replicated shards] (ps/server.h): server s holds shard s and the backup of shard s-1, so
// the job survives losing server s while both its neighbours' copies live; the workers go on
// with the backups. Losing a server whose neighbour (s-1 or s+1, around the ring) is already
// lost leaves a shard without a copy: the workers fail and say so, and the launcher only
// explains. With --ps-replacements N, each tolerated loss (the first N of them) starts a new
// process in the lost one's place (Note [Replacement servers], ps/replacement.h), and once
// started the server counts as present again.
//
// Pure; not thread-safe (the launcher's loop calls it).
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>

namespace shoal::run {

class ServerLossPolicy {
 public:
  // `workers` ranks first, then `servers` server ranks; `replicas` 1 or 2 (with 1 nothing is
  // tolerated); at most `maxReplacements` replacements in the whole job.
  ServerLossPolicy(int workers, int servers, int replicas, int maxReplacements);

  struct Verdict {
    // The job goes on (or, where `bothCopiesLost`, the workers will fail by themselves): the
    // process is not blamed for the job's end.
    bool tolerated = true;
    bool bothCopiesLost = false;
    int replacement = 0;  // > 0: start replacement number `replacement` in the rank's place
    std::string message;  // what the launcher says, after "parameter server S (rank R) " + how
  };

  // The latest process of `rank` failed while the job was running. nullopt where the policy
  // does not apply (not a server, or shards not replicated): the launcher's usual blame does.
  std::optional<Verdict> failed(int rank);

  // A replacement for `rank` was started: the server is present again.
  void replacementStarted(int rank) { lost_.erase(rank - workers_); }

  // SHOAL_PS_REPLACEMENT for the next start of `rank`: the replacement's number, 0 if none.
  int replacementOf(int rank) const;

 private:
  const int workers_, servers_, replicas_, maxReplacements_;
  std::set<int> lost_;            // servers whose latest process failed
  int replacements_ = 0;          // started so far
  std::map<int, int> replacing_;  // rank -> its latest replacement's number
};

}  // namespace shoal::run
