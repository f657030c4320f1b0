// train/export/safetensors.h.
#include "train/export/safetensors.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <tuple>
#include <vector>

#include "common/error.h"
#include "train/export/file_bytes.h"

namespace shoal::train {

namespace {

// The format is little-endian; so is every host this builds for (a byte swap would go here).
static_assert(std::endian::native == std::endian::little, "safetensors needs a little-endian host");

using nlohmann::json;

struct DtypeName {
  torch::ScalarType type;
  const char* name;
};
constexpr DtypeName kDtypes[] = {
    {torch::kFloat64, "F64"},   {torch::kFloat32, "F32"}, {torch::kFloat16, "F16"},
    {torch::kBFloat16, "BF16"}, {torch::kInt64, "I64"},   {torch::kInt32, "I32"},
    {torch::kInt16, "I16"},     {torch::kInt8, "I8"},     {torch::kUInt8, "U8"},
    {torch::kBool, "BOOL"},
};

const char* dtypeName(torch::ScalarType t) {
  for (const auto& d : kDtypes) {
    if (d.type == t) return d.name;
  }
  return nullptr;
}

std::optional<torch::ScalarType> dtypeOf(const std::string& name) {
  for (const auto& d : kDtypes) {
    if (name == d.name) return d.type;
  }
  return std::nullopt;
}

}  // namespace

std::string encodeSafetensors(const std::map<std::string, torch::Tensor>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<torch::Tensor> data;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    if (name.empty() || name == "__metadata__") {
      SHOAL_THROW(InvalidArgument, "safetensors: '{}' cannot name a tensor", name);
    }
    const char* dtype = dtypeName(tensor.scalar_type());
    if (dtype == nullptr) {
      SHOAL_THROW(InvalidArgument, "safetensors: tensor '{}' has dtype {}, which is not supported",
                  name, c10::toString(tensor.scalar_type()));
    }
    torch::Tensor t = tensor.detach().to(torch::kCPU).contiguous();
    const uint64_t bytes = t.numel() * t.element_size();
    header[name] = {
        {"dtype", dtype}, {"shape", t.sizes().vec()}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    data.push_back(std::move(t));
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out(8 + text.size() + offset, '\0');
  const uint64_t n = text.size();
  std::memcpy(out.data(), &n, 8);
  std::memcpy(out.data() + 8, text.data(), text.size());
  char* at = out.data() + 8 + text.size();
  for (const auto& t : data) {
    const size_t bytes = t.numel() * t.element_size();
    if (bytes > 0) std::memcpy(at, t.data_ptr(), bytes);
    at += bytes;
  }
  return out;
}

void writeSafetensors(const std::string& path, const std::map<std::string, torch::Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  writeFileAtomically(path, encodeSafetensors(tensors, metadata));
}

Safetensors decodeSafetensors(std::string_view bytes, const std::string& where) {
  if (bytes.size() < 8) {
    SHOAL_THROW(InvalidArgument, "{}: {} bytes, too short for a safetensors header length", where,
                bytes.size());
  }
  uint64_t headerLen = 0;
  std::memcpy(&headerLen, bytes.data(), 8);
  if (headerLen > kMaxSafetensorsHeader || headerLen > bytes.size() - 8) {
    SHOAL_THROW(InvalidArgument,
                "{}: header length {} exceeds the {} bytes after it (or the {} byte bound)", where,
                headerLen, bytes.size() - 8, kMaxSafetensorsHeader);
  }
  json header;
  try {
    header = json::parse(bytes.substr(8, headerLen));
  } catch (const json::exception& e) {
    SHOAL_THROW(InvalidArgument, "{}: the header is not JSON ({})", where, e.what());
  }
  if (!header.is_object())
    SHOAL_THROW(InvalidArgument, "{}: the header is not a JSON object", where);
  const std::string_view data = bytes.substr(8 + headerLen);

  Safetensors out;
  struct Span {
    uint64_t begin, end;
    std::string name;
  };
  std::vector<Span> spans;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object())
        SHOAL_THROW(InvalidArgument, "{}: __metadata__ is not an object", where);
      for (const auto& [k, v] : entry.items()) {
        if (!v.is_string()) {
          SHOAL_THROW(InvalidArgument, "{}: __metadata__ value of '{}' is not a string", where, k);
        }
        out.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    if (name.empty()) SHOAL_THROW(InvalidArgument, "{}: a tensor has an empty name", where);
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") ||
        !entry.contains("data_offsets") || !entry["dtype"].is_string() ||
        !entry["shape"].is_array() || !entry["data_offsets"].is_array() ||
        entry["data_offsets"].size() != 2) {
      SHOAL_THROW(InvalidArgument,
                  "{}: tensor '{}' needs a string dtype, an array shape and two data_offsets",
                  where, name);
    }
    const auto dtype = dtypeOf(entry["dtype"].get<std::string>());
    if (!dtype) {
      SHOAL_THROW(InvalidArgument, "{}: tensor '{}' has unsupported dtype '{}'", where, name,
                  entry["dtype"].get<std::string>());
    }
    if (entry["shape"].size() > 64) {
      SHOAL_THROW(InvalidArgument, "{}: tensor '{}' has {} dimensions", where, name,
                  entry["shape"].size());
    }
    std::vector<int64_t> shape;
    uint64_t elements = 1;  // of the non-zero dimensions, kept below 2^62 so nothing overflows
    bool empty = false;
    for (const auto& d : entry["shape"]) {
      if (!d.is_number_unsigned()) {
        SHOAL_THROW(InvalidArgument, "{}: tensor '{}' has a shape entry that is not a count", where,
                    name);
      }
      const uint64_t v = d.get<uint64_t>();
      if (v == 0) {
        empty = true;
      } else if (elements > (uint64_t{1} << 62) / v) {
        SHOAL_THROW(InvalidArgument, "{}: tensor '{}' has a shape too large to hold", where, name);
      } else {
        elements *= v;
      }
      shape.push_back(static_cast<int64_t>(v));
    }
    const auto& offs = entry["data_offsets"];
    if (!offs[0].is_number_unsigned() || !offs[1].is_number_unsigned()) {
      SHOAL_THROW(InvalidArgument, "{}: tensor '{}' has data_offsets that are not counts", where,
                  name);
    }
    const uint64_t begin = offs[0].get<uint64_t>(), end = offs[1].get<uint64_t>();
    if (begin > end || end > data.size()) {
      SHOAL_THROW(InvalidArgument,
                  "{}: tensor '{}' has data_offsets [{}, {}] outside the {} data bytes", where,
                  name, begin, end, data.size());
    }
    const uint64_t expected = empty ? 0 : elements * c10::elementSize(*dtype);
    if (expected != end - begin) {
      SHOAL_THROW(InvalidArgument,
                  "{}: tensor '{}' of shape [{}] and dtype {} takes {} bytes, not the {} its "
                  "data_offsets give",
                  where, name, fmt::join(shape, ", "), entry["dtype"].get<std::string>(), expected,
                  end - begin);
    }
    torch::Tensor t = torch::empty(shape, torch::TensorOptions().dtype(*dtype));
    if (end > begin) std::memcpy(t.data_ptr(), data.data() + begin, end - begin);
    out.tensors.emplace(name, std::move(t));
    spans.push_back({begin, end, name});
  }
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    return std::tie(a.begin, a.end) < std::tie(b.begin, b.end);
  });
  uint64_t at = 0;
  for (const auto& s : spans) {
    if (s.begin != at) {
      SHOAL_THROW(InvalidArgument,
                  "{}: tensor '{}' starts at byte {}, not at {} (a gap or overlap)", where, s.name,
                  s.begin, at);
    }
    at = s.end;
  }
  if (at != data.size()) {
    SHOAL_THROW(InvalidArgument, "{}: the tensors cover {} of the {} data bytes", where, at,
                data.size());
  }
  return out;
}

Safetensors readSafetensors(const std::string& path) {
  return decodeSafetensors(readFileBytes(path), path);
}

}  // namespace shoal::train
