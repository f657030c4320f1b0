// The model the ps_request target checks requests against, shared with the seed writer
// (fuzz/ps_request_seeds.cpp): five keys over two servers, fc.weight cut between them.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "ps/partition.h"

namespace shoal::fuzz {

inline ps::Partition psRequestPartition() {
  using ps::KeyKind;
  std::vector<ps::KeySpec> keys{{"conv.weight", {4, 3, 3}},
                                {"conv.bias", {4}},
                                {"bn.mean", {4}, DataType::kFloat32, KeyKind::kState},
                                {"fc.weight", {10, 40}},
                                {"fc.bias", {10}}};
  // A 64-byte split threshold: fc.weight (1600 bytes) is cut between the two servers.
  return ps::Partition(keys, 2, 64);
}

// The seeds (name, input): pushes in every encoding, keyed and whole-shard, a push-pull, a pull
// (fuzz/ps_request_seeds.cpp).
std::vector<std::pair<std::string, std::string>> psRequestSeeds();

}  // namespace shoal::fuzz
