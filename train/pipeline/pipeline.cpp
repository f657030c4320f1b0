#include "train/pipeline/pipeline.h"

#include <fmt/format.h>

#include <chrono>
#include <iostream>

#include "comm/collectives.h"
#include "comm/op_code.h"
#include "common/error.h"
#include "train/activation_checkpoint.h"

namespace shoal::train::pipeline {

namespace {

// A failure of this rank's own making (a stage that produced the wrong shape, a layer that
// threw, a bad header) fails the group with its text, so that a peer waiting on this rank
// reports it as the cause (Note [Root cause] in comm/native/native_engine.cpp) instead of a
// bare "connection closed". Failures the engine raised were recorded by it already.
void tellPeers(comm::Group& g, const std::exception_ptr& error) noexcept {
  std::string text;
  try {
    std::rethrow_exception(error);
  } catch (const PeerError&) {
    return;
  } catch (const TimeoutError&) {
    return;
  } catch (const std::exception& e) {
    text = e.what();
  } catch (...) {
    text = "unknown exception";
  }
  try {
    // A PeerError with this rank as its origin: the abort record the peers adopt is the text.
    g.runTask(comm::op::kInternal, false, {}, [&](uint64_t, const Deadline&) {
      PeerError e(text);
      e.setOrigin(g.rank());
      throw e;
    });
  } catch (...) {
    // The group is failed now (or was already): what the caller gets is the original error.
  }
}

struct StageImpl : torch::nn::Module {
  explicit StageImpl(std::vector<torch::nn::Sequential> c) : chunks(std::move(c)) {
    for (size_t i = 0; i < chunks.size(); ++i)
      register_module(fmt::format("chunk{}", i), chunks[i]);
  }
  std::vector<torch::nn::Sequential> chunks;
};

}  // namespace

Pipeline::Pipeline(torch::nn::Sequential model, const Grid& grid,
                   const torch::Tensor& sampleMicroBatch, LossFn loss, PipelineOptions options)
    : grid_(grid), options_(std::move(options)) {
  SHOAL_CHECK(grid_.world && grid_.pipe && grid_.data, "pipeline: the grid has no groups");
  SHOAL_CHECK(loss != nullptr, "pipeline: no loss function");
  const bool interleaved = options_.schedule == "interleaved";
  if (options_.chunks < 1 || (!interleaved && options_.chunks != 1)) {
    SHOAL_THROW(InvalidArgument,
                "pipeline: {} chunks per rank with schedule '{}' (only 'interleaved' runs more "
                "than one)",
                options_.chunks, options_.schedule);
  }
  schedule_ = makeSchedule(options_.schedule, grid_.stages, options_.microBatches, options_.chunks);
  check(schedule_);

  // The plan: made on world rank 0, the same on every rank. What can fail on rank 0 alone
  // (the sample does not fit the model) travels as an error, so every rank throws it.
  PlanRequest request;
  request.virtualStages = schedule_.virtualStages();
  request.stages = grid_.stages;
  request.split = options_.split;
  request.boundaries = options_.boundaries;
  request.profileRepeats = options_.profileRepeats;
  const int layers = static_cast<int>(model->size());
  validate(request, layers);
  std::string bytes;
  // With tensor parallelism the layers' forward and backward are collective over the tensor
  // group, so world rank 0's tensor-parallel peers (replica 0, stage 0) plan beside it, running
  // the same collectives; only rank 0's plan is broadcast.
  if (grid_.world->rank() == 0 || (grid_.replica == 0 && grid_.stage == 0)) {
    try {
      bytes = "ok\n" + encode(makePlan(model, sampleMicroBatch, request));
    } catch (const std::exception& e) {
      bytes = std::string("error\n") + e.what();
    }
  }
  if (grid_.world->rank() != 0) bytes.clear();
  bytes = comm::broadcastBytes(*grid_.world, std::move(bytes), 0, size_t{1} << 24);
  if (bytes.rfind("error\n", 0) == 0) {
    SHOAL_THROW(InvalidArgument, "pipeline: planning on world rank 0 failed: {}", bytes.substr(6));
  }
  SHOAL_CHECK(bytes.rfind("ok\n", 0) == 0, "pipeline: a plan without its status");
  plan_ = decode(bytes.substr(3), request.virtualStages, layers);
  if (options_.printPlan && grid_.world->rank() == 0) {
    std::cout << grid_.describe() << "\n"
              << "schedule " << schedule_.name << ", " << schedule_.microBatches
              << " micro-batches, " << schedule_.chunks << " chunk(s) per rank"
              << (options_.checkpointActivations ? ", activation checkpointing" : "") << "\n"
              << plan_.table << std::flush;
  }

  // This rank's chunks share the model's layers (no copy).
  std::vector<torch::nn::Sequential> chunks;
  std::vector<std::string> names;
  for (const auto& item : model->named_children()) names.push_back(item.key());
  for (int c = 0; c < schedule_.chunks; ++c) {
    const int s = schedule_.virtualStage(grid_.stage, c);
    torch::nn::Sequential chunk;
    for (int l = plan_.boundaries[s]; l < plan_.boundaries[s + 1]; ++l) {
      chunk->push_back(names[static_cast<size_t>(l)], *(model->begin() + l));
    }
    chunks.push_back(chunk);
  }
  stage_ = std::make_shared<StageImpl>(chunks);

  ExecutorHooks hooks;
  hooks.trace = grid_.world->options().trace;
  if (options_.checkpointActivations) {
    hooks.forward = [](torch::nn::Sequential& chunk, const torch::Tensor& x) {
      return checkpoint([&chunk](const torch::Tensor& in) { return chunk->forward(in); }, x);
    };
  }
  if (grid_.replicas > 1) {
    DdpOptions ddp = options_.ddp;
    // Buffers stay per replica: a broadcast before each micro-batch's forward would cost a
    // synchronization per micro-batch (LayerNorm models have none).
    ddp.broadcastBuffers = false;
    // A chunk untouched by the rank's last backward (interleaved) contributes what it
    // accumulated, which is what "unused" parameters do (train/ddp/reducer.cpp).
    ddp.findUnusedParameters = true;
    ddp_ = std::make_unique<DistributedDataParallel>(stage_, grid_.data, ddp);
    hooks.setSync = [this](bool sync) {
      if (sync) {
        noSync_.reset();
      } else if (!noSync_) {
        noSync_.emplace(*ddp_);
      }
    };
  }
  transfers_ =
      std::make_unique<Transfers>(grid_.pipe, schedule_, plan_.crossing, options_.transfers);
  executor_ = std::make_unique<Executor>(schedule_, grid_.stage, std::move(chunks), *transfers_,
                                         std::move(loss), std::move(hooks));
}

Pipeline::~Pipeline() = default;

torch::Tensor Pipeline::step(const torch::Tensor& inputs, const torch::Tensor& targets) {
  const int m = schedule_.microBatches;
  std::vector<torch::Tensor> in, tg;
  std::vector<double> scales;
  auto split = [&](const torch::Tensor& t, const char* what) {
    SHOAL_CHECK(t.defined() && t.dim() >= 1, "pipeline step: stage {} needs the batch's {}",
                grid_.stage, what);
    if (t.size(0) < m) {
      SHOAL_THROW(InvalidArgument, "pipeline step: a batch of {} {} cannot make {} micro-batches",
                  t.size(0), what, m);
    }
    return t.tensor_split(m, 0);
  };
  if (hasFirstStage()) in = split(inputs, "inputs");
  if (hasLastStage()) {
    tg = split(targets, "targets");
    for (const auto& t : tg) {
      scales.push_back(static_cast<double>(t.size(0)) / static_cast<double>(targets.size(0)));
    }
  }
  double loss = 0;
  const auto start = std::chrono::steady_clock::now();
  try {
    loss = executor_->run(step_, in, tg, scales);
    if (ddp_) ddp_->finishGradientSync();
  } catch (...) {
    noSync_.reset();
    ++step_;
    tellPeers(*grid_.pipe, std::current_exception());
    if (ddp_) tellPeers(*grid_.data, std::current_exception());
    throw;
  }
  ++step_;
  if (options_.broadcastLoss) {
    comm::broadcast(*grid_.pipe, &loss, 1, DataType::kFloat64, grid_.stages - 1);
  }
  stats_ = executor_->stats();
  stats_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  chunkComputeSeconds_.resize(stats_.chunkComputeSeconds.size(), 0.0);
  for (size_t c = 0; c < chunkComputeSeconds_.size(); ++c) {
    chunkComputeSeconds_[c] += stats_.chunkComputeSeconds[c];
  }
  ++stepsMeasured_;
  if (options_.broadcastLoss || hasLastStage()) return torch::tensor(loss, torch::kFloat64);
  return torch::Tensor();
}

}  // namespace shoal::train::pipeline

