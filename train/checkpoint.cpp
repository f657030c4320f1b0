#include "train/checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/ranges.h>

#include <charconv>
#include <cmath>
#include <functional>
#include <map>

#include "comm/collectives.h"
#include "common/error.h"
#include "common/sealed_file.h"
#include "common/trace.h"
#include "train/optimizer_state.h"
#include "train/tensor_bundle.h"
#include "train/tensor_types.h"

namespace shoal::train {

namespace {

torch::Tensor rngState() {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

// The optimizer's parameters, flattened over its param groups (the indexes of
// train/optimizer_state.h).
size_t optimizerParams(torch::optim::Optimizer& opt) {
  size_t n = 0;
  for (auto& g : opt.param_groups()) n += g.params().size();
  return n;
}

// The names inside a checkpoint's bundle. Optimizer state is stored per parameter index,
// independent of the optimizer's class, as train/optimizer_state.h exports it: one file
// format, one decoder, nothing a crafted file can make libtorch interpret.
constexpr std::string_view kKind = "checkpoint";
constexpr const char* kProgress = "progress";  // int64 [epoch, batchInEpoch, step, world size]
constexpr const char* kRng = "rng";            // uint8 [world size, state bytes]
constexpr std::string_view kParam = "param/";
constexpr std::string_view kBuffer = "buffer/";
constexpr std::string_view kOptimizer = "optimizer/";  // optimizer/<index>/<key>, .../step
constexpr std::string_view kLearningRate = "lr/";      // lr/<param group>, float64 scalar

// "optimizer/<index>/<key>" split into its index and key; nothing when it is not one.
std::optional<std::pair<size_t, std::string>> optimizerKey(std::string_view name) {
  if (name.substr(0, kOptimizer.size()) != kOptimizer) return std::nullopt;
  name.remove_prefix(kOptimizer.size());
  const size_t slash = name.find('/');
  if (slash == std::string_view::npos || slash == 0 || slash + 1 == name.size()) {
    return std::nullopt;
  }
  size_t index = 0;
  const auto [end, ec] = std::from_chars(name.data(), name.data() + slash, index);
  if (ec != std::errc() || end != name.data() + slash) return std::nullopt;
  return std::pair{index, std::string(name.substr(slash + 1))};
}

using Refuse = std::function<void(const std::string&)>;  // throws

// A state of the right size can still be one libtorch refuses ("Invalid mt19937 state", found
// by fuzz/train/checkpoint_fuzz.cpp): every rank's is tried on a scratch generator first, so
// that every rank refuses the file alike, in one line, before anything is copied.
void checkRngStates(const torch::Tensor& rng, const Refuse& refuse) {
  for (int64_t r = 0; r < rng.size(0); ++r) {
    try {
      at::Generator scratch = at::detail::createCPUGenerator();
      scratch.set_state(rng[r].clone());
    } catch (const c10::Error& e) {
      const std::string what = e.what_without_backtrace();
      refuse(fmt::format("the RNG state of rank {} is invalid: {}", r,
                         what.substr(0, what.find('\n'))));
    }
  }
}

// The optimizer/<index>/<key> entries taken out of `entries`, by parameter index (of `params`).
std::vector<std::optional<ParamState>> takeOptimizerStates(
    std::map<std::string, torch::Tensor>& entries, size_t params, const Refuse& refuse) {
  std::vector<std::optional<ParamState>> states(params);
  for (auto it = entries.begin(); it != entries.end();) {
    const auto key = optimizerKey(it->first);
    if (!key) {
      ++it;
      continue;
    }
    if (key->first >= params) {
      refuse(fmt::format("'{}' is the state of parameter {}; the optimizer has {}", it->first,
                         key->first, params));
    }
    auto& state = states[key->first];
    if (!state) state.emplace();
    if (key->second == "step") {
      const torch::Tensor& step = it->second;
      if (step.scalar_type() != torch::kInt64 || step.dim() != 0) {
        refuse(fmt::format("'{}' is {}, not an int64 scalar", it->first, describe(step)));
      }
      state->step = step.item<int64_t>();
    } else {
      state->tensors.emplace_back(key->second, it->second);
    }
    it = entries.erase(it);
  }
  return states;
}

}  // namespace

Checkpointer::Checkpointer(std::string dir, int keep)
    : series_(std::move(dir), "ckpt-", ".pt", keep) {}

std::vector<std::string> Checkpointer::list() const {
  std::vector<std::string> out;
  for (auto& [step, path] : series_.list()) out.push_back(path);
  return out;
}

void Checkpointer::verify(const std::string& path) {
  readSealedFile(path);
}

std::optional<std::string> Checkpointer::latest() const {
  return series_.latest();
}

std::string Checkpointer::save(comm::Group& group, torch::nn::Module& model,
                               torch::optim::Optimizer& opt, const Progress& progress) {
  // An optimizer whose state cannot be written is refused on every rank alike, before anything.
  if (optimizerParams(opt) > 0) (void)exportState(opt, 0);
  // Every rank's RNG (dropout differs per rank), gathered on rank 0.
  auto mine = rngState().contiguous();
  const size_t rngBytes = static_cast<size_t>(mine.numel());
  auto all = torch::empty({group.size(), static_cast<int64_t>(rngBytes)}, torch::kUInt8);
  comm::gather(group, mine.data_ptr(), all.data_ptr(), rngBytes, DataType::kUInt8, 0);
  const std::string path = series_.pathFor(progress.step);
  int ok = 1;
  std::string error;
  if (group.rank() == 0) {
    try {
      TraceScope span(group.options().trace, "checkpoint write", "checkpoint");
      TensorBundle bundle;
      bundle.emplace_back(kProgress, torch::tensor({progress.epoch, progress.batchInEpoch,
                                                    progress.step, int64_t(group.size())}));
      bundle.emplace_back(kRng, all);
      for (auto& p : model.named_parameters(true)) {
        bundle.emplace_back(std::string(kParam) + p.key(), p.value());
      }
      for (auto& b : model.named_buffers(true)) {
        bundle.emplace_back(std::string(kBuffer) + b.key(), b.value());
      }
      for (size_t i = 0; i < optimizerParams(opt); ++i) {
        const auto state = exportState(opt, i);
        if (!state) continue;  // no step has touched it yet
        const std::string prefix = fmt::format("{}{}/", kOptimizer, i);
        bundle.emplace_back(prefix + "step", torch::tensor(state->step));
        for (auto& [key, t] : state->tensors) bundle.emplace_back(prefix + key, t);
      }
      for (size_t g = 0; g < opt.param_groups().size(); ++g) {
        bundle.emplace_back(
            fmt::format("{}{}", kLearningRate, g),
            torch::tensor(opt.param_groups()[g].options().get_lr(), torch::kFloat64));
      }
      const std::string bytes = encodeTensorBundle(kKind, bundle);
      series_.write(progress.step, bytes);
      span.arg("step", progress.step).arg("bytes", bytes.size());
    } catch (const std::exception& e) {
      ok = 0;
      error = e.what();
    }
  }
  // Every rank learns whether the checkpoint exists.
  comm::broadcast(group, &ok, 1, DataType::kInt32, 0);
  if (!ok) {
    SHOAL_THROW(SystemError, "rank {}: writing checkpoint {} failed{}", group.rank(), path,
                error.empty() ? " on rank 0" : ": " + error);
  }
  return path;
}

Progress Checkpointer::load(comm::Group& group, const std::string& path, torch::nn::Module& model,
                            torch::optim::Optimizer& opt) {
  // Rank 0 verifies and then every rank reads (the file is on rank 0's disk; ranks of other
  // hosts get the bytes through the group).
  std::string payload;
  int64_t len = 0;
  std::string error;
  if (group.rank() == 0) {
    try {
      payload = readSealedFile(path);
      len = static_cast<int64_t>(payload.size());
    } catch (const InvalidArgument& e) {
      error = e.what();
      len = -1;
    }
  }
  comm::broadcast(group, &len, 1, DataType::kInt64, 0);
  if (len < 0) {
    SHOAL_THROW(
        InvalidArgument, "rank {}: {}", group.rank(),
        error.empty() ? "checkpoint " + path + " is truncated or corrupt (see rank 0)" : error);
  }
  payload.resize(static_cast<size_t>(len));
  comm::broadcast(group, payload.data(), payload.size(), DataType::kUInt8, 0);

  // The file passed its checksum, but its content is still checked before it is used: a
  // tensor of another shape or type, or a malformed bundle, is one line naming the file and
  // what is wrong, and nothing is changed until everything is known to fit.
  auto refuse = [&](const std::string& what) {
    SHOAL_THROW(InvalidArgument, "rank {}: checkpoint {}: {}", group.rank(), path, what);
  };
  if (looksLikeLibtorchArchive(payload)) {
    refuse(
        "a libtorch archive, as Shoal wrote checkpoints before tensor bundles "
        "(train/tensor_bundle.h); this Shoal does not read them (loading one runs libtorch's "
        "TorchScript importer, which a crafted file crashes): resume it with the Shoal that "
        "wrote it");
  }
  std::map<std::string, torch::Tensor> entries;
  try {
    for (auto& [name, t] : decodeTensorBundle(payload, kKind, "the bundle"))
      entries.emplace(name, t);
  } catch (const InvalidArgument& e) {
    refuse(e.what());
  }
  auto take = [&](const std::string& name) {
    auto node = entries.extract(name);
    return node ? node.mapped() : torch::Tensor();
  };

  const torch::Tensor progress = take(kProgress), rng = take(kRng);
  if (!progress.defined() || progress.scalar_type() != torch::kInt64 || progress.dim() != 1 ||
      progress.size(0) != 4) {
    refuse(progress.defined() ? "the progress record is " + describe(progress) + ", not int64 [4]"
                              : "it holds no progress record");
  }
  const int64_t* counts = progress.data_ptr<int64_t>();
  if (counts[3] != group.size()) {
    SHOAL_THROW(InvalidArgument,
                "checkpoint {} was written by {} ranks; this job has {} (the data order and RNG "
                "streams would not continue exactly)",
                path, counts[3], group.size());
  }
  if (counts[0] < 0 || counts[1] < 0 || counts[2] < 0) {
    refuse("the progress record holds a negative count");
  }
  if (!rng.defined() || rng.scalar_type() != torch::kUInt8 || rng.dim() != 2 ||
      rng.size(0) != group.size() || rng.size(1) != rngState().numel()) {
    refuse("the RNG states are malformed");
  }
  checkRngStates(rng, refuse);

  std::vector<std::pair<torch::Tensor, torch::Tensor>> copies;  // (into, from), all checked first
  auto modelTensor = [&](const std::string& name, const torch::Tensor& like) {
    const torch::Tensor t = take(name);
    if (!t.defined() || t.sizes() != like.sizes() || t.scalar_type() != like.scalar_type()) {
      refuse(fmt::format("'{}' is {}, the model has {}", name,
                         t.defined() ? describe(t) : "missing", describe(like)));
    }
    copies.emplace_back(like, t);
  };
  for (auto& p : model.named_parameters(true))
    modelTensor(std::string(kParam) + p.key(), p.value());
  for (auto& b : model.named_buffers(true)) modelTensor(std::string(kBuffer) + b.key(), b.value());

  std::vector<double> rates(opt.param_groups().size());
  for (size_t g = 0; g < rates.size(); ++g) {
    const torch::Tensor lr = take(fmt::format("{}{}", kLearningRate, g));
    if (!lr.defined() || lr.scalar_type() != torch::kFloat64 || lr.dim() != 0) {
      refuse(fmt::format("the learning rate of param group {} is {}", g,
                         lr.defined() ? describe(lr) : "missing"));
    }
    rates[g] = lr.item<double>();
    if (!std::isfinite(rates[g]) || rates[g] < 0) {
      refuse(fmt::format("the learning rate of param group {} is {}", g, rates[g]));
    }
  }
  const auto states = takeOptimizerStates(entries, optimizerParams(opt), refuse);
  if (!entries.empty()) {
    refuse(fmt::format("'{}' is not a parameter, buffer or optimizer state of this model",
                       entries.begin()->first));
  }

  try {
    replaceStates(opt, states);  // whole or not at all
  } catch (const InvalidArgument& e) {
    refuse(e.what());
  }
  torch::NoGradGuard noGrad;
  for (auto& [into, from] : copies) into.copy_(from);
  for (size_t g = 0; g < rates.size(); ++g) opt.param_groups()[g].options().set_lr(rates[g]);
  {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(rng[group.rank()].clone());
  }
  return {counts[0], counts[1], counts[2]};
}

}  // namespace shoal::train
