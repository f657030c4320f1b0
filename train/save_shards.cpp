// saveShards() of train/reshard_checkpoint.h: every rank's pieces checked on every rank, one
// sealed file per rank, then the manifest (the commit) and the pruning of old steps.
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <tuple>

#include "comm/collectives.h"
#include "common/error.h"
#include "common/sealed_file.h"
#include "common/trace.h"
#include "train/reshard_checkpoint.h"
#include "train/shard_format.h"

namespace shoal::train {

namespace fs = std::filesystem;
using namespace shard_format;

// Note [Coverage]
// Every element of every tensor is written by exactly one rank: pieces that overlap (on one
// rank or across ranks) and elements no rank wrote are refused at save time, on every rank.
// Replicated state (DDP's parameters) is therefore written by one rank only, and a reader never
// has to choose between two copies that might differ. Should a reader still meet overlapping
// pieces, it takes the first covering piece in (offset, rank) order.

namespace {

// What a rank tells the others about its pieces before anything is written.
struct PieceInfo {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  int64_t offset = 0;
  int64_t numel = 0;
};

// This rank's pieces as PieceInfo, or the first thing wrong with them.
std::string checkLocal(const std::vector<FlatPiece>& mine, std::vector<PieceInfo>& out) {
  for (const auto& p : mine) {
    const auto& t = p.data;
    std::optional<std::string> dtype;
    if (p.name.empty()) return "a piece has no name";
    if (!t.defined()) return fmt::format("the piece of '{}' has no data", p.name);
    if (!t.device().is_cpu() || t.dim() != 1 || !t.is_contiguous() || t.is_sparse()) {
      return fmt::format("the piece of '{}' is not a 1-D contiguous CPU tensor", p.name);
    }
    if (!(dtype = dtypeName(t.scalar_type()))) {
      return fmt::format("the piece of '{}' is {}, which checkpoints do not hold", p.name,
                         c10::toString(t.scalar_type()));
    }
    auto total = numelOf(p.shape);
    if (!total) return fmt::format("'{}' has a bad shape [{}]", p.name, fmt::join(p.shape, ", "));
    if (p.offset < 0 || p.offset > *total - t.numel()) {
      return fmt::format(
          "the piece of '{}' (elements [{}, {})) is past the end of its shape [{}] "
          "({} elements)",
          p.name, p.offset, p.offset + t.numel(), fmt::join(p.shape, ", "), *total);
    }
    out.push_back({p.name, *dtype, p.shape, p.offset, t.numel()});
  }
  return "";
}

std::string encodeInfos(const std::string& error, const std::vector<PieceInfo>& infos) {
  Encoder e;
  e.str(error);
  e.put<uint64_t>(infos.size());
  for (const auto& i : infos) {
    e.str(i.name);
    e.str(i.dtype);
    putShape(e, i.shape);
    e.put<int64_t>(i.offset);
    e.put<int64_t>(i.numel);
  }
  return std::move(e.bytes());
}

// Every rank's pieces together, checked alike on every rank (Note [Coverage]): the first thing
// wrong, or "".
std::string checkGlobal(const std::vector<std::string>& errors,
                        const std::vector<std::vector<PieceInfo>>& infos) {
  for (size_t r = 0; r < errors.size(); ++r) {
    if (!errors[r].empty()) return fmt::format("rank {}: {}", r, errors[r]);
  }
  struct Seen {
    const PieceInfo* first;
    size_t rank;
    std::vector<std::tuple<int64_t, int64_t, size_t>> ranges;  // offset, end, rank
  };
  std::map<std::string, Seen> byName;
  for (size_t r = 0; r < infos.size(); ++r) {
    for (const auto& i : infos[r]) {
      auto [it, fresh] = byName.try_emplace(i.name, Seen{&i, r, {}});
      const PieceInfo& f = *it->second.first;
      if (f.dtype != i.dtype || f.shape != i.shape) {
        return fmt::format("'{}' is {} on rank {} and {} on rank {}", i.name,
                           describe(f.dtype, f.shape), it->second.rank, describe(i.dtype, i.shape),
                           r);
      }
      if (i.numel > 0) it->second.ranges.emplace_back(i.offset, i.offset + i.numel, r);
    }
  }
  for (auto& [name, seen] : byName) {
    std::sort(seen.ranges.begin(), seen.ranges.end());
    int64_t covered = 0;
    size_t lastRank = 0;
    for (auto [begin, end, r] : seen.ranges) {
      if (begin < covered) {
        return fmt::format(
            "elements [{}, {}) of '{}' are written by rank {} and by rank {} (write each "
            "element once: replicated tensors from one rank only)",
            begin, std::min(end, covered), name, lastRank, r);
      }
      if (begin > covered) {
        return fmt::format("elements [{}, {}) of '{}' are written by no rank", covered, begin,
                           name);
      }
      covered = end;
      lastRank = r;
    }
    const int64_t total = *numelOf(seen.first->shape);
    if (covered < total) {
      return fmt::format("elements [{}, {}) of '{}' are written by no rank", covered, total, name);
    }
  }
  return "";
}

// This rank's file: the payload (sealed by writeSealedFile).
std::string encodeRankFile(const std::vector<FlatPiece>& mine,
                           const std::vector<PieceInfo>& infos) {
  uint64_t dataBytes = 0;
  for (const auto& p : mine) dataBytes += p.data.nbytes();
  // The index first (its byte positions need its own length, which does not depend on them).
  auto buildIndex = [&](uint64_t dataStart) {
    Encoder e;
    e.put<uint64_t>(infos.size());
    uint64_t at = dataStart;
    for (size_t k = 0; k < infos.size(); ++k) {
      const auto& i = infos[k];
      const auto& t = mine[k].data;
      e.str(i.name);
      e.str(i.dtype);
      putShape(e, i.shape);
      e.put<int64_t>(i.offset);
      e.put<int64_t>(i.numel);
      e.put<uint64_t>(at);
      e.raw(sha256(t.data_ptr(), t.nbytes()));
      at += t.nbytes();
    }
    return std::move(e.bytes());
  };
  const uint64_t indexLen = buildIndex(0).size();
  const std::string index = buildIndex(kShardHead + indexLen);
  Encoder e;
  e.bytes().reserve(kShardHead + indexLen + dataBytes);
  e.raw(std::string(kShardMagic, 8));
  e.put<uint32_t>(kVersion);
  e.put<uint32_t>(0);
  e.put<uint64_t>(index.size());
  e.raw(sha256(index.data(), index.size()));
  e.raw(index);
  for (const auto& p : mine) {
    e.bytes().append(static_cast<const char*>(p.data.data_ptr()), p.data.nbytes());
  }
  return std::move(e.bytes());
}

// Removes the step folders older than the newest `keep` committed ones (with the leftovers of
// failed saves among them). Best effort: a folder that cannot be removed stays.
void prune(const std::string& dir, int keep) {
  auto all = stepFolders(dir);
  std::vector<int64_t> committed;
  for (auto& [step, path] : all) {
    if (fs::exists(path + "/manifest")) committed.push_back(step);
  }
  if (committed.size() < static_cast<size_t>(keep)) return;
  const int64_t oldestKept = committed[committed.size() - static_cast<size_t>(keep)];
  for (auto& [step, path] : all) {
    std::error_code ec;
    if (step < oldestKept) fs::remove_all(path, ec);
  }
}

}  // namespace

std::string saveShards(comm::Group& group, const std::string& dir, int64_t step,
                       const std::vector<FlatPiece>& mine,
                       const std::map<std::string, std::string>& meta, int keep) {
  const int rank = group.rank();
  const int world = group.size();
  const std::string folder = stepFolder(dir, step);

  // 1. Every rank's pieces to every rank, checked alike everywhere before a byte is written.
  std::vector<PieceInfo> infos;
  std::string error = checkLocal(mine, infos);
  if (error.empty() && keep < 1) error = fmt::format("keep = {}: must be at least 1", keep);
  if (error.empty() && step < 0) error = fmt::format("step {} is negative", step);
  if (!error.empty()) infos.clear();
  const std::string blob = encodeInfos(error, infos);
  int64_t len = static_cast<int64_t>(blob.size());
  std::vector<int64_t> lens(static_cast<size_t>(world));
  comm::allgather(group, &len, lens.data(), 1, DataType::kInt64);
  const int64_t maxLen = *std::max_element(lens.begin(), lens.end());
  std::string padded = blob;
  padded.resize(static_cast<size_t>(maxLen));
  std::string all(static_cast<size_t>(maxLen) * static_cast<size_t>(world), '\0');
  comm::allgather(group, padded.data(), all.data(), static_cast<size_t>(maxLen), DataType::kUInt8);
  std::vector<std::string> errors(static_cast<size_t>(world));
  std::vector<std::vector<PieceInfo>> everyone(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    Decoder d(std::string_view(all).substr(static_cast<size_t>(r * maxLen),
                                           static_cast<size_t>(lens[static_cast<size_t>(r)])),
              fmt::format("rank {}'s index", r));
    errors[r] = d.str();
    auto& list = everyone[r];
    list.resize(d.count(5 * 8));  // name, dtype, ndim, offset, numel
    for (auto& i : list) {
      i.name = d.str();
      i.dtype = d.str();
      i.shape = getShape(d);
      i.offset = d.get<int64_t>();
      i.numel = d.get<int64_t>();
    }
  }
  const std::string verdict = checkGlobal(errors, everyone);
  if (!verdict.empty()) {
    SHOAL_THROW(InvalidArgument, "rank {}: saving step {} in {}: {}", rank, step, dir, verdict);
  }

  // 2. Rank 0 clears the step (a step saved again is rewritten whole, its manifest first, so
  // no reader sees old and new files under one manifest); the others wait for it.
  std::string cleared;
  if (rank == 0) {
    std::error_code ec;
    fs::remove(folder + "/manifest", ec);
    if (!ec) fs::remove_all(folder, ec);
    if (!ec) fs::create_directories(folder, ec);
    if (ec) cleared = fmt::format("preparing {}: {}", folder, ec.message());
  }
  cleared = comm::broadcastBytes(group, std::move(cleared), 0, size_t{1} << 16);
  if (!cleared.empty()) {
    SHOAL_THROW(SystemError, "rank {}: saving step {} failed on rank 0: {}", rank, step, cleared);
  }

  // 3. Every rank writes its file; every rank learns who failed, rank 0 the files' digests.
  struct Written {
    int64_t ok = 0;
    uint64_t size = 0;
    unsigned char sha[SHA256_DIGEST_LENGTH] = {};
  } written;
  const std::string path = folder + "/" + rankFileName(rank, world);
  std::string failure;
  try {
    TraceScope span(group.options().trace, "checkpoint write", "checkpoint");
    std::error_code ec;
    fs::create_directories(folder, ec);  // visible already on a shared filesystem
    const std::string payload = encodeRankFile(mine, infos);
    writeSealedFile(path, payload);
    span.arg("step", step).arg("bytes", payload.size());
    written.ok = 1;
    written.size = kSealedHead + payload.size() + kSealedTail;
    std::memcpy(written.sha, sha256(payload.data(), payload.size()).data(), SHA256_DIGEST_LENGTH);
  } catch (const std::exception& e) {
    failure = e.what();
  }
  std::vector<Written> results(static_cast<size_t>(world));
  comm::allgather(group, &written, results.data(), sizeof(Written), DataType::kUInt8);
  for (int r = 0; r < world; ++r) {
    if (results[r].ok) continue;
    failure = comm::broadcastBytes(group, std::move(failure), r, size_t{1} << 16);
    SHOAL_THROW(SystemError, "rank {}: saving step {} failed on rank {}: {}", rank, step, r,
                failure);
  }

  // 4. The commit: rank 0 writes the manifest, then prunes.
  std::string committed;
  if (rank == 0) {
    try {
      Manifest m;
      m.step = step;
      for (int r = 0; r < world; ++r) {
        const auto& w = results[r];
        m.files.push_back(
            {rankFileName(r, world), w.size,
             std::string(reinterpret_cast<const char*>(w.sha), SHA256_DIGEST_LENGTH)});
      }
      std::map<std::string, Manifest::Tensor> tensors;
      for (const auto& list : everyone) {
        for (const auto& i : list)
          tensors.try_emplace(i.name, Manifest::Tensor{i.name, i.dtype, i.shape});
      }
      for (auto& [name, t] : tensors) m.tensors.push_back(t);
      m.meta = meta;
      writeSealedFile(folder + "/manifest", encodeManifest(m));
      prune(dir, keep);
    } catch (const std::exception& e) {
      committed = e.what();
    }
  }
  committed = comm::broadcastBytes(group, std::move(committed), 0, size_t{1} << 16);
  if (!committed.empty()) {
    SHOAL_THROW(SystemError, "rank {}: committing step {} failed on rank 0: {}", rank, step,
                committed);
  }
  return folder;
}

}  // namespace shoal::train
