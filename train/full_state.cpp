#include "train/full_state.h"

#include <fmt/format.h>

#include <map>
#include <sstream>

#include "common/error.h"
#include "common/sealed_file.h"
#include "train/tensor/parallel_layer.h"

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
    }
  }
  return out;
}

namespace {
constexpr const char* kNames = "shoal.full_state.names";
}

std::string encodeFullState(const FullState& state) {
  torch::serialize::OutputArchive archive;
  std::string names;
  for (size_t i = 0; i < state.size(); ++i) {
    names += state[i].first + "\n";
    archive.write(fmt::format("t{}", i), state[i].second);
  }
  archive.write(
      kNames,
      torch::from_blob(names.data(), {static_cast<int64_t>(names.size())}, torch::kUInt8).clone());
  std::ostringstream payload;
  archive.save_to(payload);
  return payload.str();
}

void writeFullState(const std::string& path, const FullState& state) {
  writeSealedFile(path, encodeFullState(state));
}

FullState readFullState(const std::string& path) {
  return decodeFullState(readSealedFile(path), path);
}

FullState decodeFullState(const std::string& payload, const std::string& what) {
  FullState out;
  try {
    std::istringstream in(payload);
    torch::serialize::InputArchive archive;
    archive.load_from(in);
    torch::Tensor namesTensor;
    archive.read(kNames, namesTensor);
    const std::string names(static_cast<const char*>(namesTensor.data_ptr()),
                            static_cast<size_t>(namesTensor.numel()));
    std::istringstream lines(names);
    std::string name;
    for (size_t i = 0; std::getline(lines, name); ++i) {
      torch::Tensor t;
      archive.read(fmt::format("t{}", i), t);
      out.emplace_back(name, t);
    }
  } catch (const c10::Error& e) {
    SHOAL_THROW(InvalidArgument, "{}: not a full model state ({})", what,
                e.what_without_backtrace());
  }
  return out;
}

void loadFullState(torch::nn::Module& model, const FullState& state) {
  std::map<std::string, torch::Tensor> byName(state.begin(), state.end());
  auto params = model.named_parameters();
  for (const auto& p : params) {
    auto it = byName.find(p.key());
    if (it == byName.end()) {
      SHOAL_THROW(InvalidArgument, "full state: no value for parameter {}", p.key());
    }
    if (it->second.sizes() != p.value().sizes()) {
      SHOAL_THROW(InvalidArgument, "full state: parameter {} is {} in the model, {} in the state",
                  p.key(), c10::str(p.value().sizes()), c10::str(it->second.sizes()));
    }
  }
  if (byName.size() != params.size()) {
    for (const auto& [name, t] : byName) {
      if (params.find(name) == nullptr) {
        SHOAL_THROW(InvalidArgument, "full state: {} is not a parameter of the model", name);
      }
    }
  }
  torch::NoGradGuard noGrad;
  for (auto& p : params) p.value().copy_(byName.at(p.key()));
}

}  // namespace shoal::train
