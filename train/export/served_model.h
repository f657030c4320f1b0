// The models shoal-serve can serve, by name, and one loaded copy of one.
//
// A model name fixes the architecture and its input, 784 floats per instance (Fashion-MNIST
// images standardized as train/idx_dataset.h does) giving 10 logits:
//   fashion_cnn  train/fashion_cnn.h, instances shaped 1×28×28 (421k parameters)
//   fashion_mlp  train/fashion_mlp.h, 784-4096-4096-10 with ReLUs (20 M parameters, 80 MB)
// The weights come from a file in any format train/export/tensor_file.h reads (torch::save,
// pickled state_dict, safetensors), loaded strictly: every tensor present with its shape, nothing
// else, so a file of another architecture is refused.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace shoal::serve {

// The known model names, for --model's help and errors.
std::vector<std::string> servedModelNames();

// Process-wide settings of the libtorch runtime for serving, set once at start before any
// forward: `threads` for libtorch's own parallel loops and for OpenBLAS, and whether
// convolutions may use oneDNN (mkldnn).
// Why OpenBLAS too: Debian's libtorch does its matrix products in OpenBLAS (pthreads build), whose
// thread pool libtorch's thread count does not reach. Several threads calling it at once (workers,
// or the naive server's HTTP threads) then contend for that one pool and spin: measured on 2
// cores, 32 concurrent clients got 36-186 answers/s instead of ~2450.
// Why mkldnn may be turned off: on this host's libtorch, oneDNN convolutions of FashionCnn from
// batch 4 up cost ~2.2 ms per instance against ~0.5 ms for the native path at every batch size
// (bench/results/serve.md), which would make batching slower, not faster.
struct TorchRuntime {
  int threads = 1;
  bool mkldnn = true;
};
void configureTorchRuntime(const TorchRuntime& runtime);

// One immutable loaded model, in eval mode.
//
// Threading: forward() may run on many threads at once. It runs under NoGradGuard in eval mode,
// where the module's forward only reads its parameters and buffers (BatchNorm uses its running
// statistics without updating them, dropout is the identity), and libtorch's CPU kernels are
// safe to call concurrently on shared read-only tensors; so workers share one copy rather than
// holding a replica each.
class ServedModel {
 public:
  // Builds `name`'s module and loads `path` into it. InvalidArgument for an unknown name (naming
  // the known ones) or a file that is unreadable or does not fit the model.
  static std::shared_ptr<const ServedModel> load(const std::string& name, const std::string& path,
                                                 uint64_t version);

  const std::string& name() const { return name_; }
  uint64_t version() const { return version_; }
  size_t instanceSize() const { return instanceSize_; }  // floats per instance
  size_t classes() const { return classes_; }

  // Logits for `instances` instances (values: instances × instanceSize floats, row-major), as
  // instances × classes floats.
  std::vector<float> forward(const float* values, size_t instances) const;

 private:
  ServedModel() = default;
  std::string name_;
  uint64_t version_ = 0;
  size_t instanceSize_ = 0, classes_ = 0;
  std::vector<int64_t> instanceShape_;
  std::shared_ptr<torch::nn::Module> module_;
  std::function<torch::Tensor(const torch::Tensor&)> run_;
};

}  // namespace shoal::serve
