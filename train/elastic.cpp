#include "train/elastic.h"

#include <fmt/format.h>

#include <chrono>
#include <cmath>

#include "comm/collectives.h"
#include "common/error.h"
#include "common/log.h"
#include "common/sealed_file.h"
#include "train/elastic_replicated.h"

namespace shoal::train {

namespace {

// Thrown by commit() to leave the user's function when joiners wait; caught by run() only.
struct AdmitJoiners {};

// The membership gave up (below the minimum, or never admitted): run() lets it out as it is,
// instead of trying the next view.
class GaveUp : public TimeoutError {
 public:
  using TimeoutError::TimeoutError;
};

double secondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

ElasticProgress ElasticProgress::after(int64_t nextPosition, int64_t epochSize) const {
  ElasticProgress p{step + 1, epoch, nextPosition};
  if (nextPosition >= epochSize) {
    p.epoch += 1;
    p.position = 0;
  }
  return p;
}

ElasticState::ElasticState(comm::ElasticContext context, std::shared_ptr<comm::Group> group,
                           torch::nn::Module& model, torch::optim::Optimizer& optimizer,
                           ElasticOptions options)
    : ElasticState(
          std::move(context), std::move(group),
          std::make_unique<ReplicatedState>(model, optimizer, options.commHook, options.lossScaler),
          nullptr, options) {}  // a copy: the arguments' order of evaluation is unspecified

ElasticState::ElasticState(comm::ElasticContext context, std::shared_ptr<comm::Group> group,
                           ElasticKeeper& keeper, ElasticOptions options)
    : ElasticState(std::move(context), std::move(group), nullptr, &keeper, std::move(options)) {}

ElasticState::ElasticState(comm::ElasticContext context, std::shared_ptr<comm::Group> group,
                           std::unique_ptr<ElasticKeeper> owned, ElasticKeeper* keeper,
                           ElasticOptions options)
    : context_(std::move(context)),
      group_(std::move(group)),
      owned_(std::move(owned)),
      keeper_(owned_ ? owned_.get() : keeper),
      options_(std::move(options)) {
  SHOAL_CHECK(context_.membership && context_.store && group_,
              "ElasticState needs an elastic job's context (shoal run --elastic)");
  if (options_.admitEvery < 1) {
    SHOAL_THROW(InvalidArgument, "ElasticState: admitEvery {} < 1", options_.admitEvery);
  }
  if ((options_.commHook || options_.lossScaler) && !owned_) {
    SHOAL_THROW(InvalidArgument,
                "ElasticState: ElasticOptions::commHook and lossScaler are for a DDP job's state; "
                "a keeper carries its own (zero::ElasticZero: ZeroOptions::commHook)");
  }
  if (options_.lrReferenceSize < 0) {
    SHOAL_THROW(InvalidArgument, "ElasticState: lrReferenceSize {} < 0", options_.lrReferenceSize);
  }
  if (!options_.checkpointPath.empty() && !keeper_->whole()) {
    SHOAL_THROW(InvalidArgument,
                "ElasticState: checkpointPath {}: this state is sharded over the ranks and has "
                "no one-file form (save sharded checkpoints instead)",
                options_.checkpointPath);
  }
  if (options_.lrReferenceSize == 0) {
    options_.lrReferenceSize = context_.membership->options().initialSize;
  }
}

double ElasticState::lrFactor(int size) const {
  const double ratio = static_cast<double>(size) / options_.lrReferenceSize;
  switch (options_.lrScaling) {
    case LrScaling::kNone:
      return 1;
    case LrScaling::kLinear:
      return ratio;
    case LrScaling::kSqrt:
      return std::sqrt(ratio);
  }
  return 1;
}

void ElasticState::scaleLr() {
  if (options_.lrScaling != LrScaling::kNone) keeper_->scaleLr(lrFactor(group_->size()));
}

void ElasticState::requireWhole(const std::string& path, const char* instead) const {
  if (!keeper_->whole()) {
    SHOAL_THROW(InvalidArgument,
                "elastic state {}: this state is sharded over the ranks and has no one-file form "
                "({} sharded checkpoints instead)",
                path, instead);
  }
}

void ElasticState::load(const std::string& path) {
  requireWhole(path, "load");
  std::string bytes;
  try {
    bytes = readSealedFile(path);
  } catch (const InvalidArgument& e) {
    SHOAL_THROW(InvalidArgument, "elastic state {}: not a Shoal elastic state ({})", path,
                e.what());
  }
  keeper_->decode(bytes, "elastic state " + path);
}

void ElasticState::save(const std::string& path) const {
  requireWhole(path, "save");
  writeSealedFile(path, keeper_->encode());
}

// Every view starts here once its group is formed: one state on every rank, the lr for its size.
void ElasticState::enter() {
  keeper_->enter(*group_, view());
  scaleLr();
}

void ElasticState::reform(const std::vector<int>& failed) {
  const auto started = std::chrono::steady_clock::now();
  const comm::View old = view();
  const int64_t mine = keeper_->committed().step;
  group_.reset();  // the failed view's connections and shared memory go now
  keeper_->leave();
  try {
    context_.membership->next(mine, failed);
  } catch (const TimeoutError& e) {
    if (options_.checkpointPath.empty()) throw GaveUp(e.what());
    // Every survivor writes the same state; the sealed file makes each write whole.
    save(options_.checkpointPath);
    throw GaveUp(fmt::format("{}; the state of step {} was written to {}", e.what(), mine,
                             options_.checkpointPath));
  }
  group_ = comm::groupForView(context_, view());
  enter();
  stats_.viewChanges += 1;
  stats_.lastRecoverySeconds = secondsSince(started);
  stats_.lastResumedStep = keeper_->committed().step;
  SHOAL_LOG_INFO("elastic: view {} of {} workers (was {}), rank {}, from step {} in {:.3f} s",
                 view().generation, view().size(), old.size(), group_->rank(),
                 keeper_->committed().step, stats_.lastRecoverySeconds);
  if (onViewChange) onViewChange(old, view());
}

void ElasticState::commit(const ElasticProgress& progress) {
  keeper_->commit(*group_, progress);
  const auto& v = view();
  if (++commits_ % options_.admitEvery != 0 ||
      v.size() >= context_.membership->options().range.maxSize) {
    return;
  }
  int32_t admit = group_->rank() == 0 && context_.membership->joinersWaiting() ? 1 : 0;
  comm::broadcast(*group_, &admit, 1, DataType::kInt32, 0);
  if (admit) throw AdmitJoiners{};
}

void ElasticState::run(const std::function<void(comm::Group&)>& fn) {
  std::optional<std::vector<int>> reformWithout;  // set: the view ended, these members failed
  while (true) {
    try {
      if (reformWithout) {
        reform(*reformWithout);
        reformWithout.reset();
      } else if (!entered_) {
        enter();  // the first view (a joiner's: the state comes from the running members)
      }
      entered_ = true;
      fn(*group_);
      // A worker still waiting to join has nothing left to do (Membership::finish).
      if (group_->rank() == 0) context_.membership->finish(keeper_->committed().step);
      return;
    } catch (const AdmitJoiners&) {
      reformWithout.emplace();
    } catch (const GaveUp& e) {
      throw TimeoutError(e.what());
    } catch (const Error& e) {
      // Forming the next view can fail the same way (a member died meanwhile): that view ends
      // too, and the members try the one after it.
      if (!dynamic_cast<const PeerError*>(&e) && !dynamic_cast<const TimeoutError*>(&e)) throw;
      reformWithout.emplace();
      const auto& v = view();
      if (group_ && e.origin() >= 0 && e.origin() < v.size() && e.origin() != group_->rank()) {
        reformWithout->push_back(v.members[static_cast<size_t>(e.origin())].id);
      }
      SHOAL_LOG_WARN("elastic: member {} in view {}: {}; forming the next view",
                     context_.membership->id(), v.generation, e.what());
      entered_ = true;
    }
  }
}

}  // namespace shoal::train
