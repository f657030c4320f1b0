#include "train/checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fcntl.h>
#include <openssl/sha.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "comm/collectives.h"
#include "common/error.h"

namespace shoal::train {

namespace fs = std::filesystem;

namespace {

constexpr char kMagic[8] = {'S', 'H', 'O', 'A', 'L', 'C', 'K', '1'};
constexpr size_t kFraming = 8 + 8 + SHA256_DIGEST_LENGTH;

std::string readAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) SHOAL_THROW(InvalidArgument, "checkpoint {}: cannot be read", path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The payload, after checking magic, length and checksum.
std::string unwrap(const std::string& path, const std::string& file) {
  if (file.size() < kFraming || std::memcmp(file.data(), kMagic, 8) != 0) {
    SHOAL_THROW(InvalidArgument, "checkpoint {}: not a Shoal checkpoint ({} bytes, bad header)",
                path, file.size());
  }
  uint64_t len = 0;
  std::memcpy(&len, file.data() + 8, 8);
  if (len != file.size() - kFraming) {
    SHOAL_THROW(InvalidArgument,
                "checkpoint {}: truncated or padded: header says {} bytes of "
                "payload, the file holds {}",
                path, len, file.size() - std::min(file.size(), kFraming));
  }
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(file.data() + 16), len, digest);
  if (std::memcmp(digest, file.data() + 16 + len, SHA256_DIGEST_LENGTH) != 0) {
    SHOAL_THROW(InvalidArgument, "checkpoint {}: checksum mismatch (the file is corrupt)", path);
  }
  return file.substr(16, len);
}

void writeDurably(const std::string& path, const std::string& bytes) {
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throwSystemError("open " + tmp, errno);
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t w = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) {
      int err = errno;
      ::close(fd);
      throwSystemError("write " + tmp, err);
    }
    done += static_cast<size_t>(w);
  }
  if (::fsync(fd) != 0) {
    int err = errno;
    ::close(fd);
    throwSystemError("fsync " + tmp, err);
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) throwSystemError("rename " + tmp, errno);
  // The rename itself is durable only once the folder is.
  int dfd = ::open(fs::path(path).parent_path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

int64_t stepOf(const fs::path& p) {
  // ckpt-<step>.pt
  const std::string name = p.filename().string();
  if (name.rfind("ckpt-", 0) != 0 || p.extension() != ".pt") return -1;
  try {
    return std::stoll(name.substr(5, name.size() - 8));
  } catch (const std::exception&) {
    return -1;
  }
}

torch::Tensor rngState() {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

}  // namespace

Checkpointer::Checkpointer(std::string dir, int keep) : dir_(std::move(dir)), keep_(keep) {
  SHOAL_CHECK(keep >= 1, "checkpoints to keep: {} must be at least 1", keep);
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) SHOAL_THROW(InvalidArgument, "checkpoint folder {}: {}", dir_, ec.message());
}

std::vector<std::string> Checkpointer::list() const {
  std::vector<std::pair<int64_t, std::string>> found;
  for (auto& e : fs::directory_iterator(dir_)) {
    if (int64_t s = stepOf(e.path()); s >= 0) found.emplace_back(s, e.path().string());
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& [s, p] : found) out.push_back(p);
  return out;
}

void Checkpointer::verify(const std::string& path) {
  unwrap(path, readAll(path));
}

std::optional<std::string> Checkpointer::latest() const {
  auto all = list();
  if (all.empty()) return std::nullopt;
  try {
    verify(all.back());
  } catch (const InvalidArgument& e) {
    std::string offer = "no older checkpoint is intact";
    for (size_t i = all.size() - 1; i-- > 0;) {
      try {
        verify(all[i]);
        offer = "the newest intact one is " + all[i] + " (resume from it explicitly)";
        break;
      } catch (const InvalidArgument&) {
      }
    }
    SHOAL_THROW(InvalidArgument, "{}; {}", e.what(), offer);
  }
  return all.back();
}

std::string Checkpointer::save(comm::Group& group, torch::nn::Module& model,
                               torch::optim::Optimizer& opt, const Progress& progress) {
  // Every rank's RNG (dropout differs per rank), gathered on rank 0.
  auto mine = rngState().contiguous();
  const size_t rngBytes = static_cast<size_t>(mine.numel());
  auto all = torch::empty({group.size(), static_cast<int64_t>(rngBytes)}, torch::kUInt8);
  comm::gather(group, mine.data_ptr(), all.data_ptr(), rngBytes, DataType::kUInt8, 0);
  const std::string path = fmt::format("{}/ckpt-{:08d}.pt", dir_, progress.step);
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
      const std::string body = payload.str();
      std::string file(kMagic, 8);
      const uint64_t len = body.size();
      file.append(reinterpret_cast<const char*>(&len), 8);
      file += body;
      unsigned char digest[SHA256_DIGEST_LENGTH];
      SHA256(reinterpret_cast<const unsigned char*>(body.data()), body.size(), digest);
      file.append(reinterpret_cast<const char*>(digest), SHA256_DIGEST_LENGTH);
      writeDurably(path, file);
      auto existing = list();
      for (size_t i = 0; i + static_cast<size_t>(keep_) < existing.size(); ++i) {
        fs::remove(existing[i]);
      }
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
      payload = unwrap(path, readAll(path));
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
