// Writes the seed corpus: a few valid inputs per target, made with Shoal's own encoders so they
// stay valid as the formats evolve. Usage: make_corpus <corpus dir> (fuzz/corpus). Rerun after
// a format change and commit the result; scripts/fuzz.sh --seeds does both steps but the
// commit.
#include <torch/torch.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "comm/compress/sign.h"
#include "comm/compress/topk.h"
#include "common/error.h"
#include "common/flight_recorder.h"
#include "common/hmac_auth.h"
#include "common/sealed_file.h"
#include "fuzz/frame_seed.h"
#include "fuzz/ps_request_model.h"
#include "ps/config.h"
#include "ps/partition.h"
#include "ps/protocol.h"
#include "ps/shard.h"
#include "store/memory_store.h"
#include "store/tcp_store_protocol.h"
#include "train/checkpoint.h"
#include "train/reshard_checkpoint.h"
#include "train/shard_format.h"
#include "train/tensor_bundle.h"
#include "transport/frame.h"
#include "transport/shm/ring.h"

using namespace shoal;

namespace shoal::fuzz {
ps::Shard makeRestoreShard(const ps::Partition& p);
const ps::Partition& restorePartition();
std::shared_ptr<torch::nn::Module> makeCheckpointModel();
}  // namespace shoal::fuzz

