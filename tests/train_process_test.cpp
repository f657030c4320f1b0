// The Fashion-MNIST example as a job: killed mid-training and resumed, it ends with exactly the
// parameters of an uninterrupted run; a damaged checkpoint is refused with the file named and
// an intact one offered. Also the
// data reader on damaged files, and the sampler.
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <zlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <tuple>

#include "common/error.h"
#include "common/sealed_file.h"
#include "tests/process_util.h"
#include "tests/thread_ranks.h"
#include "train/checkpoint.h"
#include "train/distributed_sampler.h"
#include "train/full_state.h"
#include "train/idx_dataset.h"
#include "train/tensor_bundle.h"

namespace shoal::test {
namespace {

std::string trainCommand(const std::string& dir, const std::string& extra) {
  return fmt::format(
      "OPENBLAS_NUM_THREADS=1 timeout 300 {} run -n 2 --timeout 60 -- {} --epochs 2 "
      "--train-subset 1024 --batch 32 --checkpoint-dir {} --checkpoint-every 5 -q {}",
      SHOAL_BIN, FASHION_MNIST_BIN, dir, extra);
}

std::vector<torch::Tensor> loadParams(const std::string& path) {
  std::vector<torch::Tensor> t;
  torch::load(t, path);
  return t;
}

TEST(TrainJob, KilledAndResumedEndsExactlyAsUninterrupted) {
  TempDir dir;
  const std::string a = dir.path + "/uninterrupted", b = dir.path + "/interrupted";
  auto full = runShell(trainCommand(a, "--save-params " + a + "/final.pt"));
  ASSERT_EQ(full.code, 0) << full.output;

  // 1024 samples / 2 ranks / 32 = 16 steps per epoch; the last rank dies after step 21, the
  // newest checkpoint is step 20 (epoch 2, batch 4).
  auto crashed = runShell(trainCommand(b, "--crash-at-step 21"));
  EXPECT_EQ(crashed.code, 128 + 9) << crashed.output;
  EXPECT_NE(crashed.output.find("rank 1 (host localhost"), std::string::npos) << crashed.output;
  EXPECT_FALSE(std::filesystem::exists(b + "/final.pt"));

  auto resumed = runShell(trainCommand(b, "--resume latest --save-params " + b + "/final.pt"));
  ASSERT_EQ(resumed.code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resumed from " + b + ": epoch 2, batch 4, step 20"),
            std::string::npos)
      << resumed.output;

  auto expected = loadParams(a + "/final.pt"), got = loadParams(b + "/final.pt");
  ASSERT_EQ(expected.size(), got.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_TRUE(torch::equal(expected[i], got[i]))
        << "tensor " << i << " differs by " << (expected[i] - got[i]).abs().max().item<double>();
  }
  // Only the newest three are kept: one folder per step, a shard per rank.
  std::vector<std::string> steps;
  for (const auto& e : std::filesystem::directory_iterator(b)) {
    if (e.is_directory()) steps.push_back(e.path().string());
  }
  std::sort(steps.begin(), steps.end());
  ASSERT_EQ(steps.size(), 3u);
  EXPECT_EQ(steps.back(), b + "/step-00000032");

  // A truncated shard of the newest checkpoint: refused on every rank, the file and the rank
  // that wrote it named, the newest intact one offered, nothing trained.
  const std::string shard = steps.back() + "/rank-1-of-2.shard";
  std::filesystem::resize_file(shard, std::filesystem::file_size(shard) / 2);
  auto refused = runShell(trainCommand(b, "--resume latest"));
  EXPECT_NE(refused.code, 0);
  EXPECT_NE(refused.output.find("checkpoint " + shard + " (written by rank 1 of 2)"),
            std::string::npos)
      << refused.output;
  EXPECT_NE(refused.output.find("(truncated or replaced); the newest intact checkpoint is " +
                                steps[1] + " (move " + steps[2] + " away to resume from it)"),
            std::string::npos)
      << refused.output;
}

// Configuration the example refuses: one line naming the flag or variable, exit code 2, before
// any training (the metrics file is opened before the data is read).
// The example in an elastic job: rank 0 of 3 workers dies after step 20; the other two go on,
// finish both epochs, and the new rank 0 (the old rank 1) takes over what the lead does: it
// writes both metrics lines, with 2 workers, and saves the final parameters. Under a run
// directory with straggler windows of 4 steps, the tracking callback follows the new ranks
// (with the old ones it indexed past the new view's 2 ranks and ended the worker).
TEST(TrainJob, AnElasticJobLosesAWorkerAndFinishes) {
  TempDir dir;
  const std::string metrics = dir.path + "/metrics.json", params = dir.path + "/final.pt";
  auto r = runShell(fmt::format(
      "OPENBLAS_NUM_THREADS=1 SHOAL_ELASTIC_WAIT=5 timeout 300 {} run --elastic 2:3 -n 3 "
      "--timeout 60 --run-dir {}/run -- {} --epochs 2 --train-subset 3072 --batch 32 "
      "--crash-at-step 20 --crash-rank 0 -q --straggler-window 4 --metrics {} --save-params {}",
      SHOAL_BIN, dir.path, FASHION_MNIST_BIN, metrics, params));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("the other workers go on without it"), std::string::npos) << r.output;
  std::ifstream in(metrics);
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(lines.size(), 2u) << r.output;
  for (const auto& l : lines) EXPECT_EQ(l["ranks"], 2) << l.dump();
  EXPECT_GT(lines[1]["test_accuracy"].get<double>(), 0.7) << lines[1].dump();
  EXPECT_FALSE(loadParams(params).empty());
}

// A worker of an elastic job at its minimum (3:3) dies after step 10 and is started again: the
// two others wait below the minimum, and the new process joins them. A joiner's program must not
// communicate before fit() (the running workers are in the view change that admits it): the
// example's early check of --metrics did, and the whole job failed with a MismatchError.
TEST(TrainJob, ARestartedWorkerRejoinsAnElasticJobAtItsMinimum) {
  TempDir dir;
  const std::string metrics = dir.path + "/metrics.json";
  auto r = runShell(fmt::format(
      "OPENBLAS_NUM_THREADS=1 timeout 300 {} run --elastic 3:3 -n 3 --max-restarts 1 --timeout 60 "
      "-- {} --epochs 2 --train-subset 3072 --batch 32 --crash-at-step 10 -q --metrics {}",
      SHOAL_BIN, FASHION_MNIST_BIN, metrics));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("3 workers finished; 1 failed along the way, 1 restart"),
            std::string::npos)
      << r.output;
  std::ifstream in(metrics);
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(lines.size(), 2u) << r.output;
  for (const auto& l : lines) EXPECT_EQ(l["ranks"], 3) << l.dump();
}

