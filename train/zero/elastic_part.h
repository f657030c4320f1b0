// The bytes of one elastic ZeRO commit (train/zero/zero_elastic.h): what a rank sends its next
// rank at every commit and all ranks at a view change. Pieces are named as sharded checkpoints
// name them (train/state_shards.h), so any layout can read any other's.
//
// Layout: "SHOALZE1", then i64 step, epoch, position, optimizer step, u64 piece count, and per
// piece: u64 name length and bytes, i32 dimensions (<= 16) and i64 sizes, i64 offset, i32 dtype
// (float32, float64, float16, bfloat16), i64 elements and their bytes. Native byte order: the
// ranks of one job share a machine architecture.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "train/elastic_keeper.h"
#include "train/reshard_checkpoint.h"

namespace shoal::train::zero {

struct ElasticPart {
  ElasticProgress progress;
  int64_t optimizerStep = 0;
  std::vector<FlatPiece> pieces;
};

std::string encodeElasticPart(const ElasticProgress& progress, int64_t optimizerStep,
                              const std::vector<FlatPiece>& pieces);

// Checked before anything is sized from it (the bytes come from a peer): InvalidArgument, one
// line naming `what`, for another magic, a truncation, more than 16 dimensions, a shape of over
// 2^62 elements, a dtype other than the four, a piece outside its tensor, or bytes after the end.
ElasticPart decodeElasticPart(std::string_view bytes, const std::string& what);

// The product of `shape`; InvalidArgument for a negative size or over 2^62 elements.
int64_t elasticElements(const std::vector<int64_t>& shape);

}  // namespace shoal::train::zero
