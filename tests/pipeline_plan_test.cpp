// The pipeline plan: made from a model, and read back from bytes with every size checked
// before it is used (a plan travels from world rank 0 to every rank).
#include <gtest/gtest.h>

#include "common/error.h"
#include "train/pipeline/plan.h"
#include "train/residual_mlp.h"

namespace shoal::train::pipeline {
namespace {

PlanRequest byParameters(int stages) {
  PlanRequest r;
  r.virtualStages = stages;
  r.stages = stages;
  r.split = SplitMethod::kParameters;
  return r;
}

TEST(PipelinePlan, RecordsWhatCrossesEachBoundaryAndSurvivesTheWire) {
  auto net = residualMlp(4, 32);  // 8 layers
  Plan plan = makePlan(net, torch::zeros({3, 1, 28, 28}), byParameters(3));
  ASSERT_EQ(plan.boundaries.size(), 4u);
  EXPECT_EQ(plan.boundaries.front(), 0);
  EXPECT_EQ(plan.boundaries.back(), 8);
  ASSERT_EQ(plan.crossing.size(), 2u);
  for (const auto& c : plan.crossing) {
    EXPECT_EQ(c.sampleShape, std::vector<int64_t>{32});  // the batch dimension is left out
    EXPECT_EQ(c.dtype, torch::kFloat32);
  }
  EXPECT_NE(plan.table.find("partition by parameters"), std::string::npos) << plan.table;
  Plan back = decode(encode(plan), 3, 8);
  EXPECT_EQ(back.boundaries, plan.boundaries);
  EXPECT_EQ(back.method, plan.method);
  EXPECT_EQ(back.table, plan.table);
  ASSERT_EQ(back.crossing.size(), plan.crossing.size());
  EXPECT_EQ(back.crossing[1].sampleShape, plan.crossing[1].sampleShape);
  EXPECT_EQ(back.layerMs, plan.layerMs);  // 8 zeros: split by parameters, not profiled
  EXPECT_EQ(back.layerMs.size(), 8u);
}

TEST(PipelinePlan, MalformedBytesAreAProtocolError) {
  auto net = residualMlp(4, 32);
  const std::string good = encode(makePlan(net, torch::zeros({2, 1, 28, 28}), byParameters(2)));
  EXPECT_THROW(decode(good, 3, 8), ProtocolError);  // another stage count
  EXPECT_THROW(decode(good, 2, 9), ProtocolError);  // another layer count
  const std::string costs = "8 0 0 0 0 0 0 0 0\n";  // one per layer
  const std::vector<std::string> bad = {
      "",
      "parameters\n3 0 4",                                          // truncated
      "parameters\n3 0 9 8\n" + costs + "0 1 32\n",                 // boundaries not increasing
      "parameters\n3 1 4 8\n" + costs + "0 1 32\n",                 // not starting at 0
      "parameters\n3 0 4 8\n" + costs + "99 1 32\n",                // unknown type
      "parameters\n3 0 4 8\n" + costs + "0 9 1 1 1 1 1 1 1 1 1\n",  // too many dimensions
      "parameters\n3 0 4 8\n" + costs + "0 1 -5\n",                 // negative dimension
      "parameters\n3 0 4 8\n" + costs + "0 1 99999999999999\n",     // absurd dimension
      "parameters\n18446744073709551615 0 4 8\n",                   // absurd count
      "parameters\n3 0 4 8\n7 0 0 0 0 0 0 0\n0 1 32\n",             // a cost short
      "parameters\n3 0 4 8\n8 0 0 0 -1 0 0 0 0\n0 1 32\n",          // a negative cost
      "parameters\n3 0 4 8\n8 0 0 0 nan 0 0 0 0\n0 1 32\n",         // not a number
  };
  // The costs line itself is what the malformed cases lack: with it, the same bytes decode.
  EXPECT_NO_THROW(decode("parameters\n3 0 4 8\n" + costs + "0 1 32\n", 2, 8));
  for (const auto& b : bad) EXPECT_THROW(decode(b, 2, 8), ProtocolError) << b;
}

TEST(PipelinePlan, BadRequestsAreOneLineInvalidArguments) {
  PlanRequest r = byParameters(4);
  EXPECT_THROW(validate(r, 3), InvalidArgument);  // fewer layers than stages
  r.split = SplitMethod::kBoundaries;
  r.boundaries = {2, 4};  // 2 numbers for 4 stages
  EXPECT_THROW(validate(r, 8), InvalidArgument);
  r.boundaries = {2, 4, 4};  // not increasing
  EXPECT_THROW(validate(r, 8), InvalidArgument);
  r.boundaries = {2, 4, 8};  // the last stage would be empty
  EXPECT_THROW(validate(r, 8), InvalidArgument);
  r.boundaries = {2, 4, 6};
  EXPECT_NO_THROW(validate(r, 8));
  r.split = SplitMethod::kTime;
  EXPECT_THROW(validate(r, 8), InvalidArgument);  // boundaries with another split
  try {
    validate(byParameters(5), 4);
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace shoal::train::pipeline