TEST(TrainConfigErrors, NonsenseFlagsAndVariablesExitWithTwo) {
  const std::vector<std::tuple<std::vector<std::string>, Proc::Env, std::string>> cases{
      {{"--checkpoint-every", "-5"}, {}, "--checkpoint-every='-5': expected an integer from 0"},
      {{"--lr", "inf"}, {}, "--lr='inf': expected a finite number"},
      {{"--lr", "nan"}, {}, "--lr='nan': expected a finite number"},
      {{"--batch", "64x"}, {}, "--batch='64x': expected an integer from 1"},
      {{"--epochs", "0"}, {}, "--epochs='0': expected an integer from 1"},
      {{"--threads", "1e3"}, {}, "--threads='1e3': expected an integer from 1"},
      {{"--metrics", "/nonexistent-dir/metrics.jsonl"},
       {},
       "--metrics /nonexistent-dir/metrics.jsonl: cannot be opened for writing"},
      {{}, {{"SHOAL_TIMEOUT", "inf"}}, "SHOAL_TIMEOUT='inf': expected a finite number"},
      {{}, {{"SHOAL_TIMEOUT", "1e300"}}, "SHOAL_TIMEOUT='1e300': expected a finite number"},
      {{}, {{"SHOAL_TIMEOUT", ""}}, "SHOAL_TIMEOUT is set but empty"},
      {{}, {{"SHOAL_BACKEND", "mpi"}}, "SHOAL_BACKEND=mpi needs a job started by mpirun"},
      // The Trainer's own checks, before any data is read.
      {{"--mode", "zero1", "--autotune"},
       {},
       "Trainer: autotune chooses ddp's buckets; strategy zero1 has none to tune"},
      {{"--reference-batch", "48"}, {}, "Trainer: referenceBatch 48 needs linearScaling"},
      {{"--lr-scaling", "--reference-batch", "48"},
       {},
       "Trainer: referenceBatch 48 must divide the global batch 64"},
      {{"--mode", "zero2", "--compression", "fp16"},
       {},
       "Trainer: compression fp16 is the all-reduce's (strategies ddp and zero1); strategy zero2 "
       "cannot use it"},
  };
  for (const auto& [flags, env, expected] : cases) {
    TempDir dir;
    std::vector<std::string> argv{FASHION_MNIST_BIN};
    argv.insert(argv.end(), flags.begin(), flags.end());
    Proc p(argv, dir.path + "/out", env);
    EXPECT_EQ(p.wait(std::chrono::seconds(120)), 2) << expected << "\n" << p.output();
    const std::string out = p.output();
    EXPECT_EQ(out.rfind("fashion_mnist: error: " + expected, 0), 0u) << out;
    EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
  }
}

