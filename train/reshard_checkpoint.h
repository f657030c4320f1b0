// Sharded checkpoints that load into any world size: each rank writes only the pieces of the
// state it holds (its ZeRO shard of flat parameter ranges, optimizer state, ...), and a reader
// at another world size (4 → 2, 2 → 3, ZeRO-3 → DDP) assembles whatever element range it needs
// from whichever files hold it, with exact values.
//
// A checkpoint is a set of named full tensors ("param/fc1.weight", "optim/exp_avg/fc1.weight",
// "buffer/bn.running_mean", ...), each seen flattened to 1-D. Every element of every tensor is
// written by exactly one rank (Note [Coverage] in save_shards.cpp).
//
// On disk, per step:
//   <dir>/step-<8 digits>/rank-<r>-of-<N>.shard   one per rank, sealed (common/sealed_file.h)
//   <dir>/step-<8 digits>/manifest                written last, by rank 0: the commit point
// A rank file's payload is "SHOALSHD", u32 version, u32 0, u64 index length, the index's
// SHA-256, the index, then the pieces' raw bytes. The index lists per piece: name, dtype,
// full shape, element offset, element count, byte position in the payload, SHA-256 of its
// bytes. The manifest holds the world size, the step, each rank file's name, size and SHA-256
// (the sealed trailer), every tensor's name, dtype and shape, and the free key/value `meta`.
// Every length read from disk is bounded by the file's size before it sizes anything.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "comm/group.h"

namespace shoal::train {

namespace shard_format {
struct Manifest;  // train/shard_format.h
}  // namespace shard_format

// Elements [offset, offset + data.numel()) of the flattened tensor `name`, whose full shape is
// `shape`. data: a 1-D contiguous CPU tensor of the tensor's dtype (float32, float64, bfloat16,
// float16, int64, int32, int16, int8, uint8, bool).
struct FlatPiece {
  std::string name;
  std::vector<int64_t> shape;
  int64_t offset = 0;
  torch::Tensor data;
};

// Writes step `step` of the checkpoint in `dir` (created if missing) and returns the step's
// folder. Returns once the manifest is written, i.e. the step is committed (on every rank).
//
// Collective over `group`: every rank calls it with its own pieces, the same dir, step, meta
// and keep. Blocking, bounded by the group's timeout. Before anything is written, the ranks'
// indexes are exchanged and checked alike on every rank; then every rank writes its file, and
// after all have, rank 0 writes the manifest and removes the step folders older than the
// newest `keep` committed steps. A step saved again is rewritten whole (its manifest goes
// first, so readers never see a mix).
// This rank's file is built in memory before it is written: a copy of its pieces' bytes.
//
// Errors (on every rank, the same text): InvalidArgument for bad input anywhere (a piece not
// 1-D CPU contiguous, of an unsupported dtype, past the end of its shape; one name with
// different shapes or dtypes; overlapping pieces; elements no rank wrote; keep < 1), naming the
// rank and the tensor; SystemError when a write fails on any rank, naming that rank and file.
std::string saveShards(comm::Group& group, const std::string& dir, int64_t step,
                       const std::vector<FlatPiece>& mine,
                       const std::map<std::string, std::string>& meta, int keep);

// Reads one committed step, whatever world size wrote it.
//
// Not collective: every process opens the files itself, so all of them must see the same
// folder (a shared filesystem, or every rank on the host that wrote it). Thread-safe once
// constructed: read() opens the files it needs per call.
//
// Errors: InvalidArgument, one line naming the file (and for a rank file, the rank that wrote
// it) and what is wrong; when opening finds a step damaged, the line also names the newest
// older step in `dir` that opens (or says there is none): offered, never loaded in its place.
class ShardReader {
 public:
  // The newest committed step in `dir` (a step folder with a manifest), or nothing if none
  // (or no folder). InvalidArgument if the newest manifest is corrupt, naming it: never a
  // silent fallback to an older step.
  static std::optional<int64_t> latestStep(const std::string& dir);

  // Verifies the manifest, that every rank file exists with the recorded size and trailer,
  // and reads (and verifies) every rank file's index. Pieces' bytes are read by read().
  ShardReader(const std::string& dir, int64_t step);

  int64_t step() const { return step_; }
  int worldSize() const { return worldSize_; }
  const std::map<std::string, std::string>& meta() const { return meta_; }
  std::vector<std::string> names() const;  // every tensor name, sorted
  bool has(const std::string& name) const;
  // InvalidArgument for a name the step does not hold.
  std::vector<int64_t> shape(const std::string& name) const;
  torch::ScalarType dtype(const std::string& name) const;
  int64_t numel(const std::string& name) const;

  // Fills `out` (1-D contiguous CPU, the tensor's dtype) with elements [offset, offset +
  // out.numel()) of the flattened tensor `name`. Reads only the pieces that overlap the range,
  // each whole, and verifies its SHA-256 before using a byte of it. InvalidArgument for a bad
  // `out` or range, a checksum mismatch (naming the file and its rank), or elements no piece
  // covers.
  void read(const std::string& name, int64_t offset, torch::Tensor out) const;
  // The whole tensor, shaped as saved.
  torch::Tensor readFull(const std::string& name) const;

 private:
  struct Piece {
    int rank = 0;
    int64_t offset = 0;
    int64_t numel = 0;
    uint64_t bytePos = 0;  // in the rank file
    std::string sha256;    // 32 bytes
  };
  struct Entry {
    torch::ScalarType dtype = torch::kFloat32;
    std::vector<int64_t> shape;
    int64_t numel = 0;
    std::vector<Piece> pieces;  // sorted by offset
  };
  const Entry& entry(const std::string& name) const;
  void readIndex(int rank, const shard_format::Manifest& m);

  std::string stepDir_;
  int64_t step_ = 0;
  int worldSize_ = 0;
  std::vector<std::string> files_;  // by rank, full paths
  std::map<std::string, std::string> meta_;
  std::map<std::string, Entry> tensors_;
};

// For deployment: writes every "param/..." and "buffer/..." tensor of `step` into one file in
// libtorch's torch::save format, which one process loads with torch::load(model, outPath) into
// a module with those parameter and buffer names (names split on '.' into nested archives per
// submodule, as torch::nn::Module::save writes them). Written to <outPath>.tmp and renamed.
// Returns the number of tensors written. InvalidArgument for a damaged step or names that do
// not form a module (one name both a tensor and a submodule).
size_t consolidate(const std::string& dir, int64_t step, const std::string& outPath);

}  // namespace shoal::train
