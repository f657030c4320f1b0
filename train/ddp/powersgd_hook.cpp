// PowerSGD (train/ddp/compression_hook.h): low-rank P and Q per matrix, two all-reduces, a
// warm-started Q and error-feedback residuals (it needs matrix products and QR, so it lives here
// rather than among the codecs of comm/compress/).
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include <unordered_map>
#include <utility>
#include <vector>

#include "comm/collectives.h"
#include "common/error.h"
#include "train/ddp/compression_parts.h"

namespace shoal::train::ddp::compression {

namespace {

using compress::Codec;
using compress::CompressionSpec;

// Note [PowerSGD]
// For each gradient viewed as an n x m matrix G (its first dimension by the rest) with
// rank < min(n, m): M = G + residual; P = M Q; P averaged over ranks and orthonormalized
// (reduced QR); Q = M^T P averaged; the gradient becomes P Q^T, and the residual M - P Q^T.
// Q is kept for the next step (the warm start that makes one power iteration per step enough)
// and starts from the same random matrix on every rank. Each step sends (n + m) * rank floats
// per matrix instead of n * m. The other gradients of the bucket (biases, matrices too small
// to gain) travel uncompressed in the same all-reduce as the P's.
struct PowerSgdState : BucketState {
  struct Matrix {
    size_t param = 0;  // index into bucket.params
    int64_t rows = 0, cols = 0;
    torch::Tensor m;  // this step's M
    torch::Tensor p;  // view into `first`
  };
  std::vector<Matrix> matrices;
  std::vector<size_t> plain;  // bucket positions sent uncompressed
  torch::Tensor first;        // P's then the plain gradients: the first all-reduce
  torch::Tensor second;       // the Q's: the second all-reduce
  bool compressed = false;
};

class PowerSgdHook : public CommHook {
 public:
  explicit PowerSgdHook(CompressionSpec spec) : spec_(spec), steps_(spec.warmupSteps) {}

  std::unique_ptr<BucketState> makeState(comm::Group&, const GradBucket& bucket) override {
    auto s = std::make_unique<PowerSgdState>();
    int64_t firstNumel = 0;
    for (size_t k = 0; k < bucket.params.size(); ++k) {
      const auto& shape = bucket.shapes.at(k);
      const int64_t rows = shape.empty() ? 1 : shape[0];
      const int64_t cols = rows == 0 ? 0 : bucket.numels[k] / rows;
      const int64_t r = spec_.rank;
      if (shape.size() >= 2 && r < std::min(rows, cols) && (rows + cols) * r < rows * cols) {
        s->matrices.push_back({k, rows, cols, {}, {}});
        matrixShapes_[bucket.params[k]] = {rows, cols};
        firstNumel += rows * r;
      } else {
        s->plain.push_back(k);
        firstNumel += bucket.numels[k];
      }
    }
    s->first = torch::zeros({firstNumel}, torch::kFloat32);
    int64_t secondNumel = 0;
    for (auto& mat : s->matrices) secondNumel += mat.cols * spec_.rank;
    s->second = torch::zeros({secondNumel}, torch::kFloat32);
    return s;
  }

  std::shared_ptr<comm::Work> start(comm::Group& group, GradBucket& bucket) override {
    torch::NoGradGuard noGrad;
    auto& s = bucket.stateAs<PowerSgdState>();
    s.compressed = steps_.compressed(bucket) && isFloat32(bucket);
    if (!s.compressed) return plainAverage(group, bucket);
    int64_t at = 0;
    for (auto& mat : s.matrices) {
      const size_t param = bucket.params[mat.param];
      auto grad = bucket.buffer.narrow(0, bucket.offsets[mat.param], bucket.numels[mat.param])
                      .view({mat.rows, mat.cols});
      auto& residual = residual_[param];
      if (!residual.defined()) residual = torch::zeros_like(grad);
      mat.m = grad + residual;
      mat.p = s.first.narrow(0, at, mat.rows * spec_.rank).view({mat.rows, spec_.rank});
      at += mat.rows * spec_.rank;
      torch::mm_out(mat.p, mat.m, warmQ(param, mat.cols));
    }
    for (size_t k : s.plain) {
      s.first.narrow(0, at, bucket.numels[k])
          .copy_(bucket.buffer.narrow(0, bucket.offsets[k], bucket.numels[k]));
      at += bucket.numels[k];
    }
    return comm::allreduceAsync(group, s.first.data_ptr(), static_cast<size_t>(s.first.numel()),
                                DataType::kFloat32, ReduceOp::kAvg);
  }

