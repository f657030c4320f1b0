// One rank of the ZeRO tests, run under `shoal run -n N` (tests/zero_test.cpp).
//
//   equal STAGE OPTIMIZER CLIP ACCUMULATE
//            a small Sequential (318 parameters: no world size of 2-4 divides it, and small
//            buckets make several units) trained 4 steps with ZeRO at STAGE, with Shoal's DDP,
//            and in one process on the global batch; CLIP > 0 clips by global norm,
//            ACCUMULATE 1 runs two micro-batches per step (the first under noSync). Every
//            parameter must equal DDP's and the one process's within rtol 1e-5: prints
//            "OK equal ..." or "FAIL ...".
//   memory STAGE DTYPE
//            a 3.2M-parameter MLP (fp32 or bf16) with Adam after one step and one more
//            backward: each category of MemoryReport within 15% of the formula in
//            train/zero/zero.h ("OK memory ..." / "FAIL ...").
//   mixed STAGE
//            the small model in bf16 with fp32 master shards, 20 Adam steps: the loss falls
//            and ends within 2% of the fp32 run's ("OK mixed ...").
//   errors   a stage that does not exist, stage 3 on a module that is not a Sequential, and
//            ranks with different models: each a one-line error of the right type on every
//            rank ("OK error ...").
//   crash STAGE
//            trains; rank 1 is killed (SIGKILL) after its forward of step 3. The others must
//            fail; each prints its error.
// Exit code 0 only if everything checked held.
#include <fmt/format.h>
#include <signal.h>

#include <cmath>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "common/error.h"
#include "run/init.h"
#include "tests/process_util.h"
#include "train/ddp.h"
#include "train/optim.h"
#include "train/zero/zero.h"

