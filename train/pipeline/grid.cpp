#include "train/pipeline/grid.h"

#include <fmt/format.h>

#include "common/error.h"

namespace shoal::train::pipeline {

Grid makeGrid(std::shared_ptr<comm::Group> world, int stages) {
  SHOAL_CHECK(world != nullptr, "pipeline grid: no world group");
  const int n = world->size();
  if (stages < 1 || n % stages != 0) {
    SHOAL_THROW(InvalidArgument,
                "pipeline grid: {} stages do not divide a world of {} ranks (the world is "
                "replicas x stages)",
                stages, n);
  }
  Grid g;
  g.world = world;
  g.stages = stages;
  g.replicas = n / stages;
  g.stage = world->rank() % stages;
  g.replica = world->rank() / stages;
  g.pipe = world->split(g.replica, g.stage);
  g.data = world->split(g.stage, g.replica);
  return g;
}

std::string Grid::describe() const {
  if (tensor != nullptr && tensor->size() > 1) {
    return fmt::format(
        "{} replica{} x {} stage{} x {} tensor; world rank {} = replica {}, stage "
        "{}, tensor {}",
        replicas, replicas == 1 ? "" : "s", stages, stages == 1 ? "" : "s", tensor->size(),
        world->rank(), replica, stage, tensorRank);
  }
  return fmt::format("{} replica{} x {} stage{}; world rank {} = replica {}, stage {}", replicas,
                     replicas == 1 ? "" : "s", stages, stages == 1 ? "" : "s", world->rank(),
                     replica, stage);
}

}  // namespace shoal::train::pipeline