  void finish(comm::Group& group, GradBucket& bucket) override {
    torch::NoGradGuard noGrad;
    auto& s = bucket.stateAs<PowerSgdState>();
    if (!s.compressed) return;
    int64_t at = 0;
    for (auto& mat : s.matrices) at += mat.rows * spec_.rank;
    for (size_t k : s.plain) {
      bucket.buffer.narrow(0, bucket.offsets[k], bucket.numels[k])
          .copy_(s.first.narrow(0, at, bucket.numels[k]));
      at += bucket.numels[k];
    }
    if (s.matrices.empty()) return;
    at = 0;
    std::vector<torch::Tensor> qs;
    for (auto& mat : s.matrices) {
      mat.p.copy_(std::get<0>(torch::linalg_qr(mat.p)));
      auto q = s.second.narrow(0, at, mat.cols * spec_.rank).view({mat.cols, spec_.rank});
      at += mat.cols * spec_.rank;
      torch::mm_out(q, mat.m.t(), mat.p);
      qs.push_back(q);
    }
    comm::allreduce(group, s.second.data_ptr(), static_cast<size_t>(s.second.numel()),
                    DataType::kFloat32, ReduceOp::kAvg);
    for (size_t i = 0; i < s.matrices.size(); ++i) {
      auto& mat = s.matrices[i];
      const size_t param = bucket.params[mat.param];
      auto grad = bucket.buffer.narrow(0, bucket.offsets[mat.param], bucket.numels[mat.param])
                      .view({mat.rows, mat.cols});
      torch::mm_out(grad, mat.p, qs[i].t());
      residual_[param] = mat.m - grad;
      q_[param].copy_(qs[i]);
      mat.m = torch::Tensor();
    }
  }

  std::string name() const override { return fmt::format("{} all-reduce", spec_.toString()); }

  std::string stateKind() const override { return fmt::format("powersgd:{}", spec_.rank); }

  // Each matrix's residual (this rank's) and Q (the same on every rank: the average of the
  // last step's second all-reduce).
  std::optional<HookState> viewState() const override {
    HookState state;
    state.kind = stateKind();
    state.steps = steps_.steps();
    for (const auto& [param, residual] : residual_) {
      state.tensors.push_back({"residual", param, true, residual.reshape(-1)});
    }
    for (const auto& [param, q] : q_) {
      state.tensors.push_back({"q", param, false, q.reshape(-1)});
    }
    return state;
  }

  void importState(const HookState& state) override {
    checkKind(*this, state);
    for (const auto& t : state.tensors) {
      auto it = matrixShapes_.find(t.param);
      if (it == matrixShapes_.end()) {
        SHOAL_THROW(InvalidArgument, "{}: a saved {} for parameter {}, which it does not compress",
                    name(), t.key, t.param);
      }
      const auto [rows, cols] = it->second;
      const int64_t want = t.key == "residual" ? rows * cols : cols * spec_.rank;
      if ((t.key != "residual" && t.key != "q") || t.data.scalar_type() != torch::kFloat32 ||
          t.data.dim() != 1 || t.data.numel() != want) {
        SHOAL_THROW(InvalidArgument, "{}: a saved '{}' of parameter {} with {} elements (wants {})",
                    name(), t.key, t.param, t.data.numel(), want);
      }
    }
    // The state becomes `state`: a matrix it holds nothing for starts as a new one would.
    residual_.clear();
    q_.clear();
    for (const auto& t : state.tensors) {
      const auto [rows, cols] = matrixShapes_.at(t.param);
      if (t.key == "residual") {
        residual_[t.param] = t.data.clone().view({rows, cols});
      } else {
        q_[t.param] = t.data.clone().view({cols, spec_.rank});
      }
    }
    steps_.setSteps(state.steps);
  }

 private:
  // The Q of parameter `param`: last step's, or the same random start on every rank.
  const torch::Tensor& warmQ(size_t param, int64_t cols) {
    auto& q = q_[param];
    if (!q.defined()) {
      auto gen = at::detail::createCPUGenerator(0x5eedULL + param);
      q = torch::randn({cols, spec_.rank}, gen, torch::kFloat32);
    }
    return q;
  }

  CompressionSpec spec_;
  StepCounter steps_;
  std::unordered_map<size_t, torch::Tensor> residual_;
  std::unordered_map<size_t, torch::Tensor> q_;
  // The parameters compressed as matrices (rows, cols), from makeState: what a saved state
  // must fit.
  std::unordered_map<size_t, std::pair<int64_t, int64_t>> matrixShapes_;
};

}  // namespace

std::shared_ptr<CommHook> powerSgdHook(const CompressionSpec& spec) {
  return std::make_shared<PowerSgdHook>(spec);
}

}  // namespace shoal::train::ddp::compression
