#include "train/process_grid.h"

#include <fmt/format.h>

#include <array>
#include <tuple>

#include "common/error.h"

namespace shoal::train {
namespace {

enum Dim { kData = 0, kPipeline = 1, kTensor = 2 };
constexpr std::array<std::string_view, 3> kDimNames = {"data", "pipeline", "tensor"};

// The dimensions of `order`, fastest first; InvalidArgument unless it is a permutation of the
// three names.
std::array<Dim, 3> parseOrder(std::string_view order) {
  auto invalid = [&] {
    SHOAL_THROW(InvalidArgument,
                "process grid: order \"{}\" is not a permutation of tensor, pipeline and data "
                "(comma-separated, fastest-varying first)",
                order);
  };
  std::array<Dim, 3> dims{};
  std::array<bool, 3> seen{};
  size_t n = 0;
  size_t at = 0;
  for (;;) {
    size_t comma = order.find(',', at);
    std::string_view name =
        order.substr(at, comma == std::string_view::npos ? order.npos : comma - at);
    while (!name.empty() && name.front() == ' ') name.remove_prefix(1);
    while (!name.empty() && name.back() == ' ') name.remove_suffix(1);
    int d = -1;
    for (int i = 0; i < 3; ++i) {
      if (name == kDimNames[i]) d = i;
    }
    if (d < 0 || seen[d] || n == 3) invalid();
    seen[d] = true;
    dims[n++] = static_cast<Dim>(d);
    if (comma == std::string_view::npos) break;
    at = comma + 1;
  }
  if (n != 3) invalid();
  return dims;
}

std::string joinOrder(const std::array<Dim, 3>& dims) {
  return fmt::format("{},{},{}", kDimNames[dims[0]], kDimNames[dims[1]], kDimNames[dims[2]]);
}

// Note [Grid layout]: with dims (a, b, c) fastest first and sizes (A, B, C), world rank
// w = a + A * (b + B * c).
int rankAt(const std::array<Dim, 3>& dims, const std::array<int, 3>& size,
           const std::array<int, 3>& coord) {
  int w = 0;
  for (int i = 2; i >= 0; --i) w = w * size[dims[i]] + coord[dims[i]];
  return w;
}

std::array<int, 3> coordsOf(const std::array<Dim, 3>& dims, const std::array<int, 3>& size, int w) {
  std::array<int, 3> coord{};
  for (Dim d : dims) {
    coord[d] = w % size[d];
    w /= size[d];
  }
  return coord;
}

}  // namespace

ProcessGrid makeProcessGrid(std::shared_ptr<comm::Group> world, const ProcessGridOptions& o) {
  SHOAL_CHECK(world != nullptr, "process grid: no world group");
  const int n = world->size();
  for (auto [name, value, least] :
       {std::tuple{"data", o.data, 0}, std::tuple{"pipeline", o.pipeline, 1},
        std::tuple{"tensor", o.tensor, 1}}) {
    if (value < least) {
      SHOAL_THROW(InvalidArgument,
                  "process grid: {} {} is not a size (pipeline and tensor are at least 1; data "
                  "is at least 1, or 0 for world / (pipeline x tensor))",
                  name, value);
    }
  }
  const auto dims = parseOrder(o.order);
  const int64_t inner = int64_t{o.pipeline} * o.tensor;
  int data = o.data;
  if (data == 0) {
    if (n % inner != 0) {
      SHOAL_THROW(InvalidArgument,
                  "process grid: pipeline {} x tensor {} = {} ranks do not divide the world's {} "
                  "(data = world / (pipeline x tensor))",
                  o.pipeline, o.tensor, inner, n);
    }
    data = static_cast<int>(n / inner);
  } else if (data * inner != n) {
    SHOAL_THROW(InvalidArgument,
                "process grid: data {} x pipeline {} x tensor {} = {} ranks, but the world has {}",
                data, o.pipeline, o.tensor, data * inner, n);
  }

  ProcessGrid g;
  g.world = world;
  g.dataSize = data;
  g.pipelineSize = o.pipeline;
  g.tensorSize = o.tensor;
  g.order = joinOrder(dims);
  const std::array<int, 3> size = {data, o.pipeline, o.tensor};
  const auto c = coordsOf(dims, size, world->rank());
  g.dataRank = c[kData];
  g.pipelineRank = c[kPipeline];
  g.tensorRank = c[kTensor];

  // Each group's color is the world rank of its member with coordinate 0 along the group's
  // dimension (the same for every member, distinct across groups); its key the coordinate.
  auto colorAlong = [&](Dim d) {
    auto base = c;
    base[d] = 0;
    return rankAt(dims, size, base);
  };
  g.tensor = world->split(colorAlong(kTensor), g.tensorRank);
  g.pipe = world->split(colorAlong(kPipeline), g.pipelineRank);
  g.data = world->split(colorAlong(kData), g.dataRank);
  SHOAL_ASSERT(g.tensor->size() == g.tensorSize && g.tensor->rank() == g.tensorRank,
               "tensor group {} of {}", g.tensor->rank(), g.tensor->size());
  SHOAL_ASSERT(g.pipe->size() == g.pipelineSize && g.pipe->rank() == g.pipelineRank,
               "pipeline group {} of {}", g.pipe->rank(), g.pipe->size());
  SHOAL_ASSERT(g.data->size() == g.dataSize && g.data->rank() == g.dataRank, "data group {} of {}",
               g.data->rank(), g.data->size());
  return g;
}

int ProcessGrid::worldRankOf(int d, int p, int t) const {
  if (d < 0 || d >= dataSize || p < 0 || p >= pipelineSize || t < 0 || t >= tensorSize) {
    SHOAL_THROW(InvalidArgument,
                "process grid: coordinates data {}, stage {}, tensor {} are outside data {} x "
                "pipeline {} x tensor {}",
                d, p, t, dataSize, pipelineSize, tensorSize);
  }
  return rankAt(parseOrder(order), {dataSize, pipelineSize, tensorSize}, {d, p, t});
}

std::string ProcessGrid::describe() const {
  return fmt::format(
      "grid data {} x pipeline {} x tensor {} (order {}); world rank {} = data {}, stage {}, "
      "tensor {}",
      dataSize, pipelineSize, tensorSize, order, world->rank(), dataRank, pipelineRank, tensorRank);
}

pipeline::Grid ProcessGrid::pipelineGrid() const {
  pipeline::Grid g;
  g.world = world;
  g.pipe = pipe;
  g.data = data;
  g.stages = pipelineSize;
  g.replicas = dataSize;
  g.stage = pipelineRank;
  g.replica = dataRank;
  g.tensor = tensor;
  g.tensorRank = tensorRank;
  return g;
}

void requireDivisible(std::string_view what, int64_t value, std::string_view dim, int size) {
  if (size < 1) {
    SHOAL_THROW(InvalidArgument, "{} parallelism: {} {} over {} {}: the size must be at least 1",
                dim, value, what, dim, size);
  }
  if (value % size != 0) {
    SHOAL_THROW(InvalidArgument, "{} parallelism: {} {} do not divide over {} {}", dim, value, what,
                dim, size);
  }
}

}  // namespace shoal::train
