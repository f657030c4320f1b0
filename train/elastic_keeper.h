// What an elastic job keeps of its training state across views (train/elastic.h): the seam
// between ElasticState, which runs the membership, and the holders of the state itself.
//   train/elastic_replicated.h  every rank holds all of it (DDP): the most advanced survivor's
//                               copy is broadcast after a change
//   train/zero/zero_elastic.h   each rank holds a shard (ZeRO): a copy of every shard is kept by
//                               the next rank, and the survivors reshard among themselves
//
// Threads: one thread drives a keeper (ElasticState's). Blocking calls are bounded by the group's
// deadlines and throw what its collectives throw (PeerError, TimeoutError: ElasticState then
// forms the next view).
#pragma once

#include <cstdint>
#include <string>

#include "comm/group.h"
#include "comm/membership.h"

namespace shoal::train {

// Where training is: completed steps, the epoch, and how many samples of it all ranks together
// have taken (train/elastic_sampler.h's position).
struct ElasticProgress {
  int64_t step = 0;
  int64_t epoch = 0;
  int64_t position = 0;
  // One step later, at `nextPosition`; a new epoch when it reached `epochSize`.
  ElasticProgress after(int64_t nextPosition, int64_t epochSize) const;
};

class ElasticKeeper {
 public:
  virtual ~ElasticKeeper() = default;

  // The start of every view, once its group is formed (the first view too, and a joiner's):
  // brings every rank of `view` to one committed state (collective over `group`), puts it in the
  // live objects, and makes it this rank's commit. After it, committed() is where every rank
  // continues from.
  virtual void enter(comm::Group& group, const comm::View& view) = 0;

  // The step boundary: keeps this rank's part of the state at `progress` (collective over
  // `group` for a keeper that exchanges copies).
  virtual void commit(comm::Group& group, const ElasticProgress& progress) = 0;

  // A view ended: releases everything that holds its group and puts the live objects back to
  // the last commit. Local; no communication.
  virtual void leave() = 0;

  // The progress of this rank's last commit (what it reports when it arrives at a view).
  virtual const ElasticProgress& committed() const = 0;

  // Sets the learning rate to the one at construction times `factor` (LrScaling).
  virtual void scaleLr(double factor) = 0;

  // Whether every rank holds the whole state, so that one file can hold it (encode/decode).
  virtual bool whole() const = 0;
  // The committed state as bytes, and back (checked against this rank's model; InvalidArgument
  // naming `what`). Only when whole().
  virtual std::string encode() const = 0;
  virtual void decode(const std::string& bytes, const std::string& what) = 0;
};

}  // namespace shoal::train