// Linear scaling: the rate x the workers, or x (global batch / reference batch); without decay
// the rate after warm-up is exactly that (the metrics line's lr).
TEST(TrainJob, LinearScalingMultipliesTheRate) {
  for (const auto& [flags, expected] : std::vector<std::pair<std::string, double>>{
           {"--lr-scaling", 0.002},                       // 2 workers
           {"--lr-scaling --reference-batch 16", 0.004},  // 2 x 32 / 16
           {"", 0.001}}) {
    TempDir dir;
    const auto r = runShell(fmt::format(
        "OPENBLAS_NUM_THREADS=1 timeout 300 {} run -n 2 --timeout 60 -- {} --epochs 1 "
        "--train-subset 256 --batch 32 --lr 0.001 --lr-decay none -q --metrics {}/m.jsonl {}",
        SHOAL_BIN, FASHION_MNIST_BIN, dir.path, flags));
    ASSERT_EQ(r.code, 0) << r.output;
    std::ifstream in(dir.path + "/m.jsonl");
    std::string line;
    ASSERT_TRUE(std::getline(in, line)) << r.output;
    const auto lr = nlohmann::json::parse(line).at("lr").get<double>();
    EXPECT_NEAR(lr, expected, 1e-12) << flags << ": " << line;
  }
}

TEST(Checkpoint, CorruptionIsDetected) {
  TempDir dir;
  torch::set_num_threads(1);
  auto model = torch::nn::Linear(4, 3);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  std::string path;
  auto errors = runThreadRanks(1, testOptions(TransportKind::kShm), [&](comm::Group& g) {
    train::Checkpointer c(dir.path, 2);
    path = c.save(g, *model, opt, {1, 2, 3});
    train::Progress p = c.load(g, path, *model, opt);
    EXPECT_EQ(p.epoch, 1);
    EXPECT_EQ(p.batchInEpoch, 2);
    EXPECT_EQ(p.step, 3);
  });
  ASSERT_EQ(errors[0], "");
  train::Checkpointer::verify(path);
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  auto writeVariant = [&](const std::string& content) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << content;
  };
  std::string flipped = bytes;
  flipped[bytes.size() / 2] ^= 0x40;
  writeVariant(flipped);
  EXPECT_THROW(
      {
        try {
          train::Checkpointer::verify(path);
        } catch (const InvalidArgument& e) {
          EXPECT_NE(std::string(e.what()).find("checksum mismatch"), std::string::npos);
          throw;
        }
      },
      InvalidArgument);
  writeVariant("not a checkpoint at all, just some text that is long enough to have a header");
  EXPECT_THROW(train::Checkpointer::verify(path), InvalidArgument);
  writeVariant(bytes.substr(0, bytes.size() - 1));
  EXPECT_THROW(train::Checkpointer::verify(path), InvalidArgument);
  writeVariant(bytes);
  EXPECT_NO_THROW(train::Checkpointer::verify(path));
}

