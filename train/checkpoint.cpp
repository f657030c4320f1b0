#include "train/checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "comm/collectives.h"
#include "common/error.h"
#include "common/sealed_file.h"
#include "common/trace.h"
#include "train/archive_bounds.h"

namespace shoal::train {

namespace {

torch::Tensor rngState() {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
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
      torch::serialize::OutputArchive archive;
      for (auto& p : model.named_parameters(true)) archive.write("param/" + p.key(), p.value());
      for (auto& b : model.named_buffers(true)) archive.write("buffer/" + b.key(), b.value(), true);
      torch::serialize::OutputArchive optArchive;
      opt.save(optArchive);
      archive.write("optimizer", optArchive);
      archive.write("progress", torch::tensor({progress.epoch, progress.batchInEpoch, progress.step,
                                               int64_t(group.size())}));
      archive.write("rng", all);
      std::ostringstream payload;
      archive.save_to(payload);
      const std::string bytes = payload.str();
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
  // tensor of another shape or type, or a malformed archive, is one line naming the file and
  // what is wrong (libtorch's own errors are pages of backtrace), and nothing is copied into the
  // model until the tensor is known to fit.
  auto refuse = [&](const std::string& what) {
    SHOAL_THROW(InvalidArgument, "rank {}: checkpoint {}: {}", group.rank(), path, what);
  };
  auto firstLine = [](const std::string& s) { return s.substr(0, s.find('\n')); };
  torch::serialize::InputArchive archive;
  try {
    checkArchiveBounds(payload);  // before libtorch allocates what the archive claims
  } catch (const InvalidArgument& e) {
    refuse(e.what());
  }
  try {
    std::istringstream in(payload);
    archive.load_from(in);
  } catch (const c10::Error& e) {
    refuse("not a readable archive: " + firstLine(e.what_without_backtrace()));
  } catch (const std::exception& e) {
    // libtorch also throws its script parser's errors and std::out_of_range on crafted archives.
    refuse("not a readable archive: " + firstLine(e.what()));
  }
  auto read = [&](const std::string& key, const torch::Tensor& like, bool buffer) {
    torch::Tensor t;
    try {
      archive.read(key, t, buffer);
    } catch (const c10::Error& e) {
      refuse(fmt::format("'{}' cannot be read: {}", key, firstLine(e.what_without_backtrace())));
    } catch (const std::exception& e) {
      refuse(fmt::format("'{}' cannot be read: {}", key, firstLine(e.what())));
    }
    if (!t.defined() || t.sizes() != like.sizes() || t.scalar_type() != like.scalar_type()) {
      auto describe = [](const torch::Tensor& x) {
        return fmt::format("{} [{}]", toString(x.scalar_type()), fmt::join(x.sizes(), ", "));
      };
      refuse(fmt::format("'{}' is {}, the model has {}", key, t.defined() ? describe(t) : "missing",
                         describe(like)));
    }
    return t;
  };
  torch::NoGradGuard noGrad;
  std::vector<std::pair<torch::Tensor, torch::Tensor>> copies;  // (into, from), all checked first
  for (auto& p : model.named_parameters(true)) {
    copies.emplace_back(p.value(), read("param/" + p.key(), p.value(), false));
  }
  for (auto& b : model.named_buffers(true)) {
    copies.emplace_back(b.value(), read("buffer/" + b.key(), b.value(), true));
  }
  torch::Tensor progress, rng;
  try {
    archive.read("progress", progress);
    archive.read("rng", rng);
  } catch (const c10::Error& e) {
    refuse("progress or RNG state cannot be read: " + firstLine(e.what_without_backtrace()));
  } catch (const std::exception& e) {
    refuse("progress or RNG state cannot be read: " + firstLine(e.what()));
  }
  if (!progress.defined() || progress.scalar_type() != torch::kInt64 || progress.dim() != 1 ||
      progress.size(0) != 4) {
    refuse("the progress record is malformed");
  }
  if (progress[3].item<int64_t>() != group.size()) {
    SHOAL_THROW(InvalidArgument,
                "checkpoint {} was written by {} ranks; this job has {} (the data order and RNG "
                "streams would not continue exactly)",
                path, progress[3].item<int64_t>(), group.size());
  }
  if (!rng.defined() || rng.scalar_type() != torch::kUInt8 || rng.dim() != 2 ||
      rng.size(0) != group.size() || rng.size(1) != rngState().numel()) {
    refuse("the RNG states are malformed");
  }
  if (progress[0].item<int64_t>() < 0 || progress[1].item<int64_t>() < 0 ||
      progress[2].item<int64_t>() < 0) {
    refuse("the progress record holds a negative count");
  }
  // A state of the right size can still be one libtorch refuses ("Invalid mt19937 state", found
  // by fuzz/train/checkpoint_fuzz.cpp): every rank's is tried on a scratch generator first, so
  // that every rank refuses the file alike, in one line, before anything is copied.
  for (int64_t r = 0; r < rng.size(0); ++r) {
    try {
      at::Generator scratch = at::detail::createCPUGenerator();
      scratch.set_state(rng[r].clone());
    } catch (const c10::Error& e) {
      refuse(fmt::format("the RNG state of rank {} is invalid: {}", r,
                         firstLine(e.what_without_backtrace())));
    }
  }
  for (auto& [into, from] : copies) into.copy_(from);
  try {
    torch::serialize::InputArchive optArchive;
    archive.read("optimizer", optArchive);
    opt.load(optArchive);
  } catch (const c10::Error& e) {
    refuse("the optimizer state does not fit this optimizer: " +
           firstLine(e.what_without_backtrace()));
  }
  {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(rng[group.rank()].clone());
  }
  return {progress[0].item<int64_t>(), progress[1].item<int64_t>(), progress[2].item<int64_t>()};
}

}  // namespace shoal::train
