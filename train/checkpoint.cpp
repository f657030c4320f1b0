#include "train/checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "comm/collectives.h"
#include "common/error.h"
#include "common/sealed_file.h"

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
      series_.write(progress.step, payload.str());
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

  std::istringstream in(payload);
  torch::serialize::InputArchive archive;
  archive.load_from(in);
  torch::NoGradGuard noGrad;
  for (auto& p : model.named_parameters(true)) {
    torch::Tensor t;
    archive.read("param/" + p.key(), t);
    p.value().copy_(t);
  }
  for (auto& b : model.named_buffers(true)) {
    torch::Tensor t;
    archive.read("buffer/" + b.key(), t, true);
    b.value().copy_(t);
  }
  torch::serialize::InputArchive optArchive;
  archive.read("optimizer", optArchive);
  opt.load(optArchive);
  torch::Tensor progress, rng;
  archive.read("progress", progress);
  archive.read("rng", rng);
  if (progress[3].item<int64_t>() != group.size()) {
    SHOAL_THROW(InvalidArgument,
                "checkpoint {} was written by {} ranks; this job has {} (the data order and RNG "
                "streams would not continue exactly)",
                path, progress[3].item<int64_t>(), group.size());
  }
  {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(rng[group.rank()].clone());
  }
  return {progress[0].item<int64_t>(), progress[1].item<int64_t>(), progress[2].item<int64_t>()};
}

}  // namespace shoal::train