void writeGz(const std::string& path, const std::string& content) {
  gzFile f = ::gzopen(path.c_str(), "wb");
  ::gzwrite(f, content.data(), static_cast<unsigned>(content.size()));
  ::gzclose(f);
}

std::string idxHeader(uint32_t magic, std::vector<uint32_t> dims) {
  std::string h;
  auto put = [&](uint32_t v) {
    for (int s = 24; s >= 0; s -= 8) h += static_cast<char>((v >> s) & 0xff);
  };
  put(magic);
  for (auto d : dims) put(d);
  return h;
}

TEST(IdxDataset, DamagedFilesAreNamedAndExplained) {
  TempDir dir;
  const std::string images = dir.path + "/x-images-idx3-ubyte.gz";
  const std::string labels = dir.path + "/x-labels-idx1-ubyte.gz";
  auto expectError = [&](const std::string& what) {
    try {
      train::readIdxDataset(dir.path, "x");
      ADD_FAILURE() << "no error, expected " << what;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  expectError("x-images-idx3-ubyte.gz: cannot open");
  writeGz(images, idxHeader(0x803, {2, 2, 2}) + std::string(8, '\1'));
  writeGz(labels, idxHeader(0x801, {2}) + std::string("\1\2"));
  auto ok = train::readIdxDataset(dir.path, "x");
  EXPECT_EQ(ok.size(), 2);
  EXPECT_EQ(ok.labels[1].item<int64_t>(), 2);
  // A limit keeps the first samples, converted as the whole set is; one beyond the size is all.
  const auto one = train::readIdxDataset(dir.path, "x", 1);
  ASSERT_EQ(one.size(), 1);
  EXPECT_EQ(one.labels[0].item<int64_t>(), 1);
  EXPECT_TRUE(torch::equal(one.images[0], ok.images[0]));
  EXPECT_EQ(train::readIdxDataset(dir.path, "x", 5).size(), 2);
  writeGz(images, idxHeader(0x803, {2, 2, 2}) + std::string(7, '\1'));
  expectError("the header promises 8 bytes of data, the file has 7 (truncated)");
  writeGz(images, idxHeader(0x802, {2, 2, 2}) + std::string(8, '\1'));
  expectError("magic number 0x00000802");
  writeGz(images, idxHeader(0x803, {2, 2, 2}) + std::string(8, '\1'));
  writeGz(labels, idxHeader(0x801, {2}) + std::string("\1\12"));
  expectError("label 10 of item 1 is outside 0..9");
  writeGz(labels, idxHeader(0x801, {3}) + std::string("\1\2\3"));
  expectError("holds 2 images but");
  // A gzip stream cut in the middle.
  writeGz(labels, idxHeader(0x801, {2}) + std::string("\1\2"));
  {
    std::string raw;
    std::ifstream in(images, std::ios::binary);
    raw.assign(std::istreambuf_iterator<char>(in), {});
    std::ofstream(images, std::ios::binary | std::ios::trunc) << raw.substr(0, raw.size() - 6);
  }
  expectError("x-images-idx3-ubyte.gz: truncated or corrupt gzip stream");
}

TEST(IdxDataset, HugeDimensionsAreRefusedBeforeAllocating) {
  TempDir dir;
  const std::string images = dir.path + "/x-images-idx3-ubyte.gz";
  writeGz(dir.path + "/x-labels-idx1-ubyte.gz", idxHeader(0x801, {2}) + std::string("\1\2"));
  // 2^24 cubed is 2^72: it wraps to 0 in 64 bits, which matched an empty file before.
  for (auto dims : {std::vector<uint32_t>{1u << 24, 1u << 24, 1u << 24},
                    std::vector<uint32_t>{0xffffffffu, 28, 28}, std::vector<uint32_t>{2, 0, 2}}) {
    writeGz(images, idxHeader(0x803, dims));
    try {
      train::readIdxDataset(dir.path, "x");
      ADD_FAILURE() << "no error";
    } catch (const InvalidArgument& e) {
      const std::string what = e.what();
      EXPECT_EQ(what.rfind(images + ": dimension ", 0), 0u) << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    }
  }
  // The header fits but the (decompressed) data never ends: read up to the promised size only.
  writeGz(images, idxHeader(0x803, {2, 2, 2}) + std::string(1 << 20, '\0'));
  try {
    train::readIdxDataset(dir.path, "x");
    ADD_FAILURE() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("the header promises 8 bytes of data, the file has more"),
              std::string::npos)
        << e.what();
  }
}

// What is not this model's checkpoint is refused in one line naming the file: sealed garbage,
// a libtorch archive (what earlier versions wrote: never handed to libtorch's TorchScript
// importer), a full model state, a checkpoint of another shape.
TEST(Checkpoint, ASealedFileWithForeignContentIsRefusedInOneLine) {
  TempDir dir;
  torch::set_num_threads(1);
  auto model = torch::nn::Linear(4, 3);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
  auto other = torch::nn::Linear(5, 3);  // another shape: its checkpoint must not load
  torch::optim::SGD otherOpt(other->parameters(), torch::optim::SGDOptions(0.1));
  const std::string garbage = dir.path + "/garbage.pt", legacy = dir.path + "/legacy.pt",
                    state = dir.path + "/model.state";
  writeSealedFile(garbage, "intact framing, but not a checkpoint");
  {
    torch::serialize::OutputArchive archive;
    archive.write("param/weight", torch::ones({3, 4}));
    std::ostringstream bytes;
    archive.save_to(bytes);
    writeSealedFile(legacy, bytes.str());
  }
  train::writeFullState(state, {{"weight", torch::ones({3, 4})}, {"bias", torch::ones({3})}});
  std::string saved;
  std::vector<std::string> messages;
  auto errors = runThreadRanks(1, testOptions(TransportKind::kShm), [&](comm::Group& g) {
    train::Checkpointer c(dir.path, 2);
    saved = c.save(g, *other, otherOpt, {1, 0, 7});
    for (const std::string& path : {garbage, legacy, state, saved}) {
      try {
        c.load(g, path, *model, opt);
        messages.push_back("");
      } catch (const InvalidArgument& e) {
        messages.push_back(e.what());
      }
    }
  });
  ASSERT_EQ(errors[0], "");
  ASSERT_EQ(messages.size(), 4u);
  const std::string expected[] = {
      garbage + ": the bundle: not a Shoal tensor bundle",
      legacy + ": a libtorch archive, as Shoal wrote checkpoints before tensor bundles",
      state + ": the bundle: a bundle of kind 'full-state', not a checkpoint",
      saved + ": 'param/weight' is Float [3, 5], the model has Float [3, 4]",
  };
  for (size_t i = 0; i < messages.size(); ++i) {
    EXPECT_NE(messages[i].find(expected[i]), std::string::npos) << messages[i];
    EXPECT_EQ(messages[i].find('\n'), std::string::npos) << messages[i];
  }
}

namespace {

// A checkpoint of `model` and `opt` with one entry replaced (or added) by `edit`, written as a
// sealed file at `path`: what a crafted or damaged file whose framing is intact looks like.
void writeEditedCheckpoint(const std::string& path, torch::nn::Module& model,
                           torch::optim::Optimizer& opt,
                           const std::function<void(train::TensorBundle&)>& edit) {
  TempDir scratch;
  std::string saved;
  auto errors = runThreadRanks(1, testOptions(TransportKind::kShm), [&](comm::Group& g) {
    saved = train::Checkpointer(scratch.path, 1).save(g, model, opt, {1, 2, 3});
  });
  ASSERT_EQ(errors[0], "");
  train::TensorBundle bundle =
      train::decodeTensorBundle(readSealedFile(saved), "checkpoint", saved);
  edit(bundle);
  writeSealedFile(path, train::encodeTensorBundle("checkpoint", bundle));
}

torch::Tensor& entry(train::TensorBundle& bundle, const std::string& name) {
  for (auto& [n, t] : bundle) {
    if (n == name) return t;
  }
  ADD_FAILURE() << "no " << name;
  static torch::Tensor none;
  return none;
}

}  // namespace

// A bundle whose RNG state has the right size but is one libtorch refuses (fuzzing found
// "Invalid mt19937 state" escaping as an untyped c10::Error): one line naming the file, and the
// model untouched.
TEST(Checkpoint, AnRngStateLibtorchRefusesIsOneLineAndNothingIsLoaded) {
  TempDir dir;
  torch::set_num_threads(1);
  auto model = torch::nn::Linear(4, 3);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
  const torch::Tensor before = model->weight.detach().clone();
  const std::string path = dir.path + "/bad-rng.pt";
  writeEditedCheckpoint(path, *torch::nn::Linear(4, 3), opt, [](train::TensorBundle& b) {
    entry(b, "rng").zero_();  // mt19937's "left" field 0: libtorch refuses the state
  });
  std::string message;
  auto errors = runThreadRanks(1, testOptions(TransportKind::kShm), [&](comm::Group& g) {
    train::Checkpointer c(dir.path, 2);
    try {
      c.load(g, path, *model, opt);
    } catch (const InvalidArgument& e) {
      message = e.what();
    }
  });
  ASSERT_EQ(errors[0], "");
  EXPECT_NE(message.find(path + ": the RNG state of rank 0 is invalid: "), std::string::npos)
      << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  EXPECT_TRUE(torch::equal(model->weight.detach(), before)) << "the weights were loaded";
}

// Adam's moments and step counts and each group's learning rate come back: a model resumed from
// the checkpoint takes the next step bitwise as the one that wrote it.
TEST(Checkpoint, OptimizerStateAndLearningRatesResumeBitwise) {
  TempDir dir;
  torch::set_num_threads(1);
  torch::manual_seed(11);
  auto model = torch::nn::Linear(6, 4);
  auto fresh = torch::nn::Linear(6, 4);
  auto twoGroups = [](torch::nn::Linear& m) {
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.emplace_back(std::vector<torch::Tensor>{m->weight},
                        std::make_unique<torch::optim::AdamOptions>(1e-2));
    groups.emplace_back(std::vector<torch::Tensor>{m->bias},
                        std::make_unique<torch::optim::AdamOptions>(1e-3));
    return torch::optim::Adam(groups, torch::optim::AdamOptions(1e-2));
  };
  torch::optim::Adam opt = twoGroups(model), freshOpt = twoGroups(fresh);
  const torch::Tensor x = torch::randn({8, 6});
  auto step = [&](torch::nn::Linear& m, torch::optim::Optimizer& o) {
    o.zero_grad();
    m->forward(x).pow(2).sum().backward();
    o.step();
  };
  for (int i = 0; i < 3; ++i) step(model, opt);
  opt.param_groups()[1].options().set_lr(5e-4);  // as a schedule would
  auto errors = runThreadRanks(1, testOptions(TransportKind::kShm), [&](comm::Group& g) {
    train::Checkpointer c(dir.path, 2);
    const std::string path = c.save(g, *model, opt, {0, 3, 3});
    const train::Progress p = c.load(g, path, *fresh, freshOpt);
    EXPECT_EQ(p.step, 3);
  });
  ASSERT_EQ(errors[0], "");
  EXPECT_DOUBLE_EQ(freshOpt.param_groups()[1].options().get_lr(), 5e-4);
  EXPECT_DOUBLE_EQ(freshOpt.param_groups()[0].options().get_lr(), 1e-2);
  step(model, opt);
  step(fresh, freshOpt);
  EXPECT_TRUE(torch::equal(model->weight, fresh->weight));
  EXPECT_TRUE(torch::equal(model->bias, fresh->bias));
}

// Optimizer state that does not fit (a moment of another shape, a parameter index the optimizer
// lacks, an entry nobody reads) is refused naming it, and the model and optimizer keep exactly
// what they held.
TEST(Checkpoint, OptimizerStateThatDoesNotFitChangesNothing) {
  TempDir dir;
  torch::set_num_threads(1);
  torch::manual_seed(12);
  auto model = torch::nn::Linear(4, 3);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-2));
  opt.zero_grad();
  model->forward(torch::randn({2, 4})).sum().backward();
  opt.step();
  const torch::Tensor weight = model->weight.detach().clone();
  // Fetched anew each time: a load that imported state replaced the object.
  auto weightState = [&]() -> torch::optim::AdamParamState& {
    return static_cast<torch::optim::AdamParamState&>(
        *opt.state().at(c10::guts::to_string(model->weight.unsafeGetTensorImpl())));
  };
  const torch::Tensor moment = weightState().exp_avg().clone();
  const struct {
    const char* label;
    std::function<void(train::TensorBundle&)> edit;
    const char* says;
  } cases[] = {
      {"a moment of another shape",
       [](train::TensorBundle& b) { entry(b, "optimizer/1/exp_avg") = torch::zeros({4}); },
       "the optimizer state of parameter 1 does not fit"},
      {"a parameter the optimizer lacks",
       [](train::TensorBundle& b) {
         b.emplace_back("optimizer/9/step", torch::tensor(int64_t{1}));
       },
       "'optimizer/9/step' is the state of parameter 9; the optimizer has 2"},
      {"an entry nobody reads",
       [](train::TensorBundle& b) { b.emplace_back("param/extra", torch::ones({1})); },
       "'param/extra' is not a parameter, buffer or optimizer state of this model"},
      {"an optimizer entry without a key (fuzzing found it read past the name)",
       [](train::TensorBundle& b) { b.emplace_back("optimizer/3", torch::ones({1})); },
       "'optimizer/3' is not a parameter, buffer or optimizer state of this model"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.label);
    const std::string path = dir.path + "/edited.pt";
    auto source = torch::nn::Linear(4, 3);
    torch::optim::Adam sourceOpt(source->parameters(), torch::optim::AdamOptions(1e-2));
    sourceOpt.zero_grad();
    source->forward(torch::randn({2, 4})).sum().backward();
    sourceOpt.step();
    writeEditedCheckpoint(path, *source, sourceOpt, c.edit);
    std::string message;
    auto errors = runThreadRanks(1, testOptions(TransportKind::kShm), [&](comm::Group& g) {
      try {
        train::Checkpointer(dir.path, 2).load(g, path, *model, opt);
      } catch (const InvalidArgument& e) {
        message = e.what();
      }
    });
    ASSERT_EQ(errors[0], "");
    EXPECT_NE(message.find(path + ": " + c.says), std::string::npos) << message;
    EXPECT_TRUE(torch::equal(model->weight.detach(), weight));
    EXPECT_TRUE(torch::equal(weightState().exp_avg(), moment));
    EXPECT_EQ(weightState().step(), 1);
  }
}

TEST(Sampler, ShardsAreEqualDisjointAndReshuffled) {
  const int64_t n = 103;
  std::set<int64_t> seen;
  for (int r = 0; r < 4; ++r) {
    train::DistributedSampler s(n, r, 4, {.seed = 5});
    auto e0 = s.indices(0);
    EXPECT_EQ(static_cast<int64_t>(e0.size()), 26);  // padded: ceil(103 / 4)
    EXPECT_EQ(e0, train::DistributedSampler(n, r, 4, {.seed = 5}).indices(0));  // deterministic
    EXPECT_NE(e0, s.indices(1));                                                // reshuffled
    seen.insert(e0.begin(), e0.end());
  }
  EXPECT_EQ(static_cast<int64_t>(seen.size()), n);  // every sample, the padding repeats some
  train::DistributedSampler dropping(n, 3, 4, {.dropLast = true});
  EXPECT_EQ(dropping.indices(0).size(), 25u);
  EXPECT_EQ(dropping.batches(10), 3);
}

}  // namespace
}  // namespace shoal::test
