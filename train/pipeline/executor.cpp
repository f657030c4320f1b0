#include "train/pipeline/executor.h"

#include <malloc.h>

#include <chrono>

#include "common/error.h"
#include "common/trace.h"

namespace shoal::train::pipeline {

namespace {

int64_t nowUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Bytes the heap holds now (small blocks and mmapped ones): what tensors kept in flight cost.
int64_t heapBytes() {
  const struct mallinfo2 m = mallinfo2();
  return static_cast<int64_t>(m.uordblks + m.hblkhd);
}

// `e` again, as the same type with the same origin, its message after `prefix`.
template <typename E>
[[noreturn]] void rethrowAs(const Error& e, const std::string& prefix) {
  E copy(prefix + e.what());
  copy.setOrigin(e.origin());
  throw copy;
}

[[noreturn]] void rethrowWithContext(const std::string& prefix) {
  try {
    throw;
  } catch (const TimeoutError& e) {
    rethrowAs<TimeoutError>(e, prefix);
  } catch (const PeerError& e) {
    rethrowAs<PeerError>(e, prefix);
  } catch (const MismatchError& e) {
    rethrowAs<MismatchError>(e, prefix);
  } catch (const ProtocolError& e) {
    rethrowAs<ProtocolError>(e, prefix);
  } catch (const InvalidArgument& e) {
    rethrowAs<InvalidArgument>(e, prefix);
  } catch (const InternalError& e) {
    rethrowAs<InternalError>(e, prefix);
  } catch (const Error& e) {
    rethrowAs<Error>(e, prefix);
  } catch (const std::exception& e) {
    // libtorch's own errors (a shape that does not fit a layer, ...).
    throw Error(prefix + e.what());
  }
}

}  // namespace

Executor::Executor(const Schedule& schedule, int rank, std::vector<torch::nn::Sequential> chunks,
                   Transfers& transfers, LossFn loss, ExecutorHooks hooks)
    : schedule_(schedule),
      rank_(rank),
      chunks_(std::move(chunks)),
      transfers_(transfers),
      loss_(std::move(loss)),
      hooks_(std::move(hooks)) {
  SHOAL_CHECK(static_cast<int>(chunks_.size()) == schedule_.chunks,
              "pipeline: {} chunks for a schedule of {} per rank", chunks_.size(),
              schedule_.chunks);
  slots_.resize(static_cast<size_t>(schedule_.chunks * schedule_.microBatches));
}

double Executor::run(int64_t step, const std::vector<torch::Tensor>& inputs,
                     const std::vector<torch::Tensor>& targets, const std::vector<double>& scales) {
  double lossSum = 0;
  if (hooks_.setSync) hooks_.setSync(false);
  runList(schedule_.ranks[rank_], step, inputs, targets, scales, lossSum);
  return lossSum;
}

std::vector<torch::Tensor> Executor::forwardOnly(int64_t step,
                                                 const std::vector<torch::Tensor>& inputs) {
  // Micro-batch by micro-batch, chunk by chunk: each receive waits on an earlier virtual
  // stage only, and every boundary carries its micro-batches in order, so no rank can wait on
  // one that waits on it.
  std::vector<Action> list;
  for (int mb = 0; mb < schedule_.microBatches; ++mb) {
    for (int c = 0; c < schedule_.chunks; ++c) {
      const int s = schedule_.virtualStage(rank_, c);
      if (s > 0) list.push_back({ActionKind::kRecvActivation, mb, c});
      list.push_back({ActionKind::kForward, mb, c});
      if (s + 1 < schedule_.virtualStages()) list.push_back({ActionKind::kSendActivation, mb, c});
    }
  }
  torch::NoGradGuard noGrad;
  // stats() and trace() stay those of the last training step.
  StepStats stats = stats_;
  std::vector<TraceEvent> trace = std::move(trace_);
  forwardOnly_ = true;
  results_.clear();
  double unused = 0;
  try {
    runList(list, step, inputs, {}, {}, unused);
  } catch (...) {
    forwardOnly_ = false;
    throw;
  }
  forwardOnly_ = false;
  stats_ = stats;
  trace_ = std::move(trace);
  return std::move(results_);
}

void Executor::runList(const std::vector<Action>& list, int64_t step,
                       const std::vector<torch::Tensor>& inputs,
                       const std::vector<torch::Tensor>& targets, const std::vector<double>& scales,
                       double& lossSum) {
  size_t lastBackward = list.size();
  for (size_t i = 0; i < list.size(); ++i) {
    if (list[i].kind == ActionKind::kBackward) lastBackward = i;
  }
  stats_ = StepStats();
  stats_.chunkComputeSeconds.assign(chunks_.size(), 0.0);
  trace_.clear();
  trace_.reserve(list.size());
  inFlight_ = 0;
  const int64_t heapAtStart = heapBytes();
  const int64_t start = nowUs();
  transfers_.beginStep(step, list);
  for (size_t i = 0; i < list.size(); ++i) {
    const Action& a = list[i];
    const int64_t t0 = nowUs();
    try {
      TraceScope span(hooks_.trace, hooks_.trace ? describe(a) : std::string(), "pipeline");
      span.arg("step", step);
      runAction(a, step, inputs, targets, scales, i == lastBackward, lossSum);
    } catch (...) {
      transfers_.abandon();
      for (auto& s : slots_) s = Slot();
      rethrowWithContext(fmt::format("pipeline stage {} (pipeline rank {}), {} of step {}: ",
                                     schedule_.virtualStage(rank_, a.chunk), rank_, describe(a),
                                     step));
    }
    const int64_t t1 = nowUs();
    trace_.push_back({a, t0, t1 - t0});
    if (a.kind == ActionKind::kForward || a.kind == ActionKind::kBackward) {
      stats_.chunkComputeSeconds[static_cast<size_t>(a.chunk)] +=
          static_cast<double>(t1 - t0) * 1e-6;
    }
    stats_.peakActivationBytes = std::max(stats_.peakActivationBytes, heapBytes() - heapAtStart);
  }
  try {
    transfers_.endStep();
  } catch (...) {
    transfers_.abandon();
    rethrowWithContext(
        fmt::format("pipeline rank {}, finishing the sends of step {}: ", rank_, step));
  }
  stats_.seconds = static_cast<double>(nowUs() - start) * 1e-6;
}

void Executor::runAction(const Action& a, int64_t step, const std::vector<torch::Tensor>& inputs,
                         const std::vector<torch::Tensor>& targets,
                         const std::vector<double>& scales, bool lastBackward, double& lossSum) {
  (void)step;
  const int stage = schedule_.virtualStage(rank_, a.chunk);
  const bool first = stage == 0;
  const bool last = stage == schedule_.virtualStages() - 1;
  Slot& s = slot(a);
  switch (a.kind) {
    case ActionKind::kForward: {
      torch::Tensor input;
      if (first) {
        input = inputs.at(static_cast<size_t>(a.microBatch));
      } else {
        // A leaf of this stage's graph: its gradient is what goes back to the previous stage.
        input = s.received.requires_grad_(!forwardOnly_ && s.received.is_floating_point());
        s.received = torch::Tensor();
      }
      torch::Tensor out = hooks_.forward && !forwardOnly_ ? hooks_.forward(chunks_[a.chunk], input)
                                                          : chunks_[a.chunk]->forward(input);
      if (last && forwardOnly_) {
        results_.push_back(out);
      } else if (last) {
        torch::Tensor l = loss_(out, targets.at(static_cast<size_t>(a.microBatch))) *
                          scales.at(static_cast<size_t>(a.microBatch));
        lossSum += l.item<double>();
        s.output = l;
      } else {
        s.output = out;
      }
      if (forwardOnly_) break;  // no backward: the output is kept until sent only
      s.input = input;
      ++inFlight_;
      stats_.peakInFlight = std::max(stats_.peakInFlight, inFlight_);
      break;
    }
    case ActionKind::kBackward: {
      if (lastBackward && hooks_.setSync) hooks_.setSync(true);
      if (last) {
        s.output.backward();
      } else {
        torch::autograd::backward({s.output}, {s.gradient});
      }
      if (!first) {
        s.gradient = s.input.grad();
        if (!s.gradient.defined()) s.gradient = torch::zeros_like(s.input);
      }
      s.output = torch::Tensor();
      s.input = torch::Tensor();
      --inFlight_;
      break;
    }
    case ActionKind::kSendActivation:
      transfers_.send(a, s.output.detach());
      // The output stays for backward; what was sent is a detached alias.
      if (forwardOnly_) s.output = torch::Tensor();
      break;
    case ActionKind::kRecvActivation:
      s.received = transfers_.recv(a);
      break;
    case ActionKind::kSendGradient:
      transfers_.send(a, s.gradient);
      s.gradient = torch::Tensor();
      break;
    case ActionKind::kRecvGradient:
      s.gradient = transfers_.recv(a);
      break;
  }
}

}  // namespace shoal::train::pipeline
