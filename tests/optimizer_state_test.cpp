// The optimizer state codec (train/optimizer_state.h): for every supported optimizer, export
// every parameter's state after a few steps, import it into a fresh optimizer over a copy of the
// parameters, and one more step leaves both bit-identical; import's one-line errors; and LAMB's and
// LARS's libtorch serialization round trip.
#include "train/optimizer_state.h"

#include <gtest/gtest.h>

#include <functional>
#include <sstream>

#include "common/error.h"
#include "train/optim/lamb.h"
#include "train/optim/lars.h"

namespace shoal::test {
namespace {

namespace o = torch::optim;
using Factory = std::function<std::unique_ptr<o::Optimizer>(std::vector<torch::Tensor>)>;

struct Case {
  std::string name;
  Factory make;
};

std::vector<Case> cases() {
  return {
      {"sgd", [](auto p) { return std::make_unique<o::SGD>(p, o::SGDOptions(0.1).momentum(0.9)); }},
      {"adam", [](auto p) { return std::make_unique<o::Adam>(p, o::AdamOptions(1e-2)); }},
      {"adam_amsgrad",
       [](auto p) { return std::make_unique<o::Adam>(p, o::AdamOptions(1e-2).amsgrad(true)); }},
      {"adamw", [](auto p) { return std::make_unique<o::AdamW>(p, o::AdamWOptions(1e-2)); }},
      {"rmsprop_centered_momentum",
       [](auto p) {
         return std::make_unique<o::RMSprop>(p,
                                             o::RMSpropOptions(1e-2).momentum(0.5).centered(true));
       }},
      {"lamb",
       [](auto p) {
         return std::make_unique<train::Lamb>(p, train::LambOptions(1e-2).weight_decay(0.01));
       }},
      {"lars",
       [](auto p) {
         return std::make_unique<train::Lars>(p, train::LarsOptions(1.0).weight_decay(0.01));
       }},
  };
}

std::vector<torch::Tensor> makeParams() {
  torch::manual_seed(21);
  return {torch::randn({5, 4}).requires_grad_(), torch::randn({5}).requires_grad_(),
          torch::randn({2, 5}).requires_grad_(), torch::randn({2}).requires_grad_()};
}

std::vector<torch::Tensor> copyOf(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> out;
  for (const auto& p : params) out.push_back(p.detach().clone().requires_grad_());
  return out;
}

void stepWith(o::Optimizer& opt, std::vector<torch::Tensor>& params, uint64_t seed) {
  torch::manual_seed(seed);
  for (auto& p : params) p.mutable_grad() = torch::randn_like(p) * 0.1;
  opt.step();
}

TEST(OptimizerState, RoundTripContinuesIdentically) {
  for (const auto& c : cases()) {
    SCOPED_TRACE(c.name);
    auto params = makeParams();
    auto opt = c.make(params);
    EXPECT_FALSE(train::exportState(*opt, 0).has_value());
    for (uint64_t s = 0; s < 3; ++s) stepWith(*opt, params, 100 + s);

    auto copy = copyOf(params);
    auto fresh = c.make(copy);
    for (size_t i = 0; i < params.size(); ++i) {
      const auto state = train::exportState(*opt, i);
      ASSERT_TRUE(state.has_value()) << "parameter " << i;
      EXPECT_FALSE(state->tensors.empty());
      train::importState(*fresh, i, *state);
      // Imported as copies: the fresh optimizer's state does not alias the exporter's.
      const auto imported = train::exportState(*fresh, i);
      ASSERT_TRUE(imported.has_value());
      EXPECT_EQ(imported->step, state->step);
      ASSERT_EQ(imported->tensors.size(), state->tensors.size());
      for (size_t k = 0; k < state->tensors.size(); ++k) {
        EXPECT_EQ(imported->tensors[k].first, state->tensors[k].first);
        EXPECT_TRUE(torch::equal(imported->tensors[k].second, state->tensors[k].second));
        EXPECT_NE(imported->tensors[k].second.data_ptr(), state->tensors[k].second.data_ptr());
      }
    }
    stepWith(*opt, params, 200);
    stepWith(*fresh, copy, 200);
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_TRUE(torch::equal(params[i], copy[i])) << "parameter " << i;
    }
  }
}

TEST(OptimizerState, ExportAliasesTheOptimizersTensors) {
  auto params = makeParams();
  o::Adam opt(params, o::AdamOptions(1e-2));
  stepWith(opt, params, 1);
  auto state = train::exportState(opt, 1);
  ASSERT_TRUE(state.has_value());
  EXPECT_EQ(state->step, 1);
  ASSERT_EQ(state->tensors.size(), 2u);  // no max_exp_avg_sq without amsgrad
  EXPECT_EQ(state->tensors[0].first, "exp_avg");
  state->tensors[0].second.zero_();
  EXPECT_EQ(train::exportState(opt, 1)->tensors[0].second.abs().sum().item<double>(), 0.0);
}

std::string importError(o::Optimizer& opt, size_t index, const train::ParamState& state) {
  try {
    train::importState(opt, index, state);
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    return what;
  }
  return "no error";
}

TEST(OptimizerState, ImportErrorsNameTheKey) {
  auto params = makeParams();
  o::Adam opt(params, o::AdamOptions(1e-2));
  const auto like = torch::zeros({5});
  EXPECT_NE(importError(opt, 1, {1, {{"exp_avg", like}, {"exp_avg_sq", like}, {"bogus", like}}})
                .find("unknown key 'bogus'"),
            std::string::npos);
  EXPECT_NE(importError(opt, 1, {1, {{"exp_avg", like}, {"exp_avg_sq", torch::zeros({4})}}})
                .find("'exp_avg_sq'"),
            std::string::npos);
  EXPECT_NE(importError(opt, 1, {1, {{"exp_avg", like}, {"exp_avg_sq", like.to(torch::kDouble)}}})
                .find("'exp_avg_sq'"),
            std::string::npos);
  EXPECT_NE(importError(opt, 1, {1, {{"exp_avg", like}}}).find("'exp_avg_sq' is missing"),
            std::string::npos);
  EXPECT_NE(importError(opt, 9, {1, {}}).find("out of range"), std::string::npos);
  EXPECT_FALSE(train::exportState(opt, 1).has_value());  // nothing imported by the failures

  o::SGD sgd(params, o::SGDOptions(0.1).momentum(0.9));
  EXPECT_NE(importError(sgd, 1, {0, {{"exp_avg", like}}}).find("unknown key 'exp_avg' for SGD"),
            std::string::npos);
  EXPECT_NE(importError(sgd, 1, {3, {{"momentum_buffer", like}}}).find("step 3"),
            std::string::npos);
}

template <typename Opt>
void expectSerializationRoundTrip(const Factory& make) {
  auto params = makeParams();
  auto opt = make(params);
  for (uint64_t s = 0; s < 2; ++s) stepWith(*opt, params, 300 + s);
  torch::serialize::OutputArchive out;
  opt->save(out);
  std::stringstream bytes;
  out.save_to(bytes);

  auto copy = copyOf(params);
  auto fresh = make(copy);
  torch::serialize::InputArchive in;
  in.load_from(bytes);
  fresh->load(in);
  ASSERT_NE(dynamic_cast<Opt*>(fresh.get()), nullptr);
  stepWith(*opt, params, 400);
  stepWith(*fresh, copy, 400);
  for (size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(torch::equal(params[i], copy[i]));
}

TEST(OptimizerState, LambAndLarsSaveAndLoad) {
  const auto all = cases();
  expectSerializationRoundTrip<train::Lamb>(all[5].make);
  expectSerializationRoundTrip<train::Lars>(all[6].make);
}

}  // namespace
}  // namespace shoal::test
