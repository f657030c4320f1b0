// Trainer::fit for an elastic job (TrainerContext::elastic; the contract is train/trainer.h's
// "Elastic jobs"): fit()'s loop over train/elastic.h's views. Why it is a loop of its own and not
// a branch of fit(): progress is a position in the epoch's permutation rather than a batch
// index (a view of another size deals the rest of the epoch out differently), every step ends
// in a commit, and everything that holds the group is made again for each view.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include "common/error.h"
#include "common/trace.h"
#include "train/collective_verdict.h"
#include "train/elastic.h"
#include "train/elastic_sampler.h"
#include "train/trainer.h"
#include "train/trainer/distribution_strategy.h"
#include "train/trainer/loop_common.h"

namespace shoal::train {

using loop::mixSeed;
using loop::secondsSince;
using loop::sumOverWorkers;

namespace {

using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

constexpr std::string_view kStatePrefix = "elastic-";
constexpr std::string_view kStateSuffix = ".state";
constexpr const char* kStoppedState = "elastic-stopped.state";
constexpr const char* kShardFolder = "elastic-shards";  // ZeRO's sharded checkpoints

std::string statePath(const std::string& dir, int64_t step) {
  return fmt::format("{}/{}{}{}", dir, kStatePrefix, step, kStateSuffix);
}

// The steps of the periodic states in `dir` (elastic-<step>.state), ascending; none when the
// folder does not exist.
std::vector<int64_t> savedSteps(const std::string& dir) {
  std::vector<int64_t> steps;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!name.starts_with(kStatePrefix) || !name.ends_with(kStateSuffix)) continue;
    const std::string digits =
        name.substr(kStatePrefix.size(), name.size() - kStatePrefix.size() - kStateSuffix.size());
    if (digits.empty() || digits.size() > 18 ||
        !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      continue;  // elastic-stopped.state, or not ours
    }
    steps.push_back(std::stoll(digits));
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

// A rank with no samples in a step (an epoch's last, spread over more ranks than samples are
// left) still takes part in its all-reduce: zero gradients for every trainable parameter.
torch::Tensor zeroLoss(torch::nn::Module& model) {
  torch::Tensor loss = torch::zeros({});
  for (const auto& p : model.parameters()) {
    if (p.requires_grad()) loss = loss + p.sum() * 0;
  }
  return loss;
}

// This rank's running sums, kept with each commit so that a step run again after a view change
// is counted once: the epoch's loss x samples, samples and step seconds, and the loss x samples
// and samples since the last validation.
struct Sums {
  int64_t epoch = 0;
  double loss = 0;
  double samples = 0;
  double seconds = 0;
  double since[2] = {0, 0};
};

}  // namespace

void Trainer::enterView(const std::shared_ptr<comm::Group>& group) {
  workers_ = group;
  strategy_->enterView(group);
  watchStragglers();
  timeOperations(group);
}

// workers_ stays until the next view replaces it: workers() must still answer (rank, size) when
// an exception leaves fit(), and the failed group holds nothing that the next view needs.
void Trainer::leaveView() {
  strategy_->leaveView();
  stragglers_.reset();
  for (const auto& g : timedGroups_) g->engine().logOperationTimes(nullptr);
  timedGroups_.clear();
}

std::vector<EpochMetrics> Trainer::fitElastic(const TensorDataset& train,
                                              const TensorDataset* validation) {
  const comm::ElasticContext& context = *ctx_.elastic;
  // The schedule's unit: one step of a job of scheduleWorkers workers (the launch's).
  const int launchSize = options_.scheduleWorkers > 0 ? options_.scheduleWorkers
                                                      : context.membership->options().initialSize;
  const int64_t share = options_.batch * options_.accumulate;  // a rank's samples per step
  const int64_t launchStep = share * launchSize;
  const int64_t epochSamples = options_.stepsPerEpoch > 0
                                   ? std::min(train.size(), options_.stepsPerEpoch * launchStep)
                                   : train.size();
  const int64_t scheduleStepsPerEpoch = (epochSamples + launchStep - 1) / launchStep;
  totalSteps_ = scheduleStepsPerEpoch * options_.epochs;
  const int64_t batchesInEpoch = scheduleStepsPerEpoch * options_.accumulate;
  auto scheduleStep = [&](const ElasticProgress& p) {
    return p.epoch * scheduleStepsPerEpoch + p.position / launchStep;
  };
  // Micro-batches of a launch-sized job done at `position` (the progress bar's fraction), whole
  // ones: an epoch shows done only when it is.
  auto batchesDone = [&](int64_t position) {
    return std::min(batchesInEpoch - 1, position / (options_.batch * launchSize));
  };
  ensureStrategy(totalSteps_, train.inputs);
  const ElasticSampler sampler(train.size(), {.seed = options_.seed});
  const std::string& dir = options_.checkpointDir;
  // DDP's state is whole on every rank: one file. ZeRO's is sharded: sharded checkpoints, in a
  // folder of their own (their progress's batch is the elastic position), none when giving up.
  const bool oneFile = options_.strategy == Strategy::kDdp;
  const std::string shardDir = dir + "/" + kShardFolder;
  std::unique_ptr<ElasticState> state = strategy_->makeElastic(
      context, workers_,
      ElasticOptions{.checkpointPath = dir.empty() || !oneFile ? "" : dir + "/" + kStoppedState});
  SHOAL_CHECK(state->whole() == oneFile, "Trainer: strategy {}'s elastic state is {}",
              toString(options_.strategy), state->whole() ? "whole" : "sharded");

  // Resume: the newest state in the folder, the periodic ones' or the one a stopped job wrote.
  // Only the launch's workers read it (a joiner gets the running state); one verdict for all.
  // (A sharded state resumes inside the first view: below.)
  int64_t savedAt = -1;  // the newest state this job wrote or read
  if (oneFile && options_.resume && context.membership->current().generation == 0) {
    onEveryRank(*workers_, "resuming from " + dir, [&] {
      const auto steps = savedSteps(dir);
      const std::string stopped = dir + "/" + kStoppedState;
      std::optional<int64_t> stoppedStep;
      if (fs::exists(stopped)) {
        state->load(stopped);
        stoppedStep = state->progress().step;
      }
      if (!steps.empty() && (!stoppedStep || *stoppedStep < steps.back())) {
        state->load(statePath(dir, steps.back()));
      }
    });
    savedAt = state->progress().step;
  }
  // The committed state is written when a checkpoint is due: after a commit, or at a view's
  // start when a view change came between the commit and its checkpoint. Collective: every rank
  // of the view decides alike, from the same progress and savedAt (agreed at each view's start:
  // a joiner, or a rank that missed a step, has not seen the others' last write).
  auto checkpoint = [&](comm::Group& group) {
    const ElasticProgress& p = state->progress();
    const bool due =
        (options_.checkpointEvery > 0 && p.step % options_.checkpointEvery == 0) || p.position == 0;
    if (dir.empty() || !due || p.step == 0 || p.step <= savedAt) return;
    TraceScope span(group.options().trace, "checkpoint", "train");
    if (!oneFile) {  // every rank writes its shard
      strategy_->save(shardDir, Progress{p.epoch, p.position, p.step}, options_.keep);
    } else {
      // Rank 0 writes, with one verdict: a write that fails there fails the job on every rank,
      // instead of rank 0 leaving and the others going on without checkpoints.
      onEveryRank(group, "writing the elastic state", [&] {
        if (group.rank() != 0) return;
        fs::create_directories(dir);
        state->save(statePath(dir, p.step));
        const auto steps = savedSteps(dir);
        for (size_t i = 0; i + static_cast<size_t>(options_.keep) < steps.size(); ++i) {
          std::error_code ec;
          fs::remove(statePath(dir, steps[i]), ec);
        }
      });
    }
    savedAt = p.step;  // not before: a write that a failure cut off is done again
  };

  std::optional<ViewChange> changed;  // told to the callbacks at the new view's start
  state->onViewChange = [&](const comm::View& before, const comm::View& now) {
    const ElasticStats& s = state->stats();
    changed = ViewChange{.generation = static_cast<int64_t>(now.generation),
                         .oldSize = before.size(),
                         .newSize = now.size(),
                         .rank = state->group()->rank(),
                         .resumedStep = s.lastResumedStep,
                         .recoverySeconds = s.lastRecoverySeconds};
  };

  std::map<int64_t, Sums> committedSums;  // by step: the last two commits'
  std::vector<EpochMetrics> history;
  Validations validations;
  int64_t epochOfStart = -1;
  Clock::time_point epochStarted;
  bool started = false;
  lastReport_ = Clock::now();
  module_->train();

  state->run([&](comm::Group& view) {
    struct Leave {
      Trainer* trainer;
      bool done = false;
      ~Leave() {
        if (!done) trainer->leaveView();  // the view failed, or admits joiners
      }
    } leave{this};
    enterView(view.shared_from_this());
    comm::Group& g = *workers_;
    const std::shared_ptr<TraceSink>& trace = g.options().trace;
    // A sharded state resumes here, where the view's shards are: while the job is at its very
    // start, every member (all run with the same options) loads the newest sharded checkpoint,
    // resharded to this view, and commits it.
    if (!oneFile && options_.resume && !dir.empty() && state->progress().step == 0) {
      if (const auto got = strategy_->load(shardDir)) {
        loop::require(got->epoch >= 0 && got->batchInEpoch >= 0 && got->batchInEpoch < train.size(),
                      "Trainer: the elastic checkpoint in {} is at position {} of epoch {}, "
                      "outside this training set of {}",
                      shardDir, got->batchInEpoch, got->epoch, train.size());
        savedAt = got->step;
        state->commit({got->step, got->epoch, got->batchInEpoch});
      }
    }
    ElasticProgress p = state->progress();
    at_ = {p.epoch, batchesDone(p.position), p.step};
    if (!dir.empty()) {
      comm::allreduce(g, &savedAt, 1, DataType::kInt64, ReduceOp::kMax);
    }
    if (!started) {
      for (auto& c : callbacks_) c->onFitStart(at_);
      started = true;
    }
    if (changed) {
      for (auto& c : callbacks_) c->onViewChange(*changed);
      changed.reset();
    }
    checkpoint(g);
    // The sums as of the commit every rank continues from (zero for a joiner; a rank that
    // missed that step has its own previous step's, in the same epoch).
    Sums live;
    if (auto it = committedSums.upper_bound(p.step); it != committedSums.begin()) {
      if (std::prev(it)->second.epoch == p.epoch) live = std::prev(it)->second;
    }
    live.epoch = p.epoch;
    lrScale_ = options_.linearScaling ? g.size() : 1;

    while (p.epoch < options_.epochs) {
      if (epochOfStart != p.epoch) {
        epochOfStart = p.epoch;
        epochStarted = Clock::now();
      }
      StepInfo info;
      const auto stepStart = Clock::now();
      const double waitedBefore = strategy_->commWaitSeconds();
      torch::manual_seed(
          mixSeed(options_.seed, static_cast<uint64_t>(g.rank()), static_cast<uint64_t>(p.step)));
      const ElasticStep s = sampler.step(p.epoch, p.position, g.rank(), g.size(), share);
      const auto n = static_cast<int64_t>(s.indices.size());
      const auto order = torch::tensor(s.indices, torch::kInt64);
      double lossSum = 0;  // loss x samples over the micro-batches
      if (n == 0) {
        strategy_->beforeForward();
        strategy_->backward(zeroLoss(*module_), true);
      }
      for (int64_t at = 0; at < n; at += options_.batch) {
        const int64_t rows = std::min(options_.batch, n - at);
        torch::Tensor x, y;
        {
          TraceScope span(trace, "data", "train");
          const auto dataStart = Clock::now();
          const auto idx = order.narrow(0, at, rows);
          x = train.inputs.index_select(0, idx);
          y = train.targets.index_select(0, idx);
          info.dataSeconds += secondsSince(dataStart);
        }
        // Each micro-batch's mean loss x its share of the step's samples (x the view's size, as
        // DDP averages): the update is the mean over the step's samples, however spread.
        const double divisor =
            static_cast<double>(s.total) / (static_cast<double>(rows) * g.size());
        lossSum += forwardBackward(x, y, divisor, at + rows == n) * static_cast<double>(rows);
      }
      const ElasticProgress next = p.after(s.nextPosition, epochSamples);
      info.epoch = p.epoch;
      info.loss = n > 0 ? lossSum / static_cast<double>(n) : 0;
      info.samples = n;
      info.jobSamples = s.total;
      info.batchInEpoch = next.epoch != p.epoch ? batchesInEpoch : batchesDone(next.position);
      info.batchesInEpoch = batchesInEpoch;
      endStep(info, learningRate(scheduleStep(p)), stepStart, waitedBefore);
      live.loss += lossSum;
      live.samples += static_cast<double>(n);
      live.seconds += info.seconds;
      live.since[0] += lossSum;
      live.since[1] += static_cast<double>(n);

      const bool epochEnds = next.epoch != p.epoch;
      validateIfDue(validation, live.since, validations);
      if (epochEnds) {
        double sums[2] = {live.loss, live.samples};
        sumOverWorkers(g, sums, 2);
        EpochMetrics m;
        m.epoch = p.epoch;
        m.step = at_.step;
        m.trainLoss = sums[1] > 0 ? sums[0] / sums[1] : 0;
        m.samples = static_cast<int64_t>(sums[1]);
        m.trainSeconds = live.seconds;
        addEpochValidation(m, validation, live.since, validations);
        m.seconds = secondsSince(epochStarted);
        for (auto& c : callbacks_) c->onEpoch(m);
        // A step run again after a view change ends its epoch again: its metrics replace.
        if (!history.empty() && history.back().epoch == m.epoch) history.pop_back();
        history.push_back(m);
        live = Sums{.epoch = next.epoch};
      }
      // The sums go in first: a commit that admits joiners leaves by an exception after the
      // state is committed.
      committedSums[next.step] = live;
      while (committedSums.size() > 2) committedSums.erase(committedSums.begin());
      state->commit(next);
      p = next;
      at_ = {p.epoch, batchesDone(p.position), p.step};
      checkpoint(g);
    }
    leave.done = true;
  });
  strategy_->finish();
  return history;
}

}  // namespace shoal::train
