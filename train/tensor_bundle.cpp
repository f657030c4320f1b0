#include "train/tensor_bundle.h"

#include <fmt/format.h>

#include <cstring>
#include <set>

#include "common/error.h"
#include "train/shard_format.h"

namespace shoal::train {

namespace sf = shard_format;

namespace {

constexpr char kMagic[8] = {'S', 'H', 'O', 'A', 'L', 'T', 'B', '1'};
constexpr uint32_t kVersion = 1;
// A tensor's smallest record: the name's, the dtype's and the shape's lengths.
constexpr uint64_t kMinRecord = 3 * sizeof(uint64_t);

}  // namespace

std::string encodeTensorBundle(std::string_view kind, const TensorBundle& tensors) {
  std::vector<torch::Tensor> plain;
  plain.reserve(tensors.size());
  size_t total = 32 + kind.size();
  std::set<std::string_view> names;
  for (const auto& [name, t] : tensors) {
    if (!names.insert(name).second) {
      SHOAL_THROW(InvalidArgument, "tensor bundle: '{}' is named twice", name);
    }
    if (!sf::dtypeName(t.scalar_type())) {
      SHOAL_THROW(InvalidArgument,
                  "tensor bundle: '{}' has dtype {}, which the format does not hold", name,
                  c10::toString(t.scalar_type()));
    }
    plain.push_back(t.detach().to(torch::kCPU).contiguous());
    total += kMinRecord + name.size() + 16 + 8 * static_cast<size_t>(t.dim()) + t.nbytes();
  }
  sf::Encoder e;
  e.bytes().reserve(total);
  e.raw(std::string(kMagic, sizeof kMagic));
  e.put<uint32_t>(kVersion);
  e.put<uint32_t>(0);
  e.str(std::string(kind));
  e.put<uint64_t>(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const torch::Tensor& t = plain[i];
    e.str(tensors[i].first);
    e.str(*sf::dtypeName(t.scalar_type()));
    sf::putShape(e, t.sizes().vec());
    e.bytes().append(static_cast<const char*>(t.data_ptr()), t.nbytes());
  }
  return std::move(e.bytes());
}

TensorBundle decodeTensorBundle(std::string_view bytes, std::string_view kind,
                                const std::string& what) {
  sf::Decoder d(bytes, what);
  if (bytes.size() < sizeof kMagic || !looksLikeTensorBundle(bytes)) {
    d.fail("not a Shoal tensor bundle (no SHOALTB1 magic)");
  }
  (void)d.raw(sizeof kMagic);
  if (const auto version = d.get<uint32_t>(); version != kVersion) {
    d.fail(fmt::format("tensor bundle version {} (this Shoal reads {})", version, kVersion));
  }
  if (d.get<uint32_t>() != 0) d.fail("the reserved field is not zero");
  if (const std::string found = d.str(); found != kind) {
    d.fail(fmt::format("a bundle of kind '{}', not a {}", found.substr(0, 64), kind));
  }
  const uint64_t count = d.count(kMinRecord);
  TensorBundle out;
  out.reserve(count);
  std::set<std::string> names;
  for (uint64_t i = 0; i < count; ++i) {
    std::string name = d.str();
    if (!names.insert(name).second) d.fail(fmt::format("'{}' is named twice", name));
    const std::string dtype = d.str();
    const auto type = sf::dtypeFromName(dtype);
    if (!type) d.fail(fmt::format("'{}' has unknown dtype '{}'", name, dtype));
    const std::vector<int64_t> shape = sf::getShape(d);  // its element count fits in int64
    const auto numel = static_cast<uint64_t>(*sf::numelOf(shape));
    const uint64_t element = c10::elementSize(*type);
    // Checked before the tensor is allocated: its bytes must lie in the input.
    if (numel > (uint64_t{1} << 62) / element) d.fail(fmt::format("'{}' is too large", name));
    const std::string_view data = d.view(numel * element);
    if (*type == torch::kBool) {
      for (char c : data) {
        if (c != 0 && c != 1)
          d.fail(fmt::format("bool tensor '{}' holds a byte other than 0 or 1", name));
      }
    }
    torch::Tensor t = torch::empty(shape, torch::TensorOptions().dtype(*type));
    if (!data.empty()) std::memcpy(t.data_ptr(), data.data(), data.size());
    out.emplace_back(std::move(name), std::move(t));
  }
  if (!d.done()) d.fail("bytes left over after the last tensor");
  return out;
}

bool looksLikeTensorBundle(std::string_view head) {
  return head.substr(0, sizeof kMagic) == std::string_view(kMagic, sizeof kMagic);
}

bool looksLikeLibtorchArchive(std::string_view head) {
  return head.substr(0, 4) == std::string_view("PK\x03\x04", 4);
}

}  // namespace shoal::train