namespace {

using shoal::train::OptimizerKind;
using shoal::train::OptimizerOptions;
namespace zero = shoal::train::zero;

constexpr int64_t kBatch = 6;  // per rank and micro-batch
constexpr int kSteps = 4;

torch::nn::Sequential smallModel(torch::ScalarType type = torch::kFloat) {
  torch::manual_seed(42);
  torch::nn::Sequential m(torch::nn::Linear(7, 13), torch::nn::Tanh(), torch::nn::Linear(13, 11),
                          torch::nn::ReLU(), torch::nn::Linear(11, 5));
  m->to(type);
  return m;
}

// The global batch of (step, micro-batch): every rank makes all of it and takes its rows.
std::pair<torch::Tensor, torch::Tensor> globalBatch(int step, int micro, int world) {
  auto gen = at::detail::createCPUGenerator(1000 + step * 10 + micro);
  auto x = at::randn({world * kBatch, 7}, gen);
  auto y = at::randn({world * kBatch, 5}, gen);
  return {x, y};
}

OptimizerOptions optimizerFor(const std::string& name) {
  OptimizerOptions o;
  o.kind = shoal::parseOptimizer(name);
  o.lr = o.kind == OptimizerKind::kSgd ? 0.05 : o.kind == OptimizerKind::kAdam ? 0.01 : 0.001;
  o.momentum = 0.9;
  o.weightDecay = 0.01;
  return o;
}

bool sameParameters(const std::string& what, torch::nn::Module& a, torch::nn::Module& b) {
  auto pa = a.named_parameters(), pb = b.named_parameters();
  double worst = 0;
  bool ok = true;
  for (auto& item : pa) {
    auto x = item.value().detach().to(torch::kDouble);
    auto y = pb[item.key()].detach().to(torch::kDouble);
    const double diff = (x - y).abs().max().item<double>();
    worst = std::max(worst, diff);
    if (!torch::allclose(x, y, /*rtol=*/1e-5, /*atol=*/1e-6)) {
      std::cout << fmt::format("FAIL {}: {} differs by {}\n", what, item.key(), diff);
      ok = false;
    }
  }
  if (ok) std::cout << fmt::format("OK {} (max difference {:.2e})\n", what, worst);
  return ok;
}

int equal(shoal::World& world, int stage, const std::string& opt, double clip, bool accumulate) {
  const int n = world.size, r = world.rank;
  const int micro = accumulate ? 2 : 1;
  auto lossOn = [&](torch::Tensor out, const torch::Tensor& y) { return torch::mse_loss(out, y); };
  auto rows = [&](const torch::Tensor& t) { return t.narrow(0, r * kBatch, kBatch); };

  // ZeRO.
  auto zm = smallModel();
  zero::ZeroOptions zo;
  zo.stage = stage;
  zo.bucketBytes = 400;  // several units
  zo.optimizer = optimizerFor(opt);
  zo.clipNorm = clip;
  zero::ZeroDataParallel z(zm, world.group, zo);
  for (int s = 0; s < kSteps; ++s) {
    for (int m = 0; m < micro; ++m) {
      auto [x, y] = globalBatch(s, m, n);
      z.beforeForward();
      auto loss = lossOn(z.forward(rows(x)), rows(y));
      if (m + 1 < micro) {
        auto guard = z.noSync();
        z.backward(loss);
      } else {
        z.backward(loss);
      }
    }
    z.step();
  }

  // Shoal's DDP.
  auto dm = smallModel();
  shoal::train::DistributedDataParallel ddp(dm.ptr(), world.group);
  auto dopt = shoal::train::makeOptimizer(dm->parameters(), optimizerFor(opt));
  // One process on the global batch.
  auto om = smallModel();
  auto oopt = shoal::train::makeOptimizer(om->parameters(), optimizerFor(opt));
  for (int s = 0; s < kSteps; ++s) {
    dopt->zero_grad();
    oopt->zero_grad();
    for (int m = 0; m < micro; ++m) {
      auto [x, y] = globalBatch(s, m, n);
      ddp.beforeForward();
      auto loss = lossOn(dm->forward(rows(x)), rows(y));
      if (m + 1 < micro) {
        auto guard = ddp.noSync();
        ddp.backward(loss);
      } else {
        ddp.backward(loss);
      }
      lossOn(om->forward(x), y).backward();
    }
    if (clip > 0) {
      torch::nn::utils::clip_grad_norm_(dm->parameters(), clip);
      torch::nn::utils::clip_grad_norm_(om->parameters(), clip);
    }
    dopt->step();
    oopt->step();
  }
  zero::ZeroDataParallel::GatheredParameters full(z);
  const std::string what =
      fmt::format("equal stage {} {} clip {} accumulate {}", stage, opt, clip, accumulate);
  bool ok = sameParameters(what + " vs DDP", *zm, *dm);
  ok = sameParameters(what + " vs one process", *zm, *om) && ok;
  return ok ? 0 : 1;
}

int memory(shoal::World& world, int stage, const std::string& dtype) {
  const bool bf16 = dtype == "bf16";
  torch::manual_seed(7);
  torch::nn::Sequential m(torch::nn::Linear(1024, 1024), torch::nn::ReLU(),
                          torch::nn::Linear(1024, 1024), torch::nn::ReLU(),
                          torch::nn::Linear(1024, 1024), torch::nn::ReLU(),
                          torch::nn::Linear(1024, 10));
  if (bf16) m->to(torch::kBFloat16);
  zero::ZeroOptions zo;
  zo.stage = stage;
  zo.bucketBytes = 4u << 20;
  zo.optimizer.kind = OptimizerKind::kAdam;
  zo.optimizer.lr = 1e-3;
  zero::ZeroDataParallel z(m, world.group, zo);
  auto x = torch::randn({8, 1024}).to(m->parameters()[0].scalar_type());
  auto y = torch::randint(0, 10, {8});
  auto iteration = [&] {
    z.beforeForward();
    auto loss = torch::cross_entropy_loss(z.forward(x).to(torch::kFloat), y);
    z.backward(loss);
  };
  iteration();
  z.step();
  iteration();  // measured with gradients present, before the step
  const auto report = z.memory();
  z.step();

  const double psi = static_cast<double>(z.parameterCount());
  const double n = world.size;
  // The formulas of train/zero/zero.h, per category.
  double params = 0, grads = 0, state = 0;
  if (!bf16) {
    params = stage < 3 ? 4 * psi : 4 * psi / n;
    grads = stage == 1 ? 4 * psi : 4 * psi / n;
    state = 8 * psi / n;
  } else {
    params = stage < 3 ? 2 * psi : 0;
    grads = stage == 1 ? 2 * psi + 4 * psi / n : 4 * psi / n;
    state = 12 * psi / n;
  }
  bool ok = true;
  auto check = [&](const char* what, double expected, int64_t measured) {
    const double tolerance = 0.15 * std::max(expected, 1.0);
    const bool good = std::abs(static_cast<double>(measured) - expected) <= tolerance;
    std::cout << fmt::format("{} memory stage {} {} {}: measured {} expected {:.0f}\n",
                             good ? "OK" : "FAIL", stage, dtype, what, measured, expected);
    ok = ok && good;
  };
  check("parameters", params, report.parameterBytes);
  check("gradients", grads, report.gradientBytes);
  check("optimizer", state, report.optimizerBytes);
  check("total", params + grads + state, report.total());
  std::cout << fmt::format("peak resident {} MiB, parameters {} padding {}\n",
                           report.peakResidentBytes >> 20, z.parameterCount(), z.paddingCount());
  return ok ? 0 : 1;
}

double trainSmall(shoal::World& world, int stage, torch::ScalarType type, int steps) {
  auto m = smallModel(type);
  zero::ZeroOptions zo;
  zo.stage = stage;
  zo.bucketBytes = 400;
  zo.optimizer = optimizerFor("adam");
  zero::ZeroDataParallel z(m, world.group, zo);
  double first = 0, last = 0;
  for (int s = 0; s < steps; ++s) {
    auto [x, y] = globalBatch(0, 0, world.size);  // one batch: the loss must fall
    auto mine = x.narrow(0, world.rank * kBatch, kBatch).to(type);
    auto target = y.narrow(0, world.rank * kBatch, kBatch);
    auto loss = torch::mse_loss(z.forward(mine).to(torch::kFloat), target);
    z.backward(loss);
    z.step();
    (s == 0 ? first : last) = loss.item<double>();
  }
  std::cout << fmt::format("stage {} {}: loss {:.4f} -> {:.4f}\n", stage,
                           std::string(c10::toString(type)), first, last);
  return last;
}

int mixed(shoal::World& world, int stage) {
  const double fp32 = trainSmall(world, stage, torch::kFloat, 20);
  const double bf16 = trainSmall(world, stage, torch::kBFloat16, 20);
  const double firstLoss = [&] {
    auto [x, y] = globalBatch(0, 0, world.size);
    auto m = smallModel();
    torch::NoGradGuard g;
    return torch::mse_loss(m->forward(x.narrow(0, world.rank * kBatch, kBatch)),
                           y.narrow(0, world.rank * kBatch, kBatch))
        .item<double>();
  }();
  const bool ok = bf16 < 0.9 * firstLoss && std::abs(bf16 - fp32) <= 0.02 * fp32 + 0.01;
  std::cout << fmt::format("{} mixed stage {}: bf16 {:.4f} fp32 {:.4f} start {:.4f}\n",
                           ok ? "OK" : "FAIL", stage, bf16, fp32, firstLoss);
  return ok ? 0 : 1;
}

int errors(shoal::World& world) {
  bool ok = true;
  auto expect = [&](const char* what, const char* type, const std::function<void()>& body) {
    try {
      body();
      std::cout << fmt::format("FAIL error {}: nothing thrown\n", what);
      ok = false;
    } catch (const shoal::Error& e) {
      const bool good = std::string(shoal::test::typeName(e)) == type &&
                        std::string(e.what()).find('\n') == std::string::npos;
      std::cout << fmt::format("{} error {}: {}: {}\n", good ? "OK" : "FAIL", what,
                               shoal::test::typeName(e), e.what());
      ok = ok && good;
    }
  };
  zero::ZeroOptions o;
  o.stage = 4;
  expect("stage 4", "InvalidArgument",
         [&] { zero::ZeroDataParallel z(smallModel(), world.group, o); });
  o.stage = 3;
  auto plain = std::make_shared<torch::nn::LinearImpl>(3, 3);
  expect("stage 3 without a Sequential", "InvalidArgument",
         [&] { zero::ZeroDataParallel z(plain, world.group, o); });
  o.stage = 2;
  auto different = world.rank == 1 ? torch::nn::Sequential(torch::nn::Linear(7, 12))
                                   : torch::nn::Sequential(torch::nn::Linear(7, 13));
  expect("different models", "MismatchError",
         [&] { zero::ZeroDataParallel z(different, world.group, o); });
  return ok ? 0 : 1;
}

int crash(shoal::World& world, int stage) {
  auto m = smallModel();
  zero::ZeroOptions zo;
  zo.stage = stage;
  zo.bucketBytes = 400;
  zo.optimizer = optimizerFor("adam");
  zero::ZeroDataParallel z(m, world.group, zo);
  for (int s = 0; s < 6; ++s) {
    auto [x, y] = globalBatch(s, 0, world.size);
    auto loss = torch::mse_loss(z.forward(x.narrow(0, world.rank * kBatch, kBatch)),
                                y.narrow(0, world.rank * kBatch, kBatch));
    if (s == 3 && world.rank == 1) ::raise(SIGKILL);
    z.backward(loss);
    z.step();
  }
  std::cout << "finished all steps\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    torch::set_num_threads(1);
    const std::vector<std::string> a(argv + 1, argv + argc);
    shoal::World world = shoal::init();
    if (a.size() == 5 && a[0] == "equal") {
      return equal(world, std::stoi(a[1]), a[2], std::stod(a[3]), a[4] == "1");
    }
    if (a.size() == 3 && a[0] == "memory") return memory(world, std::stoi(a[1]), a[2]);
    if (a.size() == 2 && a[0] == "mixed") return mixed(world, std::stoi(a[1]));
    if (a.size() == 1 && a[0] == "errors") return errors(world);
    if (a.size() == 2 && a[0] == "crash") return crash(world, std::stoi(a[1]));
    std::cerr << "usage: zero_worker equal|memory|mixed|errors|crash ...\n";
    return 2;
  } catch (const shoal::Error& e) {
    std::cerr << "ERROR " << shoal::test::typeName(e) << ": " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "ERROR " << e.what() << "\n";
    return 1;
  }
}
