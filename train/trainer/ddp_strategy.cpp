// Strategy::kDdp: DistributedDataParallel, a libtorch optimizer over the replica, sharded
// checkpoints (train/ddp_checkpoint.h) that reload at any world size and into any ZeRO stage.
// Under autotune, the bucket size, overlap and (without compression) the all-reduce algorithm
// are chosen over the first steps (comm/autotuner.h), each candidate a DistributedDataParallel
// rebuilt over the same module. See Note [Autotune candidates].
#include <fmt/format.h>

#include <optional>

#include "comm/autotuner.h"
#include "train/ddp.h"
#include "train/ddp/comm_hook.h"
#include "train/ddp/compression_hook.h"
#include "train/ddp_checkpoint.h"
#include "train/trainer/distribution_strategy.h"

namespace shoal::train {

namespace {

class DdpStrategy final : public DistributionStrategy {
 public:
  explicit DdpStrategy(const StrategyInputs& in)
      : module_(in.module), workers_(in.workers), optimizerOptions_(in.options.optimizer) {
    base_.bucketBytes = in.options.bucketBytes;
    base_.overlap = in.options.overlap;
    if (in.options.compression.enabled()) {
      base_.commHook = ddp::compressionHook(in.options.compression);
    }
    if (in.options.autotune) {
      std::vector<std::string> labels;
      for (size_t bytes : bucketSizes(gradientBytes(*module_))) {
        for (bool overlap : {true, false}) {
          for (auto algorithm : algorithms()) {
            candidates_.push_back({bytes, overlap, algorithm});
            std::string label =
                fmt::format("bucket={}MiB overlap={}", bytes >> 20, overlap ? "on" : "off");
            if (algorithm) label += fmt::format(" alg={}", comm::toString(*algorithm));
            labels.push_back(std::move(label));
          }
        }
      }
      tuner_.emplace(workers_, std::move(labels));
      apply(tuner_->current());
    } else if (!in.ctx.elastic) {  // an elastic job's come with each view (enterView)
      ddp_ = std::make_unique<DistributedDataParallel>(module_, workers_, base_);
    }
    optimizer_ = makeOptimizer(module_->parameters(), optimizerOptions_);
  }

  void beforeForward() override { ddp_->beforeForward(); }

  void backward(const torch::Tensor& loss, bool sync) override {
    if (sync) return ddp_->backward(loss);
    auto local = ddp_->noSync();
    ddp_->backward(loss);
  }

  void step(int64_t, double lr, double clipNorm) override {
    // The gradients are already the average over ranks: the same norm, the same clip, on every
    // rank.
    if (clipNorm > 0) torch::nn::utils::clip_grad_norm_(module_->parameters(), clipNorm);
    setLearningRate(*optimizer_, lr);
    optimizer_->step();
    optimizer_->zero_grad();
  }

  void save(const std::string& dir, const Progress& progress, int keep) override {
    saveDdpShards(ddp_->group(), dir, *module_, *optimizer_, optimizerOptions_, progress, keep,
                  ddp_.get());
  }

  std::optional<Progress> load(const std::string& dir) override {
    return loadDdpShards(ddp_->group(), dir, *module_, *optimizer_, optimizerOptions_, {},
                         ddp_.get());
  }

  CommunicationTotals communication() const override {
    if (!ddp_) return previous_;
    const auto s = ddp_->stats();
    return {previous_.bytesSent + s.bytesSent, previous_.steps + s.steps};
  }
  double commWaitSeconds() const override {
    return previousWait_ + (ddp_ ? ddp_->stats().finishSeconds : 0);
  }
  void waitSpans(Clock::time_point since, std::vector<comm::TimeSpan>& out) const override {
    if (!ddp_) return;
    if (const comm::TimeSpan last = ddp_->stats().lastFinish; last.begin >= since) {
      out.push_back(last);
    }
  }

  // The hook is every view's (base_.commHook): its state goes through the changes with the
  // model's.
  std::unique_ptr<ElasticState> makeElastic(const comm::ElasticContext& context,
                                            std::shared_ptr<comm::Group> group,
                                            ElasticOptions options) override {
    options.commHook = base_.commHook;
    return std::make_unique<ElasticState>(context, std::move(group), *module_, *optimizer_,
                                          std::move(options));
  }
  void enterView(std::shared_ptr<comm::Group> group) override {
    leaveView();
    workers_ = std::move(group);
    ddp_ = std::make_unique<DistributedDataParallel>(module_, workers_, base_);
  }
  void leaveView() override {
    retire();
    workers_.reset();
  }

