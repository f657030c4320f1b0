#include "train/pipeline/plan.h"

#include <fmt/format.h>

#include <cmath>
#include <sstream>

#include "common/error.h"
#include "train/pipeline/partition.h"
#include "train/pipeline/profile.h"

namespace shoal::train::pipeline {

namespace {

constexpr int kMaxDims = 8;
const char* methodName(SplitMethod m) {
  switch (m) {
    case SplitMethod::kTime:
      return "time";
    case SplitMethod::kParameters:
      return "parameters";
    case SplitMethod::kBoundaries:
      return "boundaries";
  }
  return "?";
}

// The helper's form of explicit boundaries: the first layer of every stage, 0 included.
std::vector<int> firstLayers(const PlanRequest& r) {
  std::vector<int> first{0};
  first.insert(first.end(), r.boundaries.begin(), r.boundaries.end());
  return first;
}

}  // namespace

void validate(const PlanRequest& r, int layers) {
  SHOAL_CHECK(r.virtualStages >= 1 && r.stages >= 1, "pipeline: {} virtual stages on {} ranks",
              r.virtualStages, r.stages);
  if (layers < r.virtualStages) {
    SHOAL_THROW(InvalidArgument,
                "pipeline: the model has {} layers, too few for {} virtual stages (every stage "
                "needs at least one layer)",
                layers, r.virtualStages);
  }
  if (r.split == SplitMethod::kBoundaries) {
    if (static_cast<int>(r.boundaries.size()) != r.virtualStages - 1) {
      SHOAL_THROW(InvalidArgument,
                  "pipeline: {} boundaries given for {} virtual stages (give the first layer of "
                  "each stage after the first: {} numbers)",
                  r.boundaries.size(), r.virtualStages, r.virtualStages - 1);
    }
    fromBoundaries(firstLayers(r), layers);  // throws what is wrong
  } else if (!r.boundaries.empty()) {
    SHOAL_THROW(InvalidArgument, "pipeline: boundaries given but the split is by {}",
                methodName(r.split));
  }
}

Plan makePlan(torch::nn::Sequential& model, const torch::Tensor& sample,
              const PlanRequest& request) {
  validate(request, static_cast<int>(model->size()));
  SHOAL_CHECK(sample.defined(), "pipeline: world rank 0 needs a sample micro-batch to plan with");
  // What each layer outputs for this micro-batch (shape, dtype): what crosses a boundary.
  std::vector<LayerInfo> info;
  std::vector<std::pair<std::vector<int64_t>, torch::ScalarType>> outputs;
  {
    torch::NoGradGuard noGrad;
    torch::Tensor x = sample;
    for (const auto& item : model->named_children()) {
      x = (model->begin() + static_cast<long>(info.size()))->forward(x);
      int64_t params = 0;
      for (const auto& p : item.value()->parameters()) params += p.numel();
      info.push_back({item.key(), params, 0.0, x.numel() * static_cast<int64_t>(x.element_size())});
      outputs.emplace_back(x.sizes().vec(), x.scalar_type());
    }
  }
  PartitionPlan cut;
  switch (request.split) {
    case SplitMethod::kTime: {
      auto profile = profileLayers(model, sample, request.profileRepeats);
      SHOAL_ASSERT(profile.size() == info.size(), "{} profiles for {} layers", profile.size(),
                   info.size());
      for (size_t l = 0; l < info.size(); ++l) info[l].ms = profile[l].ms;
      cut = planByTime(std::move(info), request.virtualStages);
      break;
    }
    case SplitMethod::kParameters:
      cut = planByParameters(std::move(info), request.virtualStages);
      break;
    case SplitMethod::kBoundaries:
      cut = planFromBoundaries(std::move(info), firstLayers(request));
      break;
  }
  Plan plan;
  plan.method = methodName(request.split);
  plan.boundaries = cut.boundaries;
  for (const auto& layer : cut.layers) plan.layerMs.push_back(layer.ms);
  for (int s = 0; s + 1 < request.virtualStages; ++s) {
    const auto& [shape, dtype] = outputs[static_cast<size_t>(plan.boundaries[s + 1] - 1)];
    SHOAL_CHECK(!shape.empty(),
                "pipeline: layer {} ('{}') outputs a scalar, which cannot cross stages",
                plan.boundaries[s + 1] - 1, cut.layers[plan.boundaries[s + 1] - 1].name);
    wireType(dtype);  // throws for a type that cannot cross
    plan.crossing.push_back({std::vector<int64_t>(shape.begin() + 1, shape.end()), dtype});
  }
  plan.table = fmt::format(
      "pipeline plan (virtual stage s runs on pipeline rank s % {}; costs per micro-batch of "
      "{}):\n{}",
      request.stages, sample.size(0), cut.describe());
  return plan;
}

std::string encode(const Plan& plan) {
  std::ostringstream out;
  out << plan.method << '\n' << plan.boundaries.size();
  for (int b : plan.boundaries) out << ' ' << b;
  out << '\n' << plan.layerMs.size();
  out.precision(17);
  for (double ms : plan.layerMs) out << ' ' << ms;
  out << '\n';
  for (const auto& c : plan.crossing) {
    out << wireType(c.dtype) << ' ' << c.sampleShape.size();
    for (int64_t d : c.sampleShape) out << ' ' << d;
    out << '\n';
  }
  out << plan.table;
  return out.str();
}

Plan decode(const std::string& bytes, int virtualStages, int layers) {
  std::istringstream in(bytes);
  Plan plan;
  size_t n = 0;
  auto bad = [&](const char* what) {
    SHOAL_THROW(ProtocolError, "pipeline: the plan received is malformed ({})", what);
  };
  if (!(in >> plan.method >> n) || n != static_cast<size_t>(virtualStages) + 1) {
    bad("stage count");
  }
  for (size_t i = 0; i < n; ++i) {
    int b = 0;
    if (!(in >> b) || b < 0 || b > layers || (i > 0 && b <= plan.boundaries.back())) {
      bad("boundaries");
    }
    plan.boundaries.push_back(b);
  }
  if (plan.boundaries.front() != 0 || plan.boundaries.back() != layers) bad("boundary range");
  if (!(in >> n) || n != static_cast<size_t>(layers)) bad("layer costs");
  for (size_t i = 0; i < n; ++i) {
    double ms = 0;
    if (!(in >> ms) || !std::isfinite(ms) || ms < 0) bad("layer cost");
    plan.layerMs.push_back(ms);
  }
  for (int s = 0; s + 1 < virtualStages; ++s) {
    int64_t type = 0;
    size_t dims = 0;
    if (!(in >> type >> dims) || !fromWireType(type) || dims >= kMaxDims) {
      bad("crossing");
    }
    BoundarySpec spec;
    spec.dtype = *fromWireType(type);
    for (size_t d = 0; d < dims; ++d) {
      int64_t v = 0;
      if (!(in >> v) || v < 0 || v > (int64_t{1} << 40)) bad("crossing shape");
      spec.sampleShape.push_back(v);
    }
    plan.crossing.push_back(std::move(spec));
  }
  in.get();  // the newline before the table
  std::ostringstream rest;
  rest << in.rdbuf();
  plan.table = rest.str();
  return plan;
}

}  // namespace shoal::train::pipeline
