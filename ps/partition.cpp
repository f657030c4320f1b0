#include "ps/partition.h"

#include <algorithm>
#include <set>
#include <sstream>

#include "common/error.h"

namespace shoal::ps {

size_t KeySpec::numel() const {
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  return n;
}

std::string describeTensor(DataType dtype, const std::vector<int64_t>& shape) {
  return fmt::format("{} [{}]", toString(dtype), fmt::join(shape, ", "));
}

Partition::Partition(std::vector<KeySpec> keys, int numServers, size_t minSplitBytes)
    : keys_(std::move(keys)), numServers_(numServers) {
  SHOAL_CHECK(numServers >= 1, "parameter servers: {} servers (need at least one)", numServers);
  std::set<std::string> names;
  for (const KeySpec& k : keys_) {
    if (k.name.empty() || k.name.find_first_of("\t\n ") != std::string::npos) {
      SHOAL_THROW(InvalidArgument,
                  "parameter-server key '{}': names must be non-empty, "
                  "without blanks",
                  k.name);
    }
    if (!names.insert(k.name).second) {
      SHOAL_THROW(InvalidArgument, "parameter-server key '{}' is registered twice", k.name);
    }
    if (k.dtype != DataType::kFloat32) {
      SHOAL_THROW(InvalidArgument,
                  "parameter-server key '{}' is {}: servers hold float32 keys (keep float32 "
                  "master weights and convert on the worker)",
                  k.name, toString(k.dtype));
    }
    for (int64_t d : k.shape) {
      if (d < 0)
        SHOAL_THROW(InvalidArgument, "parameter-server key '{}' has shape [{}]", k.name,
                    fmt::join(k.shape, ", "));
    }
    keyStart_.push_back(total_);
    total_ += k.numel();
  }
  const size_t minSplit = minSplitBytes / sizeof(float);
  bounds_.assign(static_cast<size_t>(numServers) + 1, 0);
  bounds_.back() = total_;
  size_t key = 0;
  for (int s = 1; s < numServers; ++s) {
    size_t b = total_ * static_cast<size_t>(s) / static_cast<size_t>(numServers);
    while (key < keys_.size() && keyStart_[key] + keys_[key].numel() <= b) ++key;
    if (key < keys_.size() && b > keyStart_[key] && keys_[key].numel() < minSplit) {
      const size_t lo = keyStart_[key], hi = lo + keys_[key].numel();
      b = (b - lo <= hi - b) ? lo : hi;
    }
    bounds_[s] = std::max(b, bounds_[s - 1]);
  }
  pieces_.resize(static_cast<size_t>(numServers));
  for (int s = 0; s < numServers; ++s) {
    for (size_t k = 0; k < keys_.size(); ++k) {
      const size_t lo = std::max(bounds_[s], keyStart_[k]);
      const size_t hi = std::min(bounds_[s + 1], keyStart_[k] + keys_[k].numel());
      if (lo >= hi) continue;
      pieces_[s].push_back({static_cast<int>(k), s, lo - keyStart_[k], hi - lo, lo});
    }
  }
}

std::vector<Piece> Partition::piecesOf(int key) const {
  std::vector<Piece> out;
  for (const auto& server : pieces_) {
    for (const Piece& p : server) {
      if (p.key == key) out.push_back(p);
    }
  }
  return out;
}

int Partition::find(std::string_view name) const {
  for (size_t k = 0; k < keys_.size(); ++k) {
    if (keys_[k].name == name) return static_cast<int>(k);
  }
  return -1;
}

std::string Partition::describe() const {
  std::string out;
  for (int s = 0; s < numServers_; ++s) {
    std::vector<std::string> held;
    for (const Piece& p : pieces_[s]) {
      const KeySpec& k = keys_[p.key];
      held.push_back(p.count == k.numel()
                         ? k.name
                         : fmt::format("{}[{}:{}]", k.name, p.offset, p.offset + p.count));
    }
    out += fmt::format("server {}: {:.2f} MB in {} piece(s): {}\n", s,
                       static_cast<double>(elements(s) * sizeof(float)) / 1e6, held.size(),
                       held.empty() ? "(nothing)" : fmt::format("{}", fmt::join(held, ", ")));
  }
  return out;
}

std::string Partition::keysText() const {
  std::string out;
  for (const KeySpec& k : keys_) {
    out += fmt::format("{} {} {} {}", k.name, static_cast<int>(k.kind), toString(k.dtype),
                       k.shape.size());
    for (int64_t d : k.shape) out += fmt::format(" {}", d);
    out += '\n';
  }
  return out;
}

std::vector<KeySpec> Partition::parseKeys(std::string_view text) {
  std::vector<KeySpec> keys;
  uint64_t total = 0;
  std::istringstream in{std::string(text)};
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    KeySpec k;
    int kind = -1;
    std::string dtype;
    size_t ndim = 0;
    if (!(ls >> k.name >> kind >> dtype >> ndim) || kind < 0 || kind > 1 || ndim > 64) {
      SHOAL_THROW(ProtocolError, "malformed key description '{}'", line);
    }
    k.kind = static_cast<KeyKind>(kind);
    k.dtype = parseDataType(dtype);
    k.shape.resize(ndim);
    // Shapes come from a worker's hello or a checkpoint file: every dimension is positive and
    // the model fits kMaxModelElements, checked before anything is sized from them.
    uint64_t elements = 1;
    for (auto& d : k.shape) {
      if (!(ls >> d) || d < 0) {
        SHOAL_THROW(ProtocolError, "malformed key description '{}'", line);
      }
      if (d > 0 && elements > kMaxModelElements / static_cast<uint64_t>(d)) {
        SHOAL_THROW(ProtocolError, "key '{}' is larger than {} elements", k.name,
                    kMaxModelElements);
      }
      elements *= static_cast<uint64_t>(d);
    }
    total += elements;
    if (total > kMaxModelElements) {
      SHOAL_THROW(ProtocolError, "the model described has more than {} elements",
                  kMaxModelElements);
    }
    keys.push_back(std::move(k));
  }
  return keys;
}

std::string Partition::firstDifference(const std::vector<KeySpec>& other) const {
  for (size_t k = 0; k < std::min(keys_.size(), other.size()); ++k) {
    const KeySpec& a = keys_[k];
    const KeySpec& b = other[k];
    if (a.name != b.name || a.shape != b.shape || a.dtype != b.dtype || a.kind != b.kind) {
      return fmt::format("key {} is '{}' {} here but '{}' {} there", k, a.name,
                         describeTensor(a.dtype, a.shape), b.name,
                         describeTensor(b.dtype, b.shape));
    }
  }
  if (keys_.size() != other.size()) {
    return fmt::format("{} keys here, {} there", keys_.size(), other.size());
  }
  return {};
}

}  // namespace shoal::ps