  std::optional<Choice> noteStepTime(double seconds) override {
    if (!tuner_ || !tuner_->record(seconds)) {
      // Mid-search: the next trial's candidate, from the next step on.
      if (tuner_ && !tuner_->done() && tuner_->current() != applied_) apply(tuner_->current());
      return std::nullopt;
    }
    if (tuner_->best() != applied_) apply(tuner_->best());
    return Choice{static_cast<int>(tuner_->best()), tuner_->describe()};
  }

 private:
  // Note [Autotune candidates]
  // Bucket sizes 1, 4, 25 MiB x overlap on/off x, when the default average all-reduce runs,
  // algorithm auto / ring / rabenseifner. Two pruning rules keep the search short:
  // - Bucket sizes that give the same buckets are tried once. Every bucket size at least the
  //   gradients' total bytes makes the same layout (the first bucket is capped by
  //   firstBucketBytes, the rest all fit in one), so only the smallest of those is kept
  //   (FashionCnn: 1.7 MB of gradients, so 1 and 4 MiB; 25 MiB is 4 MiB's layout).
  // - The algorithm is tuned only without a compression hook. A hook decides its own
  //   collectives (their algorithm is the hook's), and compression settings are never tuned:
  //   they change what is computed, and the tuner may only change how fast.
  // Recursive doubling is not a candidate, to keep the grid at 3 algorithms: `auto` already runs
  // it where it wins (at most 64 KiB per rank), and above that it sends the whole buffer in each
  // of its log2(n) rounds (against Rabenseifner's 2(n-1)/n of it in all).
  struct Candidate {
    size_t bucketBytes;
    bool overlap;
    std::optional<comm::AllreduceAlgorithm> algorithm;  // none: the hook's (compression)
  };

  static size_t gradientBytes(torch::nn::Module& m) {
    size_t total = 0;
    for (const auto& p : m.parameters()) {
      if (p.requires_grad()) total += static_cast<size_t>(p.numel()) * p.element_size();
    }
    return total;
  }

  static std::vector<size_t> bucketSizes(size_t gradientBytes) {
    std::vector<size_t> sizes;
    for (size_t mib : {1, 4, 25}) {
      sizes.push_back(mib << 20);
      if ((mib << 20) >= gradientBytes) break;  // larger ones: the same buckets
    }
    return sizes;
  }

  std::vector<std::optional<comm::AllreduceAlgorithm>> algorithms() const {
    if (base_.commHook) return {std::nullopt};
    return {comm::AllreduceAlgorithm::kAuto, comm::AllreduceAlgorithm::kRing,
            comm::AllreduceAlgorithm::kRabenseifner};
  }

  // A DistributedDataParallel for candidate c (collective: every rank switches at the same
  // step, as the autotuner's trials end at the same step everywhere). The old one goes first:
  // its hooks on the parameters must not fire for the new one's backward.
  void apply(size_t c) {
    retire();
    DdpOptions o = base_;
    o.bucketBytes = candidates_[c].bucketBytes;
    o.overlap = candidates_[c].overlap;
    if (const auto a = candidates_[c].algorithm) {
      o.commHook =
          std::make_shared<ddp::AllreduceHook>(ReduceOp::kAvg, comm::CallOptions{.algorithm = *a});
    }
    ddp_ = std::make_unique<DistributedDataParallel>(module_, workers_, o);
    applied_ = c;
  }

  // Drops the DistributedDataParallel, its totals kept.
  void retire() {
    if (!ddp_) return;
    const auto s = ddp_->stats();
    previous_.bytesSent += s.bytesSent;
    previous_.steps += s.steps;
    previousWait_ += s.finishSeconds;
    ddp_.reset();
  }

  std::shared_ptr<torch::nn::Module> module_;
  std::shared_ptr<comm::Group> workers_;
  OptimizerOptions optimizerOptions_;
  DdpOptions base_;
  std::unique_ptr<DistributedDataParallel> ddp_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::vector<Candidate> candidates_;  // autotune's
  std::optional<comm::Autotuner> tuner_;
  size_t applied_ = 0;
  CommunicationTotals previous_;  // of the DistributedDataParallels replaced
  double previousWait_ = 0;
};

}  // namespace

std::unique_ptr<DistributionStrategy> makeDdpStrategy(const StrategyInputs& in) {
  return std::make_unique<DdpStrategy>(in);
}

}  // namespace shoal::train
