// train/export/served_model.h.
#include "train/export/served_model.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstring>

#include "common/error.h"
#include "train/export/tensor_file.h"
#include "train/fashion_cnn.h"
#include "train/fashion_mlp.h"

namespace shoal::serve {

std::vector<std::string> servedModelNames() {
  return {"fashion_cnn", "fashion_mlp"};
}

std::shared_ptr<const ServedModel> ServedModel::load(const std::string& name,
                                                     const std::string& path, uint64_t version) {
  std::shared_ptr<ServedModel> m(new ServedModel());
  m->name_ = name;
  m->version_ = version;
  if (name == "fashion_cnn") {
    auto cnn = std::make_shared<train::FashionCnnImpl>();
    m->module_ = cnn;
    m->instanceShape_ = {1, 28, 28};
    m->classes_ = 10;
    m->run_ = [cnn](const torch::Tensor& x) { return cnn->forward(x); };
  } else if (name == "fashion_mlp") {
    auto mlp = std::make_shared<train::FashionMlpImpl>();
    m->module_ = mlp;
    m->instanceShape_ = {784};
    m->classes_ = 10;
    m->run_ = [mlp](const torch::Tensor& x) { return mlp->forward(x); };
  } else {
    SHOAL_THROW(InvalidArgument, "unknown model '{}' (known: {})", name,
                fmt::join(servedModelNames(), ", "));
  }
  m->instanceSize_ = 1;
  for (int64_t d : m->instanceShape_) m->instanceSize_ *= static_cast<size_t>(d);
  train::loadModuleTensors(*m->module_, train::readTensorFile(path), path);
  m->module_->eval();
  return m;
}

// OpenBLAS's own setter, when the BLAS libtorch loaded is OpenBLAS; absent (null) otherwise.
extern "C" void openblas_set_num_threads(int) __attribute__((weak));

void configureTorchRuntime(const TorchRuntime& runtime) {
  SHOAL_CHECK_GE(runtime.threads, 1, "libtorch threads");
  // Global: threads the process starts later take this count on their first parallel loop.
  torch::set_num_threads(runtime.threads);
  if (openblas_set_num_threads != nullptr) openblas_set_num_threads(runtime.threads);
  at::globalContext().setUserEnabledMkldnn(runtime.mkldnn);
}

std::vector<float> ServedModel::forward(const float* values, size_t instances) const {
  torch::NoGradGuard noGrad;
  std::vector<int64_t> shape{static_cast<int64_t>(instances)};
  shape.insert(shape.end(), instanceShape_.begin(), instanceShape_.end());
  // from_blob: no copy of the request's floats; the tensor does not outlive this call.
  const torch::Tensor x = torch::from_blob(const_cast<float*>(values), shape, torch::kFloat32);
  const torch::Tensor y = run_(x).contiguous();
  SHOAL_ASSERT(y.numel() == static_cast<int64_t>(instances * classes_), "model output {}",
               c10::str(y.sizes()));
  std::vector<float> out(instances * classes_);
  std::memcpy(out.data(), y.data_ptr<float>(), out.size() * sizeof(float));
  return out;
}

}  // namespace shoal::serve
