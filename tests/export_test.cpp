// Model export (train/export/): files Python's torch.load and safetensors readers load, checked
// against PyTorch twins of the C++ models (tests/export_check.py): a FashionCnn, and
// examples/trainer_mnist's model trained by a hybrid (pipeline x tensor-parallel) job and saved
// as a full state; damaged full states, and the safetensors reader on hostile input.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <regex>
#include <set>

#include "common/sealed_file.h"
#include "tests/process_util.h"
#include "tests/thread_ranks.h"
#include "train/export/file_bytes.h"
#include "train/export/safetensors.h"
#include "train/export/tensor_file.h"
#include "train/fashion_cnn.h"
#include "train/full_state.h"
#include "train/idx_dataset.h"
#include "train/reshard_checkpoint.h"
#include "train/tensor/column_linear.h"
#include "train/tensor/row_linear.h"
#include "train/tensor/sharded_dropout.h"

namespace shoal::train {
namespace {

using test::runShell;
using test::TempDir;

void writeRaw(const std::string& path, const torch::Tensor& t) {
  const torch::Tensor c = t.contiguous().to(torch::kFloat32);
  std::ofstream out(path, std::ios::binary);
  out.write(static_cast<const char*>(c.data_ptr()), c.numel() * sizeof(float));
  ASSERT_TRUE(out.good());
}

// A FashionCnn after a few SGD steps on Fashion-MNIST (so BatchNorm's running statistics and
// the weights are no longer their initial values), in eval mode.
FashionCnn trainedCnn(const IdxDataset& data) {
  torch::manual_seed(7);
  FashionCnn model;
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  model->train();
  for (int step = 0; step < 5; ++step) {
    const auto x = data.images.slice(0, 1000 + step * 64, 1000 + (step + 1) * 64);
    const auto y = data.labels.slice(0, 1000 + step * 64, 1000 + (step + 1) * 64);
    sgd.zero_grad();
    torch::nn::functional::cross_entropy(model->forward(x), y).backward();
    sgd.step();
  }
  model->eval();
  return model;
}

TEST(Export, PythonLoadsBothFormatsWithEqualOutputs) {
  torch::set_num_threads(1);
  const IdxDataset data = readIdxDataset(kFashionMnistDir, "t10k");
  FashionCnn model = trainedCnn(data);
  TempDir dir;
  torch::save(model, dir.path + "/trained.pt");
  const torch::Tensor inputs = data.images.slice(0, 0, 1000);
  torch::Tensor outputs;
  {
    torch::NoGradGuard noGrad;
    outputs = model->forward(inputs);
  }
  writeRaw(dir.path + "/inputs.f32", inputs);
  writeRaw(dir.path + "/outputs.f32", outputs);

  for (const char* out : {"model.pt", "model.safetensors"}) {
    const auto r =
        runShell(fmt::format("{} {}/trained.pt {}/{}", SHOAL_EXPORT_BIN, dir.path, dir.path, out));
    ASSERT_EQ(r.code, 0) << r.output;
    EXPECT_NE(r.output.find("exported 18 tensors"), std::string::npos) << r.output;
  }
  const auto py = runShell(
      fmt::format("/usr/bin/python3 {}/tests/export_check.py {}", SHOAL_SOURCE_DIR, dir.path));
  EXPECT_EQ(py.code, 0) << py.output;
  EXPECT_NE(py.output.find("model.safetensors: 18 tensors"), std::string::npos) << py.output;

  // Every format reads back to the module's exact tensors, and loads into a fresh module.
  const NamedTensors expected = moduleTensors(*model);
  for (const char* file : {"trained.pt", "model.pt", "model.safetensors"}) {
    const NamedTensors got = readTensorFile(dir.path + "/" + file);
    ASSERT_EQ(got.size(), expected.size()) << file;
    for (const auto& [name, t] : expected) {
      ASSERT_TRUE(got.count(name)) << file << " lacks " << name;
      EXPECT_TRUE(torch::equal(got.at(name), t)) << file << ": " << name;
    }
    FashionCnn fresh;
    loadModuleTensors(*fresh, got, file);
    fresh->eval();
    torch::NoGradGuard noGrad;
    // The same batch through both: kernels may sum in another order for another batch size.
    const auto x = inputs.slice(0, 0, 50);
    EXPECT_TRUE(torch::equal(fresh->forward(x), model->forward(x))) << file;
  }
  EXPECT_EQ(detectTensorFileFormat(dir.path + "/trained.pt"), TensorFileFormat::kTorchSave);
  EXPECT_EQ(detectTensorFileFormat(dir.path + "/model.pt"), TensorFileFormat::kPickleDict);
}

// A sharded checkpoint folder (2 ranks, each writing half of every tensor, as ZeRO does) exports
// to the same tensors the module holds.
TEST(Export, ShardedCheckpointFolder) {
  torch::manual_seed(3);
  FashionCnn model;
  TempDir dir;
  const NamedTensors tensors = moduleTensors(*model);
  const std::set<std::string> buffers = [&] {
    std::set<std::string> b;
    for (const auto& x : model->named_buffers()) b.insert(x.key());
    return b;
  }();
  const auto errors =
      test::runThreadRanks(2, test::testOptions(TransportKind::kTcp), [&](comm::Group& g) {
        std::vector<FlatPiece> mine;
        for (const auto& [name, t] : tensors) {
          const int64_t n = t.numel(), begin = n * g.rank() / 2, end = n * (g.rank() + 1) / 2;
          mine.push_back({(buffers.count(name) ? "buffer/" : "param/") + name, t.sizes().vec(),
                          begin, t.reshape({-1}).slice(0, begin, end).clone()});
        }
        saveShards(g, dir.path + "/ckpt", 7, mine, {}, 1);
      });
  for (const auto& e : errors) ASSERT_EQ(e, "");
  const auto r =
      runShell(fmt::format("{} {}/ckpt {}/m.safetensors", SHOAL_EXPORT_BIN, dir.path, dir.path));
  ASSERT_EQ(r.code, 0) << r.output;
  const NamedTensors got = readTensorFile(dir.path + "/m.safetensors");
  ASSERT_EQ(got.size(), tensors.size());
  for (const auto& [name, t] : tensors) EXPECT_TRUE(torch::equal(got.at(name), t)) << name;
}

// examples/trainer_mnist.cpp's model as its --evaluate-from builds it in one process (the same
// layers, a tensor group of one rank), so its outputs are the C++ program's.
torch::nn::Sequential trainerMnistModel() {
  using namespace torch::nn;
  const tensor::TensorGroup one{};
  Linear hidden(32 * 7 * 7, 128), out(128, 10);
  return Sequential(
      Conv2d(Conv2dOptions(1, 16, 3).padding(1)), BatchNorm2d(16), ReLU(), MaxPool2d(2),
      Conv2d(Conv2dOptions(16, 32, 3).padding(1)), BatchNorm2d(32), ReLU(), MaxPool2d(2), Flatten(),
      tensor::ColumnParallelLinear(hidden->weight, hidden->bias, one), ReLU(),
      tensor::ShardedDropout(0.25, one), tensor::RowParallelLinear(out->weight, out->bias, one));
}

// A model trained on a 2 x 2 grid (2 pipeline stages, each split over 2 tensor-parallel ranks)
// under shoal run, saved by its --save as one full state, exported both ways by shoal-export:
// the files hold the consolidated model (full shapes, the one-process names), and Python's plain
// model loads them strictly and gives the C++ model's outputs on 1000 test images within 1e-6.
// The C++ outputs here are tied to trainer_mnist's own: its --evaluate-from scores the file as
// this test's forward does.
TEST(Export, AHybridJobsSavedModelRunsInPython) {
  torch::set_num_threads(1);
  TempDir dir;
  const std::string saved = dir.path + "/model.state";
  const auto job = runShell(fmt::format(
      "OPENBLAS_NUM_THREADS=1 timeout 300 {} run -n 4 --timeout 60 -- {} --strategy hybrid "
      "--stages 2 --tensor 2 --train-subset 600 --test-subset 200 --batch 30 --epochs 1 "
      "--threads 1 --save {}",
      SHOAL_BIN, TRAINER_MNIST_BIN, saved));
  ASSERT_EQ(job.code, 0) << job.output;
  ASSERT_NE(job.output.find("grid data 1 x pipeline 2 x tensor 2"), std::string::npos)
      << job.output;
  ASSERT_NE(job.output.find("saved the full model to " + saved), std::string::npos) << job.output;
  EXPECT_EQ(detectTensorFileFormat(saved), TensorFileFormat::kFullState);

  // The file holds the whole model under the one-process names: the split classifier gathered.
  const FullState state = readFullState(saved);
  const NamedTensors read = readTensorFile(saved);
  ASSERT_EQ(state.size(), 18u);
  ASSERT_EQ(read.size(), 18u);
  for (const auto& [name, t] : state) {
    ASSERT_TRUE(read.count(name)) << name;
    EXPECT_TRUE(torch::equal(read.at(name), t)) << name;
  }
  EXPECT_EQ(read.at("9.weight").sizes().vec(), (std::vector<int64_t>{128, 32 * 7 * 7}));
  EXPECT_EQ(read.at("9.bias").sizes().vec(), (std::vector<int64_t>{128}));
  EXPECT_EQ(read.at("12.weight").sizes().vec(), (std::vector<int64_t>{10, 128}));
  EXPECT_EQ(read.at("5.running_var").sizes().vec(), (std::vector<int64_t>{32}));

  auto model = trainerMnistModel();
  loadFullState(*model, state);
  model->eval();
  const IdxDataset test = readIdxDataset(kFashionMnistDir, "t10k", 1000);
  torch::Tensor outputs, scored;
  {
    torch::NoGradGuard noGrad;
    // One batch of 1000, as export_check.py runs it: libtorch's kernels sum in another order for
    // another batch size (here up to 1.4e-6 apart between batches of 256 and of 1000).
    outputs = model->forward(test.images);
    // In trainer_mnist's batches of 256, so that its score and this one are the same numbers.
    std::vector<torch::Tensor> parts;
    for (int64_t at = 0; at < test.size(); at += 256)
      parts.push_back(model->forward(test.images.narrow(0, at, std::min<int64_t>(256, 1000 - at))));
    scored = torch::cat(parts);
  }
  const int64_t correct = scored.argmax(1).eq(test.labels).sum().item<int64_t>();
  const auto alone = runShell(fmt::format(
      "OPENBLAS_NUM_THREADS=1 timeout 120 {} --evaluate-from {} --test-subset 1000 --threads 1",
      TRAINER_MNIST_BIN, saved));
  ASSERT_EQ(alone.code, 0) << alone.output;
  EXPECT_NE(alone.output.find(fmt::format("accuracy {:.2f}% on 1000 samples", correct / 10.0)),
            std::string::npos)
      << alone.output << " (this test's forward: " << correct << " of 1000)";
  EXPECT_GT(correct, 500) << "one epoch on 600 images learns well above chance";

  writeRaw(dir.path + "/inputs.f32", test.images);
  writeRaw(dir.path + "/outputs.f32", outputs);
  for (const char* out : {"model.pt", "model.safetensors"}) {
    const auto r = runShell(fmt::format("{} {} {}/{}", SHOAL_EXPORT_BIN, saved, dir.path, out));
    ASSERT_EQ(r.code, 0) << r.output;
    EXPECT_NE(r.output.find("exported 18 tensors"), std::string::npos) << r.output;
    const NamedTensors back = readTensorFile(dir.path + "/" + out);
    ASSERT_EQ(back.size(), read.size()) << out;
    for (const auto& [name, t] : read) {
      ASSERT_TRUE(back.count(name)) << out << " lacks " << name;
      EXPECT_EQ(back.at(name).scalar_type(), t.scalar_type()) << out << ": " << name;
      EXPECT_TRUE(torch::equal(back.at(name), t)) << out << ": " << name;
    }
  }
  const auto py = runShell(fmt::format("/usr/bin/python3 {}/tests/export_check.py {} trainer_mnist",
                                       SHOAL_SOURCE_DIR, dir.path));
  EXPECT_EQ(py.code, 0) << py.output;
  EXPECT_NE(py.output.find("torch.load(model.pt): 18 tensors"), std::string::npos) << py.output;
  EXPECT_NE(py.output.find("model.safetensors: 18 tensors"), std::string::npos) << py.output;
}

// A grid job's sharded checkpoints (a folder per stage and slice) are consolidated by the job:
// run again on the same grid with --resume --save, a finished job resumes to nothing and writes
// the whole model, bit for bit the one the first run saved at its end; shoal-export reads it.
TEST(Export, AGridJobsCheckpointsAreConsolidatedByResumingWithSave) {
  TempDir dir;
  const std::string job = fmt::format(
      "OPENBLAS_NUM_THREADS=1 timeout 300 {} run -n 4 --timeout 60 -- {} --strategy hybrid "
      "--stages 2 --tensor 2 --train-subset 300 --test-subset 100 --batch 30 --epochs 1 "
      "--threads 1 --checkpoint-dir {}/ckpt",
      SHOAL_BIN, TRAINER_MNIST_BIN, dir.path);
  const auto first = runShell(fmt::format("{} --save {}/end.state", job, dir.path));
  ASSERT_EQ(first.code, 0) << first.output;
  ASSERT_NE(first.output.find("] epoch 1:"), std::string::npos) << first.output;
  const auto again = runShell(fmt::format("{} --resume --save {}/resumed.state", job, dir.path));
  ASSERT_EQ(again.code, 0) << again.output;
  // Nothing trained again: the model comes from the checkpoints (a retrained one, from the same
  // seed, would be equal too).
  EXPECT_EQ(again.output.find("] epoch 1:"), std::string::npos) << again.output;
  const FullState end = readFullState(dir.path + "/end.state");
  const FullState resumed = readFullState(dir.path + "/resumed.state");
  ASSERT_EQ(resumed.size(), end.size());
  ASSERT_EQ(end.size(), 18u);
  for (size_t i = 0; i < end.size(); ++i) {
    EXPECT_EQ(resumed[i].first, end[i].first);
    EXPECT_TRUE(torch::equal(resumed[i].second, end[i].second)) << end[i].first;
  }
  const auto r = runShell(fmt::format("{} {}/resumed.state {}/model.safetensors", SHOAL_EXPORT_BIN,
                                      dir.path, dir.path));
  ASSERT_EQ(r.code, 0) << r.output;
  const NamedTensors back = readTensorFile(dir.path + "/model.safetensors");
  ASSERT_EQ(back.size(), end.size());
  for (const auto& [name, t] : end) {
    ASSERT_TRUE(back.count(name)) << name;
    EXPECT_TRUE(torch::equal(back.at(name), t)) << name;
  }
}

// A full state that is cut short, padded, corrupt, or sealed but not a model's: shoal-export
// says so in one line naming the file, exits 1, and writes nothing.
TEST(Export, ADamagedFullStateIsOneLineAndExitOne) {
  TempDir dir;
  torch::manual_seed(5);
  const FullState state = {{"fc.weight", torch::randn({3, 4})},
                           {"fc.bias", torch::randn({3})},
                           {"bn.num_batches_tracked", torch::tensor(int64_t{9})}};
  const std::string good = dir.path + "/good.state";
  writeFullState(good, state);
  auto r = runShell(fmt::format("{} {} {}/good.safetensors", SHOAL_EXPORT_BIN, good, dir.path));
  ASSERT_EQ(r.code, 0) << r.output;
  const NamedTensors back = readTensorFile(dir.path + "/good.safetensors");
  ASSERT_EQ(back.size(), 3u);
  for (const auto& [name, t] : state) {
    EXPECT_EQ(back.at(name).scalar_type(), t.scalar_type()) << name;
    EXPECT_TRUE(torch::equal(back.at(name), t)) << name;
  }

  const std::string bytes = readFileBytes(good);
  std::string flipped = bytes;
  flipped[bytes.size() / 2] ^= 0x5a;
  std::string twice;
  {
    // The encoder refuses a name twice, so the second name is written apart and renamed.
    FullState dup = state;
    dup.emplace_back("fc.weighX", state[0].second);
    twice = encodeFullState(dup);
    const size_t at = twice.rfind("fc.weighX");
    ASSERT_NE(at, std::string::npos);
    twice[at + 8] = 't';
  }
  std::string notAState;
  {
    std::ostringstream archive;
    torch::save(torch::nn::Linear(2, 2), archive);
    notAState = archive.str();
  }
  const struct {
    const char* label;
    std::string bytes;
    bool sealPayload;  // bytes is a payload to seal, not the file
    const char* says;
  } cases[] = {
      {"cut by one byte", bytes.substr(0, bytes.size() - 1), false, "truncated or padded"},
      {"cut in the payload", bytes.substr(0, bytes.size() / 3), false, "truncated or padded"},
      {"cut in the magic", bytes.substr(0, 5), false, "bad header"},
      {"padded", bytes + "x", false, "truncated or padded"},
      {"corrupt", flipped, false, "checksum mismatch"},
      {"sealed junk", "not an archive at all", true, "not a full model state"},
      {"sealed module", notAState, true, "a libtorch archive"},
      {"a name twice", twice, true, "'fc.weight' is named twice"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.label);
    const std::string path = dir.path + "/bad.state";
    if (c.sealPayload) {
      writeSealedFile(path, c.bytes);
    } else {
      writeFileAtomically(path, c.bytes);
    }
    const std::string out = dir.path + "/bad.safetensors";
    r = runShell(fmt::format("{} {} {}", SHOAL_EXPORT_BIN, path, out));
    EXPECT_EQ(r.code, 1) << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
    EXPECT_EQ(r.output.rfind("shoal-export: ", 0), 0u) << r.output;
    EXPECT_NE(r.output.find(path), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(c.says), std::string::npos) << r.output;
    EXPECT_FALSE(std::filesystem::exists(out));
    EXPECT_THROW(readTensorFile(path), InvalidArgument);
  }
}

TEST(Export, ToolErrorsAreOneLineWithExitCodes) {
  TempDir dir;
  auto r =
      runShell(fmt::format("{} {}/missing.pt {}/out.pt", SHOAL_EXPORT_BIN, dir.path, dir.path));
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("no such file"), std::string::npos) << r.output;
  r = runShell(fmt::format("{} a b --format onnx", SHOAL_EXPORT_BIN));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("unknown format 'onnx'"), std::string::npos) << r.output;
  r = runShell(fmt::format("{} only-one", SHOAL_EXPORT_BIN));
  EXPECT_EQ(r.code, 2) << r.output;
}

