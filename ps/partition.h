// How a model's keys are split across parameter servers.
//
// The keys, in registration order, are laid end to end in one flat float32 space; server s owns
// one contiguous range of it, balanced by bytes. A boundary that falls inside a key smaller than
// `minSplitBytes` moves to the nearer end of that key (small tensors stay whole); larger keys
// are split across servers. Deterministic: the result depends only on the keys, the server
// count and minSplitBytes, so every worker and server computes the same partition.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/types.h"

namespace shoal::ps {

// The largest model a parameter-server job takes (float32 elements over all keys: 64 Gi, i.e.
// 256 GiB): a bound checked before a description read from the wire or a file sizes anything.
inline constexpr uint64_t kMaxModelElements = uint64_t{1} << 36;

// kParameter: the server applies the optimizer to pushed gradients. kState: pushed values are
// stored as they are (averaged over the workers in synchronous mode): BatchNorm statistics.
enum class KeyKind : uint8_t { kParameter = 0, kState = 1 };

struct KeySpec {
  std::string name;
  std::vector<int64_t> shape;
  DataType dtype = DataType::kFloat32;
  KeyKind kind = KeyKind::kParameter;

  size_t numel() const;
};

// "float32 [128, 784]"
std::string describeTensor(DataType dtype, const std::vector<int64_t>& shape);

// One server's slice of one key: the key's elements [offset, offset + count), at element
// `flat` of the flat space.
struct Piece {
  int key = 0;
  int server = 0;
  size_t offset = 0;
  size_t count = 0;
  size_t flat = 0;
};

class Partition {
 public:
  // InvalidArgument for no server, an empty or duplicate name, a negative dimension or a key
  // that is not float32 (the servers' optimizer works in float32).
  Partition(std::vector<KeySpec> keys, int numServers, size_t minSplitBytes = 64 << 10);

  const std::vector<KeySpec>& keys() const { return keys_; }
  int numServers() const { return numServers_; }
  size_t totalElements() const { return total_; }
  // Server s's flat range [begin, end) of elements.
  size_t begin(int server) const { return bounds_.at(server); }
  size_t end(int server) const { return bounds_.at(server + 1); }
  size_t elements(int server) const { return end(server) - begin(server); }
  // Server s's pieces, in flat order.
  const std::vector<Piece>& pieces(int server) const { return pieces_.at(server); }
  // The pieces of one key, in server order (one per server holding part of it).
  std::vector<Piece> piecesOf(int key) const;
  // Index of the key named `name`, or -1.
  int find(std::string_view name) const;

  // One line per server: its bytes and which keys (or slices) it holds.
  std::string describe() const;

  // The keys as text (one per line) for the hello message, and back. parseKeys throws
  // ProtocolError on malformed text.
  std::string keysText() const;
  static std::vector<KeySpec> parseKeys(std::string_view text);
  // Empty if `other` has the same keys; else the first difference, in words.
  std::string firstDifference(const std::vector<KeySpec>& other) const;

 private:
  std::vector<KeySpec> keys_;
  int numServers_;
  size_t total_ = 0;
  std::vector<size_t> keyStart_;  // flat start of each key
  std::vector<size_t> bounds_;    // numServers + 1 boundaries
  std::vector<std::vector<Piece>> pieces_;
};

}  // namespace shoal::ps
