#include "train/full_state.h"

#include <fmt/format.h>

#include <map>

#include "common/error.h"
#include "common/sealed_file.h"
#include "train/tensor/parallel_layer.h"
#include "train/tensor_bundle.h"

namespace shoal::train {

FullState gatherFullState(const torch::nn::Module& model) {
  FullState out;
  for (const auto& item : model.named_modules()) {
    const std::string prefix = item.key().empty() ? "" : item.key() + ".";
    if (const auto* layer = dynamic_cast<const tensor::ParallelLayer*>(item.value().get())) {
      for (auto& [name, full] : layer->gatherFull()) out.emplace_back(prefix + name, full);
    } else {
      for (const auto& p : item.value()->named_parameters(/*recurse=*/false)) {
        out.emplace_back(prefix + p.key(), p.value().detach().clone());
      }
      for (const auto& b : item.value()->named_buffers(/*recurse=*/false)) {
        out.emplace_back(prefix + b.key(), b.value().detach().clone());
      }
    }
  }
  return out;
}

namespace {
constexpr std::string_view kFullStateKind = "full-state";
}

std::string encodeFullState(const FullState& state) {
  return encodeTensorBundle(kFullStateKind, state);
}

void writeFullState(const std::string& path, const FullState& state) {
  writeSealedFile(path, encodeFullState(state));
}

FullState readFullState(const std::string& path) {
  return decodeFullState(readSealedFile(path), path);
}

FullState decodeFullState(const std::string& payload, const std::string& what) {
  if (looksLikeLibtorchArchive(payload)) {
    SHOAL_THROW(InvalidArgument,
                "{}: a libtorch archive, as Shoal wrote full model states before tensor bundles "
                "(train/tensor_bundle.h); this Shoal does not read them (loading one runs "
                "libtorch's TorchScript importer, which a crafted file crashes): read it with the "
                "Shoal that wrote it",
                what);
  }
  return decodeTensorBundle(payload, kFullStateKind,
                            fmt::format("{}: not a full model state", what));
}

void loadFullState(torch::nn::Module& model, const FullState& state) {
  std::map<std::string, torch::Tensor> byName(state.begin(), state.end());
  struct Target {
    torch::Tensor tensor;
    const char* kind;
  };
  std::map<std::string, Target> targets;
  for (const auto& p : model.named_parameters()) targets[p.key()] = {p.value(), "parameter"};
  for (const auto& b : model.named_buffers()) targets[b.key()] = {b.value(), "buffer"};
  for (const auto& [name, target] : targets) {
    auto it = byName.find(name);
    if (it == byName.end()) {
      SHOAL_THROW(InvalidArgument, "full state: no value for {} {}", target.kind, name);
    }
    if (it->second.sizes() != target.tensor.sizes()) {
      SHOAL_THROW(InvalidArgument, "full state: {} {} is {} in the model, {} in the state",
                  target.kind, name, c10::str(target.tensor.sizes()), c10::str(it->second.sizes()));
    }
  }
  for (const auto& [name, t] : byName) {
    if (!targets.contains(name)) {
      SHOAL_THROW(InvalidArgument, "full state: {} is not a parameter or buffer of the model",
                  name);
    }
  }
  torch::NoGradGuard noGrad;
  for (auto& [name, target] : targets) target.tensor.copy_(byName.at(name));
}

}  // namespace shoal::train
