// Named tensors in and out of the files a trained model travels in: what `shoal-export` writes
// and what `shoal-serve` loads.
//
// Four formats, told apart by their first bytes when read:
//   kTorchSave    a libtorch archive as torch::save(module, path) and shoal-consolidate write
//                 (C++ torch::load reads it; Python cannot, it holds TorchScript modules)
//   kPickleDict   a zip holding one pickled dict name → tensor, as torch::pickle_save writes it:
//                 Python's plain torch.load(path) returns that dict (a state_dict)
//   kSafetensors  train/export/safetensors.h
//   kFullState    a sealed file (common/sealed_file.h, magic "SHOALCK1") holding a model's full
//                 state (train/full_state.h): what a trainer's --save writes, the consolidated
//                 form of a pipeline, tensor-parallel, hybrid or data-parallel model. Read only.
// Names are module paths as state_dict() spells them ("conv1.weight", "bn1.running_mean").
//
// Every reader takes untrusted files: sizes are checked before they size anything (zip archives
// by train/archive_bounds.h before libtorch opens them), and anything malformed is an
// InvalidArgument with one line naming the file. Stateless free functions, thread-safe.
#pragma once

#include <torch/torch.h>

#include <map>
#include <optional>
#include <string>

namespace shoal::train {

enum class TensorFileFormat { kTorchSave, kPickleDict, kSafetensors, kFullState };

using NamedTensors = std::map<std::string, torch::Tensor>;

// "pt" (kPickleDict) or "safetensors" (the formats written); the name of a format for messages
// ("torch-save" and "full-state" too).
TensorFileFormat tensorFileFormatFromName(const std::string& name);
const char* tensorFileFormatName(TensorFileFormat format);

// What the file holds, by its first bytes: "PK" zip files are kTorchSave or kPickleDict (told
// apart by whether the archive holds TorchScript code), the sealed file's magic (or a truncated
// start of it) kFullState, anything else is taken as safetensors.
TensorFileFormat detectTensorFileFormat(const std::string& path);

// Every tensor of a file in any of the four formats, as contiguous CPU tensors. A torch::save
// archive is walked through its nested module archives; a pickle file must hold a dict of
// string → tensor; a full state is checked whole (length, SHA-256, every size in its bundle) before
// it is decoded, and must name each tensor once.
NamedTensors readTensorFile(const std::string& path);

// Every tensor of the newest committed step (or `step`) of a sharded checkpoint folder
// (train/reshard_checkpoint.h): its "param/" and "buffer/" tensors, under their module paths.
NamedTensors readCheckpointFolder(const std::string& dir, std::optional<int64_t> step = {});

// Writes `tensors` in `format` (kPickleDict or kSafetensors; kTorchSave and kFullState are
// InvalidArgument: use torch::save on a module, train::writeFullState) atomically
// (train/export/file_bytes.h). SystemError if writing fails.
void writeTensorFile(const std::string& path, const NamedTensors& tensors, TensorFileFormat format);

// The parameters and buffers of `module` by name, as state_dict() lists them (detached, shared
// with the module).
NamedTensors moduleTensors(const torch::nn::Module& module);

// Copies `tensors` into `module`'s parameters and buffers. Strict: every name of the module must
// be present with the same shape (dtypes are converted), and no other name may be; otherwise
// InvalidArgument naming the first missing, unexpected or mismatched tensor and `where`.
void loadModuleTensors(torch::nn::Module& module, const NamedTensors& tensors,
                       const std::string& where);

}  // namespace shoal::train
