#include "train/optim/layer_map.h"

#include <algorithm>

#include "common/error.h"

namespace shoal::train {

ResolvedLayers resolveLayers(const LayerMap& map, const std::vector<torch::Tensor>& tensors) {
  ResolvedLayers r;
  if (map.segments.empty()) {
    SHOAL_CHECK(map.oneDim.empty() || map.oneDim.size() == tensors.size(),
                "layer map: {} oneDim flags for {} whole-tensor layers", map.oneDim.size(),
                tensors.size());
    for (size_t i = 0; i < tensors.size(); ++i) {
      r.segments.push_back({i, 0, tensors[i].numel(), i});
      r.oneDim.push_back(map.oneDim.empty() ? tensors[i].dim() <= 1 : map.oneDim[i]);
    }
    return r;
  }
  r.segments = map.segments;
  r.oneDim = map.oneDim;
  for (const auto& s : r.segments) {
    SHOAL_CHECK(s.tensor < tensors.size() && s.layer < r.oneDim.size() && s.offset >= 0 &&
                    s.numel > 0 && s.offset + s.numel <= tensors[s.tensor].numel(),
                "layer map: segment (tensor {}, offset {}, numel {}, layer {}) out of range of "
                "{} tensors and {} layers",
                s.tensor, s.offset, s.numel, s.layer, tensors.size(), r.oneDim.size());
  }
  // Exact cover: sorted by (tensor, offset), each segment starts where the previous one ended.
  auto sorted = r.segments;
  std::sort(sorted.begin(), sorted.end(), [](const LayerSegment& a, const LayerSegment& b) {
    return a.tensor != b.tensor ? a.tensor < b.tensor : a.offset < b.offset;
  });
  size_t next = 0;
  for (size_t t = 0; t < tensors.size(); ++t) {
    SHOAL_CHECK(tensors[t].is_contiguous(), "layer map: tensor {} is not contiguous", t);
    int64_t end = 0;
    for (; next < sorted.size() && sorted[next].tensor == t; ++next) {
      SHOAL_CHECK_EQ(sorted[next].offset, end, "layer map: tensor {} has a gap or an overlap", t);
      end += sorted[next].numel;
    }
    SHOAL_CHECK_EQ(end, tensors[t].numel(), "layer map: tensor {} is not covered", t);
  }
  return r;
}

std::vector<FlatParam> flatParams(const std::vector<torch::optim::OptimizerParamGroup>& groups) {
  std::vector<FlatParam> out;
  for (size_t g = 0; g < groups.size(); ++g) {
    for (const auto& p : groups[g].params()) out.push_back({p, g});
  }
  return out;
}

torch::Tensor segmentOf(const torch::Tensor& t, const LayerSegment& seg) {
  if (seg.offset == 0 && seg.numel == t.numel()) return t;
  return t.view(-1).narrow(0, seg.offset, seg.numel);
}

}  // namespace shoal::train
