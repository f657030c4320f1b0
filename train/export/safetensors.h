// The safetensors format (https://github.com/huggingface/safetensors), written and read here
// without the Rust library: what Python's `safetensors.torch.load_file`, Hugging Face tools and
// `shoal-serve` load.
//
// Layout: an 8-byte little-endian header length N, N bytes of JSON, then the tensors' raw
// little-endian bytes back to back. The JSON maps each tensor's name to
// {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]} (offsets relative to the end of
// the header) plus an optional "__metadata__" object of string → string. The writer lays the
// tensors out in name order and pads the header with spaces to a multiple of 8 bytes, so every
// tensor starts 8-byte aligned.
//
// Supported dtypes: F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

namespace shoal::train {

// The most header bytes the reader accepts: the reference implementation's own bound.
inline constexpr uint64_t kMaxSafetensorsHeader = 100 * 1024 * 1024;

// The file's bytes for `tensors` (any device, layout or contiguity: copied to contiguous CPU)
// and `metadata`. Pure; InvalidArgument for an empty name or an unsupported dtype.
std::string encodeSafetensors(const std::map<std::string, torch::Tensor>& tensors,
                              const std::map<std::string, std::string>& metadata = {});

// Writes encodeSafetensors() to `path` through a temporary file renamed into place, so a reader
// (a server watching the file) never sees half of it. SystemError if writing fails.
void writeSafetensors(const std::string& path, const std::map<std::string, torch::Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

struct Safetensors {
  std::map<std::string, torch::Tensor> tensors;  // contiguous CPU tensors, owning their bytes
  std::map<std::string, std::string> metadata;
};

// Parses untrusted bytes. Every claim is checked before it sizes anything: the header length
// against kMaxSafetensorsHeader and the bytes present, the JSON's syntax and types, each dtype,
// each shape (non-negative, no overflow) against its offsets, every offset inside the data, and
// the tensors tile the data exactly (no gaps, no overlaps, nothing after). InvalidArgument with
// one line naming `where` (a file name) and what is wrong.
Safetensors decodeSafetensors(std::string_view bytes, const std::string& where = "safetensors");

// Reads and decodes a file (its size checked against kMaxModelFileBytes first).
Safetensors readSafetensors(const std::string& path);

}  // namespace shoal::train
