// A data-parallel checkpoint (train/checkpoint.h) whose sealed framing is intact but whose
// tensor bundle (train/tensor_bundle.h) is arbitrary: the input is sealed as a payload, then
// loaded into a small model and its Adam optimizer by a group of one rank. (The framing itself
// is sealed_file_fuzz's.)
//
// Oracle: no crash or sanitizer report in Shoal's code; errors are Shoal's typed errors only
// (a c10::Error escaping from libtorch's tensor or generator code is a finding). libtorch itself
// is not instrumented: a memory error inside it shows only if it crashes.
#include <torch/torch.h>

#include "fuzz/fuzz_util.h"
#include "store/memory_store.h"
#include "train/checkpoint.h"

using namespace shoal;

namespace shoal::fuzz {
// The model the seed generator saves and this target loads into (make_corpus.cpp).
std::shared_ptr<torch::nn::Module> makeCheckpointModel();
}  // namespace shoal::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  constexpr const char* kTarget = "checkpoint";
  static std::shared_ptr<comm::Group> group = [] {
    comm::GroupOptions o;
    o.transport = TransportKind::kTcp;
    o.timeout = seconds(30);
    o.secret = "fuzz-secret";
    return comm::Group::create(std::make_shared<store::MemoryStore>(), 0, 1, o);
  }();
  static train::Checkpointer checkpointer(fuzz::scratchDir() + "/ckpt", 1);
  const std::string path = fuzz::scratchDir() + "/ckpt.pt";
  writeSealedFile(path, std::string_view(reinterpret_cast<const char*>(data), size));

  torch::manual_seed(0);
  auto model = fuzz::makeCheckpointModel();
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-3));
  fuzz::expectTypedErrors(kTarget, [&] { (void)checkpointer.load(*group, path, *model, opt); });
  return 0;
}