namespace shoal::train::pipeline {

SplitAdvice Pipeline::splitAdvice() {
  SHOAL_CHECK(stepsMeasured_ > 0, "pipeline split advice: no step measured yet");
  const size_t chunks = static_cast<size_t>(schedule_.chunks);
  SHOAL_ASSERT(chunkComputeSeconds_.size() == chunks, "{} chunk times for {} chunks",
               chunkComputeSeconds_.size(), chunks);
  std::vector<double> mine(chunks);
  for (size_t c = 0; c < chunks; ++c) {
    mine[c] = 1e3 * chunkComputeSeconds_[c] / static_cast<double>(stepsMeasured_);
  }
  // Gathered rank-major (rank r's chunks at r * chunks), reordered by virtual stage.
  std::vector<double> gathered(static_cast<size_t>(grid_.stages) * chunks);
  comm::allgather(*grid_.pipe, mine.data(), gathered.data(), chunks, DataType::kFloat64);
  std::vector<double> perVirtualStage(gathered.size());
  for (int r = 0; r < grid_.stages; ++r) {
    for (int c = 0; c < schedule_.chunks; ++c) {
      perVirtualStage[static_cast<size_t>(schedule_.virtualStage(r, c))] =
          gathered[static_cast<size_t>(r) * chunks + static_cast<size_t>(c)];
    }
  }
  return adviseSplit(plan_.layerMs, plan_.boundaries, perVirtualStage, schedule_.chunks);
}

torch::Tensor Pipeline::predict(const torch::Tensor& inputs) {
  std::vector<torch::Tensor> in;
  if (hasFirstStage()) {
    SHOAL_CHECK(inputs.defined() && inputs.dim() >= 1 && inputs.size(0) >= schedule_.microBatches,
                "pipeline predict: the first stage needs a batch of at least {} inputs",
                schedule_.microBatches);
    in = inputs.tensor_split(schedule_.microBatches, 0);
  }
  std::vector<torch::Tensor> outputs;
  try {
    outputs = executor_->forwardOnly(step_++, in);
  } catch (...) {
    tellPeers(*grid_.pipe, std::current_exception());
    throw;
  }
  return outputs.empty() ? torch::Tensor() : torch::cat(outputs, 0);
}

}  // namespace shoal::train::pipeline