TEST(Export, ModuleLoadIsStrict) {
  FashionCnn model;
  NamedTensors t = moduleTensors(*model);
  NamedTensors missing = t;
  missing.erase("fc2.bias");
  EXPECT_THROW(loadModuleTensors(*model, missing, "x"), InvalidArgument);
  NamedTensors extra = t;
  extra["fc3.weight"] = torch::zeros({1});
  EXPECT_THROW(loadModuleTensors(*model, extra, "x"), InvalidArgument);
  NamedTensors shape = t;
  shape["fc2.bias"] = torch::zeros({11});
  EXPECT_THROW(loadModuleTensors(*model, shape, "x"), InvalidArgument);
}

// --- safetensors on hostile bytes ------------------------------------------------------------

std::string withHeader(const std::string& json, const std::string& data) {
  std::string out(8, '\0');
  const uint64_t n = json.size();
  std::memcpy(out.data(), &n, 8);
  return out + json + data;
}

std::string errorOf(const std::string& bytes) {
  try {
    decodeSafetensors(bytes, "f");
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(Safetensors, RoundTripsEveryDtype) {
  NamedTensors in;
  in["a.f32"] = torch::randn({3, 4});
  in["b.f64"] = torch::randn({2}, torch::kFloat64);
  in["c.f16"] = torch::randn({5}).to(torch::kFloat16);
  in["d.bf16"] = torch::randn({5}).to(torch::kBFloat16);
  in["e.i64"] = torch::arange(7, torch::kInt64);
  in["f.u8"] = torch::arange(3, torch::kUInt8);
  in["g.bool"] = torch::tensor({true, false});
  in["h.empty"] = torch::zeros({0, 3});
  in["i.scalar"] = torch::tensor(3.5f);
  in["j.strided"] = torch::randn({4, 4}).t();
  const std::string bytes = encodeSafetensors(in, {{"format", "pt"}});
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  const Safetensors out = decodeSafetensors(bytes);
  EXPECT_EQ(out.metadata.at("format"), "pt");
  ASSERT_EQ(out.tensors.size(), in.size());
  for (const auto& [name, t] : in) {
    EXPECT_EQ(out.tensors.at(name).scalar_type(), t.scalar_type()) << name;
    EXPECT_TRUE(torch::equal(out.tensors.at(name), t)) << name;
  }
}

TEST(Safetensors, RejectsMalformedInput) {
  const std::string f32x2(8, '\0');
  EXPECT_NE(errorOf("abc").find("too short"), std::string::npos);
  std::string huge(8, '\xff');
  EXPECT_NE(errorOf(huge + "{}").find("header length"), std::string::npos);
  EXPECT_NE(errorOf(withHeader("{not json", "")).find("not JSON"), std::string::npos);
  EXPECT_NE(errorOf(withHeader("[1]", "")).find("not a JSON object"), std::string::npos);
  const auto entry = [](const std::string& dtype, const std::string& shape, uint64_t b,
                        uint64_t e) {
    return fmt::format(R"({{"t":{{"dtype":"{}","shape":{},"data_offsets":[{},{}]}}}})", dtype,
                       shape, b, e);
  };
  EXPECT_EQ(errorOf(withHeader(entry("F32", "[2]", 0, 8), f32x2)), "");
  EXPECT_NE(errorOf(withHeader(entry("F33", "[2]", 0, 8), f32x2)).find("unsupported dtype"),
            std::string::npos);
  EXPECT_NE(errorOf(withHeader(entry("F32", "[3]", 0, 8), f32x2)).find("takes 12 bytes"),
            std::string::npos);
  EXPECT_NE(errorOf(withHeader(entry("F32", "[4]", 0, 16), f32x2)).find("outside"),
            std::string::npos);
  EXPECT_NE(errorOf(withHeader(entry("F32", "[1]", 4, 8), f32x2)).find("gap"), std::string::npos);
  EXPECT_NE(errorOf(withHeader(entry("F32", "[1]", 0, 4), f32x2)).find("cover 4 of the 8"),
            std::string::npos);
  EXPECT_NE(errorOf(withHeader(entry("F32", "[-1]", 0, 8), f32x2)).find("not a count"),
            std::string::npos);
  EXPECT_NE(errorOf(withHeader(entry("F32", "[4294967296,4294967296,4294967296]", 0, 8), f32x2))
                .find("too large"),
            std::string::npos);
  EXPECT_NE(errorOf(withHeader(R"({"t":{"dtype":"F32"}})", "")).find("needs"), std::string::npos);
}

}  // namespace
}  // namespace shoal::train
