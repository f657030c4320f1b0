// Sharded checkpoints (train/reshard_checkpoint.h): saved by thread ranks over TCP, read back at
// other world sizes with exact values; keeping, commit by manifest, damage named; consolidation
// into one torch::save file and the shoal-consolidate tool.
#include "train/reshard_checkpoint.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include "common/error.h"
#include "tests/thread_ranks.h"

namespace shoal {
namespace {

namespace fs = std::filesystem;
using test::runThreadRanks;
using test::testOptions;
using train::FlatPiece;
using train::ShardReader;

using State = std::map<std::string, torch::Tensor>;

std::string freshDir(const std::string& name) {
  const fs::path dir =
      fs::temp_directory_path() / fmt::format("shoal-reshard-{}-{}", name, getpid());
  fs::remove_all(dir);
  return dir.string();
}

// Elements [numel * r / n, numel * (r + 1) / n) of every tensor: rank r's contiguous share, as
// ZeRO would hold it (uneven when numel does not divide by n, empty for some ranks of a scalar).
std::vector<FlatPiece> share(const State& state, int r, int n) {
  std::vector<FlatPiece> out;
  for (const auto& [name, t] : state) {
    const int64_t numel = t.numel();
    const int64_t begin = numel * r / n, end = numel * (r + 1) / n;
    out.push_back({name, t.sizes().vec(), begin, t.reshape({-1}).slice(0, begin, end).clone()});
  }
  return out;
}

State sampleState() {
  torch::manual_seed(11);
  State s;
  s["param/fc1.weight"] = torch::randn({5, 3});  // 15 elements: not a multiple of 4 (or 2)
  s["param/fc1.bias"] = torch::randn({5});
  s["param/emb"] = torch::randn({7, 2}).to(torch::kBFloat16);
  s["optim/exp_avg/fc1.weight"] = torch::randn({5, 3}, torch::kFloat64);
  s["optim/exp_avg_sq/half"] = torch::rand({9}).to(torch::kFloat16);
  s["optim/step"] = torch::tensor(int64_t{42});  // a scalar: one element, on the last rank
  s["buffer/bn.running_mean"] = torch::randn({64});
  return s;
}

// Runs `n` thread ranks saving their shares of `state`; returns each rank's error text.
std::vector<std::string> saveFrom(int n, const State& state, const std::string& dir, int64_t step,
                                  int keep = 3,
                                  const std::map<std::string, std::string>& meta = {}) {
  return runThreadRanks(n, testOptions(TransportKind::kTcp), [&](comm::Group& g) {
    train::saveShards(g, dir, step, share(state, g.rank(), n), meta, keep);
  });
}

void expectAllOk(const std::vector<std::string>& errors) {
  for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

// "InvalidArgument: <what>" (or another type's name) of what fn throws; "" if nothing.
template <typename Fn>
std::string thrown(Fn&& fn) {
  try {
    fn();
  } catch (const InvalidArgument& e) {
    return std::string("InvalidArgument: ") + e.what();
  } catch (const SystemError& e) {
    return std::string("SystemError: ") + e.what();
  } catch (const std::exception& e) {
    return std::string("other: ") + e.what();
  }
  return "";
}

void flipByte(const std::string& path, std::streamoff at) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  ASSERT_TRUE(f.good()) << path;
  f.seekg(at);
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x5a);
  f.seekp(at);
  f.write(&c, 1);
}

TEST(ReshardCheckpoint, FourRanksReadBackAsTwoAndThreeExactly) {
  const auto dir = freshDir("four");
  const State state = sampleState();
  expectAllOk(saveFrom(4, state, dir, 7, 3, {{"zero_stage", "3"}, {"progress", "epoch 2"}}));

  ASSERT_EQ(ShardReader::latestStep(dir), 7);
  ShardReader reader(dir, 7);
  EXPECT_EQ(reader.worldSize(), 4);
  EXPECT_EQ(reader.meta().at("zero_stage"), "3");
  EXPECT_EQ(reader.meta().at("progress"), "epoch 2");
  std::vector<std::string> names;
  for (auto& [name, t] : state) names.push_back(name);
  EXPECT_EQ(reader.names(), names);
  EXPECT_FALSE(reader.has("param/nope"));
  for (const auto& [name, full] : state) {
    SCOPED_TRACE(name);
    EXPECT_EQ(reader.shape(name), full.sizes().vec());
    EXPECT_EQ(reader.dtype(name), full.scalar_type());
    const auto flat = full.reshape({-1});
    // Each rank of a job of 2 or 3 reads its own share: ranges that cut across the writers'.
    for (int n : {2, 3}) {
      for (int r = 0; r < n; ++r) {
        const int64_t begin = flat.numel() * r / n, end = flat.numel() * (r + 1) / n;
        auto out = torch::empty({end - begin}, flat.options());
        reader.read(name, begin, out);
        EXPECT_TRUE(torch::equal(out, flat.slice(0, begin, end))) << n << " ranks, rank " << r;
      }
    }
    // Any range, including empty ones and one element.
    for (auto [begin, end] : std::vector<std::pair<int64_t, int64_t>>{
             {0, flat.numel()}, {flat.numel() - 1, flat.numel()}, {0, 0}, {1, flat.numel()}}) {
      if (begin < 0 || begin > end || end > flat.numel()) continue;
      auto out = torch::empty({end - begin}, flat.options());
      reader.read(name, begin, out);
      EXPECT_TRUE(torch::equal(out, flat.slice(0, begin, end))) << begin << ".." << end;
    }
    // ZeRO-3 → DDP: the whole tensor, shaped.
    EXPECT_TRUE(torch::equal(reader.readFull(name), full));
  }
  // A range past the end, and an output of the wrong dtype, are the caller's errors.
  auto four = torch::empty({4});
  EXPECT_NE(thrown([&] { reader.read("param/fc1.bias", 2, four); }).find("outside its 5 elements"),
            std::string::npos);
  auto wrong = torch::empty({2}, torch::kFloat64);
  EXPECT_NE(thrown([&] { reader.read("param/fc1.bias", 0, wrong); }).find("InvalidArgument"),
            std::string::npos);

  // 2 → 3: saved by 2 ranks, every rank of 3 reads its share.
  const auto dir2 = freshDir("two");
  expectAllOk(saveFrom(2, state, dir2, 1));
  ShardReader two(dir2, 1);
  EXPECT_EQ(two.worldSize(), 2);
  for (const auto& [name, full] : state) {
    const auto flat = full.reshape({-1});
    for (int r = 0; r < 3; ++r) {
      const int64_t begin = flat.numel() * r / 3, end = flat.numel() * (r + 1) / 3;
      auto out = torch::empty({end - begin}, flat.options());
      two.read(name, begin, out);
      EXPECT_TRUE(torch::equal(out, flat.slice(0, begin, end))) << name << " rank " << r;
    }
  }
  fs::remove_all(dir);
  fs::remove_all(dir2);
}

TEST(ReshardCheckpoint, KeepsTheNewestCommittedSteps) {
  const auto dir = freshDir("keep");
  EXPECT_EQ(ShardReader::latestStep(dir), std::nullopt);  // no folder yet
  const State state = sampleState();
  for (int64_t step = 1; step <= 5; ++step) expectAllOk(saveFrom(2, state, dir, step, 2));
  std::vector<std::string> present;
  for (auto& e : fs::directory_iterator(dir)) present.push_back(e.path().filename().string());
  std::sort(present.begin(), present.end());
  EXPECT_EQ(present, (std::vector<std::string>{"step-00000004", "step-00000005"}));
  EXPECT_EQ(ShardReader::latestStep(dir), 5);

  // A newer step whose save never committed (rank files, no manifest) does not exist for readers.
  fs::create_directories(dir + "/step-00000009");
  fs::copy_file(dir + "/step-00000005/rank-0-of-2.shard", dir + "/step-00000009/rank-0-of-2.shard");
  EXPECT_EQ(ShardReader::latestStep(dir), 5);
  EXPECT_NE(thrown([&] { ShardReader(dir, 9); }).find("not committed"), std::string::npos);

  // Saving again prunes step 4; the uncommitted newer folder is left alone.
  expectAllOk(saveFrom(2, state, dir, 6, 2));
  EXPECT_FALSE(fs::exists(dir + "/step-00000004"));
  EXPECT_TRUE(fs::exists(dir + "/step-00000005/manifest"));
  EXPECT_EQ(ShardReader::latestStep(dir), 6);

  // A step saved again (here by another world size) is rewritten whole.
  expectAllOk(saveFrom(3, state, dir, 6, 2));
  EXPECT_FALSE(fs::exists(dir + "/step-00000006/rank-0-of-2.shard"));
  ShardReader again(dir, 6);
  EXPECT_EQ(again.worldSize(), 3);
  EXPECT_TRUE(torch::equal(again.readFull("param/emb"), state.at("param/emb")));
  fs::remove_all(dir);
}

TEST(ReshardCheckpoint, MixedUpPiecesAreRefusedOnEveryRank) {
  const auto dir = freshDir("mixed");
  auto refuse = [&](const std::function<std::vector<FlatPiece>(int)>& pieces,
                    const std::string& expected) {
    SCOPED_TRACE(expected);
    auto errors = runThreadRanks(3, testOptions(TransportKind::kTcp), [&](comm::Group& g) {
      const auto what = thrown([&] { train::saveShards(g, dir, 1, pieces(g.rank()), {}, 2); });
      if (!what.empty()) throw std::runtime_error(what);
    });
    for (size_t r = 0; r < errors.size(); ++r) {
      EXPECT_EQ(errors[r].rfind("InvalidArgument: rank " + std::to_string(r), 0), 0u) << errors[r];
      EXPECT_NE(errors[r].find(expected), std::string::npos) << errors[r];
    }
    EXPECT_EQ(ShardReader::latestStep(dir), std::nullopt);  // nothing committed
  };
  auto ones = [](int64_t n) { return torch::ones({n}); };
  // Rank 1's piece runs past the end of its shape.
  refuse(
      [&](int r) {
        return std::vector<FlatPiece>{{"w", {6}, 2 * r, ones(r == 1 ? 5 : 2)}};
      },
      "rank 1: the piece of 'w' (elements [2, 7)) is past the end of its shape [6]");
  // Ranks disagree on a tensor's shape.
  refuse(
      [&](int r) {
        return std::vector<FlatPiece>{{"w", {r == 2 ? int64_t{7} : 6}, 2 * r, ones(2)}};
      },
      "'w' is float32 [6] on rank 0 and float32 [7] on rank 2");
  // Two ranks write the same elements.
  refuse(
      [&](int r) {
        return std::vector<FlatPiece>{{"w", {6}, r == 2 ? 1 : 2 * r, ones(2)}};
      },
      "elements [1, 2) of 'w' are written by rank 0 and by rank 2");
  // Elements nobody wrote.
  refuse(
      [&](int r) {
        return std::vector<FlatPiece>{{"w", {7}, 2 * r, ones(2)}};
      },
      "elements [6, 7) of 'w' are written by no rank");
  // Not 1-D.
  refuse(
      [&](int r) {
        return std::vector<FlatPiece>{{"w", {6}, 2 * r, r == 0 ? torch::ones({1, 2}) : ones(2)}};
      },
      "rank 0: the piece of 'w' is not a 1-D contiguous CPU tensor");
  fs::remove_all(dir);
}

TEST(ReshardCheckpoint, AFailedWriteOnOneRankFailsEveryRankNamingIt) {
  const auto dir = freshDir("write");
  // Rank 1 is pointed below a regular file, so that its write alone fails (root ignores
  // permissions, so a read-only folder would not).
  const std::string blocker = freshDir("write-blocker");
  std::ofstream(blocker) << "a file, not a folder";
  const State state = sampleState();
  auto errors = runThreadRanks(2, testOptions(TransportKind::kTcp), [&](comm::Group& g) {
    const std::string mine = g.rank() == 1 ? blocker + "/ckpt" : dir;
    const auto what =
        thrown([&] { train::saveShards(g, mine, 1, share(state, g.rank(), 2), {}, 2); });
    if (!what.empty()) throw std::runtime_error(what);
  });
  for (size_t r = 0; r < errors.size(); ++r) {
    EXPECT_EQ(errors[r].rfind(
                  fmt::format("SystemError: rank {}: saving step 1 failed on rank 1: ", r), 0),
              0u)
        << errors[r];
  }
  EXPECT_EQ(ShardReader::latestStep(dir), std::nullopt);  // rank 0 did not commit
  fs::remove_all(dir);
  fs::remove(blocker);
}

TEST(ReshardCheckpoint, DamageIsNamedWithItsFileAndRank) {
  const auto dir = freshDir("damage");
  State state;
  state["param/a"] = torch::arange(100, torch::kFloat32);
  state["param/b"] = torch::arange(40, torch::kInt64);  // the last piece of each rank file
  expectAllOk(saveFrom(2, state, dir, 3));
  const std::string step = dir + "/step-00000003";

  // One flipped byte in rank 1's data: its file still matches the manifest's size, but the
  // piece holding the byte fails its checksum when read; the other rank's pieces still read.
  {
    const std::string file = step + "/rank-1-of-2.shard";
    flipByte(file, static_cast<std::streamoff>(fs::file_size(file)) - 32 - 3);
    ShardReader reader(dir, 3);
    auto out = torch::empty({10}, torch::kInt64);
    const auto what = thrown([&] { reader.read("param/b", 25, out); });
    EXPECT_EQ(what.rfind("InvalidArgument: ", 0), 0u) << what;
    EXPECT_NE(what.find("rank-1-of-2.shard (written by rank 1 of 2)"), std::string::npos) << what;
    EXPECT_NE(what.find("fails its checksum"), std::string::npos) << what;
    auto first = torch::empty({20}, torch::kInt64);
    reader.read("param/b", 0, first);
    EXPECT_TRUE(torch::equal(first, torch::arange(20, torch::kInt64)));
    EXPECT_TRUE(torch::equal(reader.readFull("param/a"), state["param/a"]));
  }
  // A truncated rank file, then a missing one: the constructor names them.
  {
    const std::string file = step + "/rank-0-of-2.shard";
    const auto size = fs::file_size(file);
    fs::resize_file(file, size - 10);
    auto what = thrown([&] { ShardReader(dir, 3); });
    EXPECT_NE(what.find("rank-0-of-2.shard (written by rank 0 of 2): " + std::to_string(size - 10) +
                        " bytes, the manifest records " + std::to_string(size)),
              std::string::npos)
        << what;
    fs::remove(file);
    what = thrown([&] { ShardReader(dir, 3); });
    EXPECT_EQ(what.rfind("InvalidArgument: ", 0), 0u) << what;
    EXPECT_NE(what.find("rank-0-of-2.shard (written by rank 0 of 2) is missing"), std::string::npos)
        << what;
  }
  // A corrupt manifest: latestStep and the reader name it, with no fallback to an older step.
  {
    expectAllOk(saveFrom(2, state, dir, 4));
    const std::string manifest = dir + "/step-00000004/manifest";
    flipByte(manifest, 20);
    for (const auto& what :
         {thrown([&] { ShardReader::latestStep(dir); }), thrown([&] { ShardReader(dir, 4); })}) {
      EXPECT_EQ(what.rfind("InvalidArgument: ", 0), 0u) << what;
      EXPECT_NE(what.find(manifest), std::string::npos) << what;
    }
  }
  fs::remove_all(dir);
}

struct BlockImpl : torch::nn::Module {
  BlockImpl() : bn(register_module("bn", torch::nn::BatchNorm1d(4))) {}
  torch::Tensor forward(torch::Tensor x) { return bn(x); }
  torch::nn::BatchNorm1d bn;
};
TORCH_MODULE(Block);

torch::nn::Sequential smallModel() {
  return torch::nn::Sequential(torch::nn::Linear(3, 4), Block());
}

// `cmd`'s exit code and output (stdout and stderr together).
std::pair<int, std::string> runTool(const std::string& args) {
  const std::string cmd = std::string(SHOAL_CONSOLIDATE_BIN) + " " + args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return {-1, "popen failed"};
  std::string out;
  char buf[512];
  while (size_t n = std::fread(buf, 1, sizeof(buf), p)) out.append(buf, n);
  const int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

TEST(ReshardCheckpoint, ConsolidatedFileLoadsIntoOneProcessModel) {
  const auto dir = freshDir("consolidate");
  torch::manual_seed(3);
  auto trained = smallModel();
  {
    // Running statistics that differ from a fresh module's.
    torch::NoGradGuard noGrad;
    trained->forward(torch::randn({8, 3}));
  }
  State state;
  for (auto& p : trained->named_parameters()) state["param/" + p.key()] = p.value().detach();
  for (auto& b : trained->named_buffers()) state["buffer/" + b.key()] = b.value();
  state["optim/exp_avg/0.weight"] = torch::randn({4, 3});  // not part of the consolidated file
  expectAllOk(saveFrom(3, state, dir, 12));

  const std::string out = dir + "/model.pt";
  EXPECT_EQ(train::consolidate(dir, 12, out), state.size() - 1);
  auto fresh = smallModel();
  torch::load(fresh, out);
  for (auto& p : fresh->named_parameters()) {
    EXPECT_TRUE(torch::equal(p.value(), state.at("param/" + p.key()))) << p.key();
  }
  for (auto& b : fresh->named_buffers()) {
    EXPECT_TRUE(torch::equal(b.value(), state.at("buffer/" + b.key()))) << b.key();
  }

  // The tool: the same, one line; then the errors, one line on stderr and exit code 1.
  auto [rc, text] = runTool(dir + " " + dir + "/tool.pt");
  EXPECT_EQ(rc, 0) << text;
  EXPECT_NE(text.find("consolidated step 12 of " + dir + " (written by 3 ranks): 7 tensors, "),
            std::string::npos)
      << text;
  torch::load(fresh, dir + "/tool.pt");
  std::tie(rc, text) = runTool(dir + " --step 11 " + dir + "/tool.pt");
  EXPECT_EQ(rc, 1) << text;
  EXPECT_NE(text.find("shoal-consolidate: checkpoint step 11 in " + dir + ": not committed"),
            std::string::npos)
      << text;
  std::tie(rc, text) = runTool(dir + "/no-such-dir " + dir + "/tool.pt");
  EXPECT_EQ(rc, 1) << text;
  EXPECT_EQ(text, "shoal-consolidate: " + dir +
                      "/no-such-dir: not a checkpoint folder (no such "
                      "directory)\n");
  std::tie(rc, text) = runTool(dir);
  EXPECT_EQ(rc, 1) << text;
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 1) << text;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace shoal