namespace {

std::filesystem::path root;

void seed(const std::string& target, const std::string& name, std::string_view bytes) {
  const auto dir = root / target;
  std::filesystem::create_directories(dir);
  std::ofstream out(dir / name, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) SHOAL_THROW(InvalidArgument, "cannot write {}", (dir / name).string());
}

template <typename T>
std::string raw(const T& v) {
  return std::string(reinterpret_cast<const char*>(&v), sizeof(v));
}

std::string readAllOf(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string gzip(std::string_view bytes) {
  uLongf n = compressBound(bytes.size()) + 32;
  std::string out(n, '\0');
  z_stream z{};
  // windowBits 15 + 16: a gzip wrapper, as the .gz files have.
  deflateInit2(&z, 1, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY);
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(bytes.data()));
  z.avail_in = static_cast<uInt>(bytes.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  if (deflate(&z, Z_FINISH) != Z_STREAM_END) SHOAL_THROW(InvalidArgument, "deflate failed");
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

std::shared_ptr<comm::Group> soloGroup() {
  comm::GroupOptions o;
  o.transport = TransportKind::kTcp;
  o.timeout = seconds(30);
  o.secret = "fuzz-secret";
  return comm::Group::create(std::make_shared<store::MemoryStore>(), 0, 1, o);
}

void frames() {
  using namespace transport;
  const FrameHeader e = fuzz::expectedFrame();
  seed("frame", "expected", raw(e));
  FrameHeader other = e;
  other.op = static_cast<uint8_t>(OpCode{2});
  other.root = 2;
  other.seq = 6;
  seed("frame", "mismatch", raw(other));
  FrameHeader abort = e;
  const std::string text = "rank 3: stopped: timed out after 5 s in allreduce #5";
  abort.kind = static_cast<uint8_t>(FrameKind::kAbort);
  abort.abortKind = static_cast<uint8_t>(AbortKind::kTimeout);
  abort.bytes = text.size();
  seed("frame", "abort", raw(abort) + text);
  FrameHeader bye = e;
  bye.kind = static_cast<uint8_t>(FrameKind::kGoodbye);
  bye.bytes = 0;
  seed("frame", "goodbye", raw(bye));
}

void storeProtocol() {
  using namespace store::wire;
  seed("store_protocol", "set_get",
       std::string(1, char(7)) + encode(kSet, {"rank/0", "10.0.0.1:4242"}) +
           encode(kGet, {"rank/0"}));
  seed("store_protocol", "add_cas",
       std::string(1, char(0)) + encode(kAdd, {"counter", "3"}) +
           encode(kCompareSet, {"k", "", "v"}));
  seed("store_protocol", "wait_check_delete",
       std::string(1, char(96)) + encode(kWait, {"a", "b", "c"}) + encode(kCheck, {"a"}) +
           encode(kDelete, {"a"}));
  seed("store_protocol", "reply", std::string(1, char(2)) + encode(kOk, {"value"}));
}

// An input of store_requests: `bytes` sent by `client` in the chunks its control bytes allow
// (5k + 1 bytes, k < 16); `flags` (bit 2: read the replies first, bit 3: hang up first) go on
// the first chunk.
std::string fromClient(int client, std::string_view bytes, int flags = 0) {
  std::string out;
  for (size_t at = 0; at < bytes.size();) {
    const size_t k = std::min<size_t>((bytes.size() - at - 1) / 5, 15);
    out += static_cast<char>(client | flags | k << 4);
    out += bytes.substr(at, 5 * k + 1);
    at += 5 * k + 1;
    flags = 0;
  }
  return out;
}

// store_requests runs with 8-byte keys, 24-byte values, 96 bytes held and 2 parked requests.
void storeRequests() {
  using namespace store::wire;
  seed("store_requests", "set_get",
       fromClient(0, encode(kSet, {"rank/0", "10.0.0.1:4242"}) + encode(kGet, {"rank/0"})));
  seed("store_requests", "park_then_set",
       fromClient(1, encode(kGet, {"a"})) + fromClient(0, encode(kSet, {"a", "1"})) +
           fromClient(1, encode(kWait, {"a", "b"}), 4) + fromClient(2, encode(kSet, {"b", ""})));
  seed("store_requests", "counters",
       fromClient(0, encode(kAdd, {"n", "3"}) + encode(kAdd, {"n", "-5"}) +
                         encode(kAdd, {"n", "x"}) + encode(kCompareSet, {"n", "-2", "v"}) +
                         encode(kCheck, {"n", "m"}) + encode(kDelete, {"n"}) +
                         encode(kDelete, {"n"})));
  seed("store_requests", "limits",
       fromClient(0, encode(kSet, {"key-too-long", "v"}) +
                         encode(kSet, {"k", std::string(30, 'v')}) +
                         encode(kSet, {"k", std::string(80, 'v')}) + encode(kGet, {"k"})));
  std::string full;
  for (char k = 'a'; k < 'h'; ++k) full += encode(kSet, {std::string(1, k), std::string(20, k)});
  seed("store_requests", "full", fromClient(2, full + encode(kDelete, {"a"})));
  seed("store_requests", "parked_limit_and_hangup",
       fromClient(0, encode(kGet, {"x"})) + fromClient(1, encode(kWait, {"y"})) +
           fromClient(2, encode(kGet, {"z"})) + fromClient(1, encode(kSet, {"x", "1"}), 8) +
           fromClient(2, encode(kSet, {"y", "2"}), 4));
}

void authHandshake() {
  // The handshake of common/hmac_auth.h, made by its own functions. Nonces are fixed so the
  // corpus does not change each time it is written; the proofs are then wrong for the target's
  // own greeting, which the fuzzer cannot forge anyway.
  auto fixed = [](uint8_t* nonce, uint8_t fill) { std::memset(nonce, fill, auth::kNonceBytes); };
  auth::Greeting greeting = auth::makeGreeting(auth::GreetingStatus::kChallenge);
  fixed(greeting.nonce, 0x11);
  auth::Hello data =
      auth::makeHello("fuzz-secret", greeting, auth::Channel::kData, 0x5eed0001, 2, 0);
  fixed(data.nonce, 0x22);
  // The proof was made over makeHello's own random nonce: fixed too (wrong either way).
  std::memset(data.mac, 0x44, auth::kMacBytes);
  seed("auth", "acceptor_hello", std::string(1, '\x01') + raw(data));
  auth::Hello store = auth::makeHello("fuzz-secret", greeting, auth::Channel::kStore, 0, -1, -1);
  fixed(store.nonce, 0x22);
  std::memset(store.mac, 0x44, auth::kMacBytes);
  seed("auth", "store_server_hello", std::string(1, '\x03') + raw(store));
  // What a connector reads: the greeting, then (after sending its hello) the verdict.
  const auth::Verdict accepted = auth::refuse(auth::VerdictCode::kAccepted);
  seed("auth", "connector_accepted", std::string(1, '\x00') + raw(greeting) + raw(accepted));
  seed("auth", "connector_refused",
       std::string(1, '\x00') + raw(greeting) + raw(auth::refuse(auth::VerdictCode::kWrongSecret)));
  seed("auth", "store_client_accepted", std::string(1, '\x02') + raw(greeting) + raw(accepted));
  auth::Greeting busy = auth::makeGreeting(auth::GreetingStatus::kBusy);
  fixed(busy.nonce, 0x33);
  seed("auth", "store_client_busy", std::string(1, '\x02') + raw(busy));
}

void psProtocol() {
  using namespace ps;
  std::vector<KeySpec> keys{{"conv.weight", {8, 1, 3, 3}, DataType::kFloat32, KeyKind::kParameter},
                            {"conv.bias", {8}, DataType::kFloat32, KeyKind::kParameter},
                            {"bn.running_mean", {8}, DataType::kFloat32, KeyKind::kState}};
  Partition p(keys, 2);
  TrainingConfig sync;
  seed("ps_protocol", "sync_sgd", sync.toText() + "\n" + p.keysText());
  TrainingConfig ssp;
  ssp.mode = Mode::kSsp;
  ssp.staleness = 2;
  ssp.optimizer.kind = OptimizerKind::kAdam;
  ssp.linearScaling = true;
  ssp.warmupSteps = 10;
  ssp.totalSteps = 100;
  seed("ps_protocol", "ssp_adam", ssp.toText() + "\n" + p.keysText());
  TrainingConfig async;
  async.mode = Mode::kAsync;
  async.optimizer.kind = OptimizerKind::kRmsprop;
  seed("ps_protocol", "async_rmsprop", async.toText() + "\n" + p.keysText());
}

// ps_request: made in C++20 (fuzz/ps_request_seeds.cpp), as this file is C++17.
void psRequests() {
  for (const auto& [name, bytes] : fuzz::psRequestSeeds()) seed("ps_request", name, bytes);
}

// A flight file with its pid and wall-clock times replaced by fixed ones, in the same order, so
// that the seeds do not change each time they are written.
std::string fixedClocks(std::string file) {
  FlightHeader h;
  std::memcpy(&h, file.data(), sizeof(h));
  const int64_t opened = int64_t{1'800'000'000} * 1'000'000'000;
  h.pid = 4242;
  h.openedNs = opened;
  if (h.closedNs != 0) h.closedNs = opened + 1'000'000;
  std::memcpy(file.data(), &h, sizeof(h));
  for (size_t at = sizeof(h); at + sizeof(FlightEntry) <= file.size(); at += sizeof(FlightEntry)) {
    FlightEntry e;
    std::memcpy(&e, file.data() + at, sizeof(e));
    if (e.id == 0) continue;
    e.startNs = opened + static_cast<int64_t>(1000 * e.id);
    if (e.endNs != 0) e.endNs = e.startNs + 500;
    std::memcpy(file.data() + at, &e, sizeof(e));
  }
  return file;
}

void sealedAndShard() {
  const std::string dir = (std::filesystem::temp_directory_path() / "shoal-make-corpus").string();
  std::filesystem::create_directories(dir);
  writeSealedFile(dir + "/a", "a sealed payload");
  seed("sealed_file", "short", readAllOf(dir + "/a"));
  writeSealedFile(dir + "/b", "");
  seed("sealed_file", "empty", readAllOf(dir + "/b"));

  ps::Shard shard = fuzz::makeRestoreShard(fuzz::restorePartition());
  seed("shard_restore", "fresh", shard.snapshot("config-and-keys", 0, {0, 0}));
  for (int w = 0; w < 2; ++w) {
    std::fill(shard.slot(w), shard.slot(w) + shard.elements(), 0.5f + w);
    shard.applyNow(w, 0, shard.pieceCount(), 1);
  }
  const std::string trained = shard.snapshot("config-and-keys", 7, {3, 4});
  seed("shard_restore", "trained", trained);
  writeSealedFile(dir + "/c", trained);
  seed("sealed_file", "shard", readAllOf(dir + "/c"));

  {
    // A ring of two that wrapped: a completed, a failed and a running entry were noted.
    FlightRecorder r(dir + "/f", 2, 0, "host");
    r.end(r.begin({.group = "world", .op = "all_reduce", .seq = 0, .bytes = 4096}));
    r.end(r.begin({.group = "world/split0.1", .op = "broadcast", .seq = 0}), "PeerError: x");
    r.begin({.group = "world", .op = "barrier", .seq = 1});
  }
  seed("flight_file", "two_entries", fixedClocks(readAllOf(dir + "/f")));
  { FlightRecorder r(dir + "/g", 1, 3, "h"); }
  seed("flight_file", "empty_ring", fixedClocks(readAllOf(dir + "/g")));
  seed("flight_file", "short", "SHOALFR1");
  std::filesystem::remove_all(dir);
}

void checkpoint() {
  const std::string dir =
      (std::filesystem::temp_directory_path() / "shoal-make-corpus-ckpt").string();
  std::filesystem::remove_all(dir);
  auto group = soloGroup();
  torch::manual_seed(0);
  auto model = fuzz::makeCheckpointModel();
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-3));
  train::Checkpointer ck(dir, 2);
  // Before any step: no optimizer state; after one: Adam's moments.
  seed("checkpoint", "fresh", readSealedFile(ck.save(*group, *model, opt, {0, 0, 0})));
  for (auto& p : model->parameters()) p.mutable_grad() = torch::ones_like(p);
  opt.step();
  const std::string stepped = readSealedFile(ck.save(*group, *model, opt, {1, 2, 3}));
  seed("checkpoint", "stepped", stepped);
  // Two the loader must refuse after decoding: an RNG state libtorch rejects, and a moment of
  // another shape (the optimizer keeps its state).
  auto edited = [&](const std::function<void(train::TensorBundle&)>& edit) {
    train::TensorBundle b = train::decodeTensorBundle(stepped, "checkpoint", "seed");
    edit(b);
    return train::encodeTensorBundle("checkpoint", b);
  };
  seed("checkpoint", "rng-refused", edited([](train::TensorBundle& b) {
         for (auto& [name, t] : b) {
           if (name == "rng") t.zero_();
         }
       }));
  seed("checkpoint", "moment-misfit", edited([](train::TensorBundle& b) {
         for (auto& [name, t] : b) {
           if (name == "optimizer/0/exp_avg") t = torch::zeros({1});
         }
       }));
  std::filesystem::remove_all(dir);
}

void idx() {
  // Two 4x4 images and their labels.
  std::string images, labels;
  auto be = [](std::string& s, uint32_t v) {
    for (int i = 3; i >= 0; --i) s.push_back(char((v >> (8 * i)) & 0xff));
  };
  be(images, 0x803);
  be(images, 2);
  be(images, 4);
  be(images, 4);
  for (int i = 0; i < 32; ++i) images.push_back(char(i * 8));
  be(labels, 0x801);
  be(labels, 2);
  labels += std::string{char(3), char(9)};
  auto header = [](size_t split) {
    return std::string{char(0), char((split >> 8) & 0xff), char(split & 0xff)};
  };
  seed("idx", "plain", header(images.size()) + images + labels);
  const std::string gi = gzip(images), gl = gzip(labels);
  std::string h = header(gi.size());
  h[0] = 1;
  seed("idx", "gzip", h + gi + gl);
}

// shard_index: the mode byte, then a manifest's payload; or the mode byte, the manifest's length
// (2 bytes, big endian), the manifest and a rank file (shard_index_fuzz.cpp).
void shardIndex() {
  namespace sf = train::shard_format;
  const std::string dir =
      (std::filesystem::temp_directory_path() / "shoal-make-corpus-shards").string();
  std::filesystem::remove_all(dir);
  auto group = soloGroup();
  auto save = [&](const std::string& name, int64_t step, const std::vector<train::FlatPiece>& mine,
                  const std::map<std::string, std::string>& meta) {
    train::saveShards(*group, dir, step, mine, meta, 4);
    const std::string folder = sf::stepFolder(dir, step);
    const std::string manifest = readSealedFile(folder + "/manifest");
    const std::string file = readAllOf(folder + "/" + sf::rankFileName(0, 1));
    seed("shard_index", name + "-manifest", std::string(1, char(0)) + manifest);
    const std::string len{char((manifest.size() >> 8) & 0xff), char(manifest.size() & 0xff)};
    seed("shard_index", name + "-rank", std::string(1, char(1)) + len + manifest + file);
  };
  torch::manual_seed(0);
  save("one", 1, {{"param/w", {2, 3}, 0, torch::randn({6})}}, {{"optimizer", "sgd"}});
  save("mixed", 2,
       {{"param/w", {4}, 0, torch::randn({4})},
        {"param/h", {3}, 0, torch::randn({3}).to(torch::kBFloat16)},
        {"buffer/steps", {}, 0, torch::tensor({int64_t{7}})},
        {"param/empty", {0, 5}, 0, torch::empty({0})}},
       {{"optimizer", "adam"}, {"step", "2"}});
  // A world of two as saved by another run: only the manifest decodes alone.
  sf::Manifest m;
  m.step = 9;
  for (int r = 0; r < 2; ++r) {
    m.files.push_back({sf::rankFileName(r, 2), 4096, std::string(32, char(r))});
  }
  m.tensors.push_back({"param/w", "float32", {8, 2}});
  m.tensors.push_back({"zero/exp_avg/param/w", "float16", {16}});
  m.meta["optimizer"] = "adam";
  seed("shard_index", "world2-manifest", std::string(1, char(0)) + sf::encodeManifest(m));
  std::filesystem::remove_all(dir);
}

// codec: the mode byte, then a spec's text (mode 0); or the weight and a top-k message for n
// elements (mode 1, n in 2 bytes) or a 1-bit message (mode 2 + 3 * (8 * bit bytes - n))
// (compress/codec_fuzz.cpp).
void codec() {
  seed("codec", "spec-topk", std::string(1, char(0)) + "topk:0.01,warmup=50");
  seed("codec", "spec-powersgd", std::string(1, char(0)) + "powersgd:4");
  std::vector<float> grad(64), residual(64, 0.25f);
  for (size_t i = 0; i < grad.size(); ++i) {
    grad[i] = std::sin(static_cast<float>(i)) * static_cast<float>(i % 5);
  }
  const float weight = 0.5f;
  const size_t k = compress::topkCount(grad.size(), 0.0625);
  std::string topk(compress::topkMessageBytes(k), '\0');
  compress::topkEncode(grad.data(), residual.data(), grad.size(), k,
                       reinterpret_cast<uint8_t*>(topk.data()));
  seed("codec", "topk",
       std::string(1, char(1)) + raw(weight) + std::string{char(64), char(0)} + topk);
  const size_t n = 20;  // 3 bit bytes, 4 bits unused
  std::string sign(compress::signMessageBytes(n), '\0');
  compress::signEncode(grad.data(), residual.data(), n, reinterpret_cast<uint8_t*>(sign.data()));
  seed("codec", "onebit", std::string(1, char(2 + 3 * 4)) + raw(weight) + sign);
}

// Ring images (the read pattern byte, then the ring's memory) made by a RingWriter: one small
// message; a large one after most of a lap was read (its bytes wrap); three records, one read.
void shmRing() {
  using namespace transport::shm;
  constexpr size_t kCapacity = 4096;
  const auto image = [&](const std::string& name, uint8_t pattern,
                         const std::function<void(RingWriter&, RingReader&)>& fill) {
    LocalRingMemory memory(kCapacity);
    RingWriter writer(memory.data(), kCapacity);
    RingReader reader(memory.data(), kCapacity);
    fill(writer, reader);
    seed("shm_ring", name,
         std::string(1, static_cast<char>(pattern)) +
             std::string(reinterpret_cast<const char*>(memory.data()), ringBytes(kCapacity)));
  };
  std::string bytes(3000, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 7);
  const auto put = [&](RingWriter& w, size_t n) {
    iovec iov{bytes.data(), n};
    if (w.write(&iov, 1, n) != n) SHOAL_THROW(InvalidArgument, "shm_ring seed: ring full");
  };
  image("small", 0x55, [&](RingWriter& w, RingReader&) { put(w, 56); });
  image("wrapped", 0x0f, [&](RingWriter& w, RingReader& r) {
    std::string sink(bytes.size(), '\0');
    bool wake = false;
    put(w, 3000);
    r.read(sink.data(), 3000, wake);
    put(w, 2000);
  });
  image("three", 0xa3, [&](RingWriter& w, RingReader& r) {
    std::string sink(bytes.size(), '\0');
    bool wake = false;
    put(w, 48);
    put(w, 1000);
    put(w, 8);
    r.read(sink.data(), 48, wake);
  });
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_corpus <corpus dir>\n");
    return 2;
  }
  try {
    root = argv[1];
    frames();
    storeProtocol();
    storeRequests();
    authHandshake();
    psProtocol();
    psRequests();
    sealedAndShard();
    checkpoint();
    idx();
    shardIndex();
    codec();
    shmRing();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "make_corpus: %s\n", e.what());
    return 1;
  }
  std::printf("make_corpus: seeds written under %s\n", argv[1]);
  return 0;
}
