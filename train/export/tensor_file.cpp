// train/export/tensor_file.h.
#include "train/export/tensor_file.h"

#include <torch/serialize.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "common/error.h"
#include "common/sealed_file.h"
#include "train/archive_bounds.h"
#include "train/export/file_bytes.h"
#include "train/export/safetensors.h"
#include "train/full_state.h"
#include "train/reshard_checkpoint.h"

namespace shoal::train {

namespace {

std::string firstLine(const std::exception& e) {
  const std::string what = e.what();
  return what.substr(0, what.find('\n'));
}

bool isZip(std::string_view bytes) {
  return bytes.size() >= 4 && bytes.substr(0, 4) == std::string_view("PK\x03\x04", 4);
}

// TorchScript archives (what torch::save writes for a module) carry their constants table; a
// pickled value (torch::pickle_save, Python's torch.save) does not.
bool holdsTorchScript(std::string_view bytes) {
  return bytes.find("constants.pkl") != std::string_view::npos;
}

TensorFileFormat detect(std::string_view bytes) {
  // A file cut short inside the magic counts too: reported as a truncated sealed file rather
  // than as bad safetensors.
  if (looksSealed(bytes)) return TensorFileFormat::kFullState;
  if (!isZip(bytes)) return TensorFileFormat::kSafetensors;
  return holdsTorchScript(bytes) ? TensorFileFormat::kTorchSave : TensorFileFormat::kPickleDict;
}

// A module archive's tensors under `prefix`, then its child archives' recursively. keys() lists
// the archive's attributes: tensors, child modules, and flags such as "training" (skipped).
void walkArchive(torch::serialize::InputArchive& archive, const std::string& prefix,
                 NamedTensors& out, int depth, const std::string& path) {
  if (depth > 64) SHOAL_THROW(InvalidArgument, "{}: modules nested more than 64 deep", path);
  for (const std::string& key : archive.keys()) {
    torch::Tensor t;
    if (archive.try_read(key, t, /*is_buffer=*/false) || archive.try_read(key, t, true)) {
      out.emplace(prefix + key, t.contiguous());
      continue;
    }
    torch::serialize::InputArchive child;
    if (archive.try_read(key, child)) walkArchive(child, prefix + key + ".", out, depth + 1, path);
  }
}

// A sealed full state (train/full_state.h), read again through common/sealed_file.h, which
// checks the length against the file's size and the SHA-256 before returning a byte.
NamedTensors readFullStateFile(const std::string& path) {
  std::string payload;
  FullState state;
  try {
    payload = readSealedFile(path);
    state = decodeFullState(payload, path);
  } catch (const InvalidArgument& e) {
    const std::string what = firstLine(e);
    SHOAL_THROW(InvalidArgument, "{}{}", what.find(path) == std::string::npos ? path + ": " : "",
                what);
  }
  if (state.empty()) SHOAL_THROW(InvalidArgument, "{}: a full model state with no tensors", path);
  NamedTensors out;
  for (auto& [name, t] : state) {
    if (name.empty()) SHOAL_THROW(InvalidArgument, "{}: a full state names a tensor ''", path);
    if (!out.emplace(name, t.to(torch::kCPU).contiguous()).second)
      SHOAL_THROW(InvalidArgument, "{}: a full state holds '{}' twice", path, name);
  }
  return out;
}

}  // namespace

TensorFileFormat tensorFileFormatFromName(const std::string& name) {
  if (name == "pt") return TensorFileFormat::kPickleDict;
  if (name == "safetensors") return TensorFileFormat::kSafetensors;
  SHOAL_THROW(InvalidArgument, "unknown format '{}' (known: pt, safetensors)", name);
}

const char* tensorFileFormatName(TensorFileFormat format) {
  switch (format) {
    case TensorFileFormat::kTorchSave:
      return "torch-save";
    case TensorFileFormat::kPickleDict:
      return "pt";
    case TensorFileFormat::kSafetensors:
      return "safetensors";
    case TensorFileFormat::kFullState:
      return "full-state";
  }
  return "?";
}

TensorFileFormat detectTensorFileFormat(const std::string& path) {
  return detect(readFileBytes(path));
}

NamedTensors readTensorFile(const std::string& path) {
  std::string bytes = readFileBytes(path);
  const TensorFileFormat format = detect(bytes);
  if (format == TensorFileFormat::kSafetensors) return decodeSafetensors(bytes, path).tensors;
  if (format == TensorFileFormat::kFullState) {
    std::string().swap(bytes);  // read again by the sealed reader, which checks it whole
    return readFullStateFile(path);
  }
  try {
    checkArchiveBounds(bytes);
  } catch (const InvalidArgument& e) {
    SHOAL_THROW(InvalidArgument, "{}: {}", path, firstLine(e));
  }
  NamedTensors out;
  try {
    if (format == TensorFileFormat::kTorchSave) {
      torch::serialize::InputArchive archive;
      archive.load_from(bytes.data(), bytes.size());
      walkArchive(archive, "", out, 0, path);
    } else {
      const c10::IValue value = torch::pickle_load(std::vector<char>(bytes.begin(), bytes.end()));
      if (!value.isGenericDict()) {
        SHOAL_THROW(InvalidArgument, "{}: holds a pickled {}, not a dict of tensors", path,
                    value.tagKind());
      }
      for (const auto& item : value.toGenericDict()) {
        if (!item.key().isString() || !item.value().isTensor()) {
          SHOAL_THROW(InvalidArgument,
                      "{}: the pickled dict maps something other than a name to a tensor", path);
        }
        out.emplace(item.key().toStringRef(), item.value().toTensor().contiguous());
      }
    }
  } catch (const shoal::Error&) {
    throw;
  } catch (const std::exception& e) {
    SHOAL_THROW(InvalidArgument, "{}: not a readable {} file: {}", path,
                tensorFileFormatName(format), firstLine(e));
  }
  return out;
}

NamedTensors readCheckpointFolder(const std::string& dir, std::optional<int64_t> step) {
  if (!step) step = ShardReader::latestStep(dir);
  if (!step) SHOAL_THROW(InvalidArgument, "{}: holds no committed checkpoint step", dir);
  const ShardReader reader(dir, *step);
  NamedTensors out;
  for (const auto& name : reader.names()) {
    for (const std::string prefix : {"param/", "buffer/"}) {
      if (name.rfind(prefix, 0) == 0)
        out.emplace(name.substr(prefix.size()), reader.readFull(name));
    }
  }
  if (out.empty()) {
    SHOAL_THROW(InvalidArgument, "{}: step {} holds no param/ or buffer/ tensors", dir, *step);
  }
  return out;
}

void writeTensorFile(const std::string& path, const NamedTensors& tensors,
                     TensorFileFormat format) {
  if (format == TensorFileFormat::kSafetensors) {
    writeSafetensors(path, tensors);
    return;
  }
  if (format != TensorFileFormat::kPickleDict) {
    SHOAL_THROW(InvalidArgument, "writeTensorFile: {} is written by {}, not here",
                tensorFileFormatName(format),
                format == TensorFileFormat::kTorchSave ? "torch::save" : "train::writeFullState");
  }
  c10::Dict<std::string, at::Tensor> dict;
  for (const auto& [name, t] : tensors) dict.insert(name, t.detach().to(torch::kCPU).contiguous());
  const std::vector<char> bytes = torch::pickle_save(c10::IValue(dict));
  writeFileAtomically(path, std::string_view(bytes.data(), bytes.size()));
}

NamedTensors moduleTensors(const torch::nn::Module& module) {
  NamedTensors out;
  for (const auto& p : module.named_parameters(/*recurse=*/true))
    out.emplace(p.key(), p.value().detach());
  for (const auto& b : module.named_buffers(/*recurse=*/true))
    out.emplace(b.key(), b.value().detach());
  return out;
}

void loadModuleTensors(torch::nn::Module& module, const NamedTensors& tensors,
                       const std::string& where) {
  const NamedTensors mine = moduleTensors(module);
  for (const auto& [name, t] : tensors) {
    if (!mine.count(name)) {
      SHOAL_THROW(InvalidArgument, "{}: holds '{}', which the model has no tensor of that name for",
                  where, name);
    }
  }
  for (const auto& [name, target] : mine) {
    auto it = tensors.find(name);
    if (it == tensors.end())
      SHOAL_THROW(InvalidArgument, "{}: lacks the model's '{}'", where, name);
    if (it->second.sizes() != target.sizes()) {
      SHOAL_THROW(InvalidArgument, "{}: '{}' has shape {}, the model's has {}", where, name,
                  c10::str(it->second.sizes()), c10::str(target.sizes()));
    }
  }
  torch::NoGradGuard noGrad;
  for (auto& [name, target] : mine) {
    torch::Tensor dst = target;
    dst.copy_(tensors.at(name));
  }
}

}  // namespace shoal::train
