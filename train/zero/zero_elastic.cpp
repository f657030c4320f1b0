#include "train/zero/zero_elastic.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <map>
#include <set>
#include <vector>

#include "comm/collectives.h"
#include "common/byte_codec.h"
#include "common/error.h"
#include "common/log.h"
#include "train/state_shards.h"
#include "train/zero/elastic_part.h"

namespace shoal::train::zero {

// Note [Elastic shards]
// A ZeRO rank's optimizer state exists nowhere else, so a lost worker loses its shard unless a
// copy lives elsewhere: each commit sends it to the next rank of the view (a ring, so every rank
// sends and receives one shard). A worker dying one step ahead of another is why two commits
// are kept: the survivors may have committed steps s and s-1 (the dead rank's all-gather
// reached some of them), and the dead rank's copy of step s may never have left it, so the
// newest step the survivors can rebuild whole is s-1, which every rank still holds.
//
// After a change every rank sends all it holds to all, and every rank runs the same choice on
// the same bytes: the newest step whose pieces cover every element of every tensor. Pieces of
// one step from different holders are the same numbers (a shard and its copy, or one state cut
// two ways), so overlaps are harmless. Once the new view has chosen step m, steps after m are
// dropped on every rank (they belong to a history the job no longer follows), and a first commit
// in the new view gives each new shard its copy on the new next rank.

// Builds the view's ring groups: edge r joins rank r (rank 0 there) to rank r+1 (rank 1). The
// edges are made in two or three rounds of split() (even edges, odd edges, and for an odd size
// the edge that closes the ring), each rank in at most one edge per round.
void ElasticZero::Ring::build(comm::Group& group) {
  const int n = group.size(), r = group.rank();
  toNext.reset();
  fromPrev.reset();
  if (n <= 2) return;
  auto roundOf = [n](int edge) { return n % 2 == 1 && edge == n - 1 ? 2 : edge % 2; };
  const int prev = (r + n - 1) % n;
  for (int round = 0; round < 3; ++round) {
    int color = -1, key = 0;
    if (roundOf(r) == round) color = r, key = 0;
    if (roundOf(prev) == round) color = prev, key = 1;
    auto g = group.split(color, key);
    if (color == r) toNext = g;
    if (color == prev && color >= 0) fromPrev = g;
  }
}

// Sends `mine` to the next rank and returns the previous rank's, over two-rank groups of their
// own (ElasticZero::Ring): a collective there, unlike a point-to-point message, fails at once on
// both ends when either fails.
// A rank that fails here interrupts both of its ring groups, so that the neighbour waiting on
// the other one fails at once too, instead of at its deadline; and it waits for both transfers
// to end before their buffers go. A ring group's error names ranks of that pair, and one from an
// interrupt names the neighbour that interrupted, not the rank that died: so every rank then
// meets the others in a barrier of the view's group, whose failure names the rank that really
// failed (Note [Root cause] in comm/native/native_engine.cpp).
// Ranks whose transfers succeeded meet there too. A rank can finish both of its transfers while
// others fail: its send went into the socket's buffer before the next rank died, and its
// previous rank sent before its own failure. Were it to go on to the next step's collective on
// the view's group while the others wait in the barrier, the two would meet as a mismatch
// (barrier against all-reduce), which ends the job, instead of as a lost worker, which the
// elastic view change handles. So the barrier is on every path: one per commit.
std::string ElasticZero::passAlong(comm::Group& group, const std::string& mine) {
  if (group.size() == 2) {  // the next rank is the previous one: the group itself will do
    const int other = 1 - group.rank();
    std::string in;
    for (int root = 0; root < 2; ++root) {
      auto got = comm::broadcastBytes(group, root == group.rank() ? mine : std::string(), root,
                                      size_t{1} << 40);
      if (root == other) in = std::move(got);
    }
    return in;
  }
  int64_t outSize = static_cast<int64_t>(mine.size()), inSize = 0;
  std::string in;
  std::shared_ptr<comm::Work> out, got;
  std::exception_ptr failed;
  try {
    out = comm::broadcastAsync(*ring_.toNext, &outSize, 1, DataType::kInt64, 0);
    got = comm::broadcastAsync(*ring_.fromPrev, &inSize, 1, DataType::kInt64, 0);
    out->wait();
    got->wait();
    // Shards differ by padding and the step's header only; anything far off is not one.
    if (inSize < 0 || static_cast<uint64_t>(inSize) > 2 * mine.size() + (1u << 20)) {
      SHOAL_THROW(ProtocolError,
                  "elastic shard from the previous rank: {} bytes (this rank's is {})", inSize,
                  mine.size());
    }
    in.resize(static_cast<size_t>(inSize));
    out = comm::broadcastAsync(*ring_.toNext, const_cast<char*>(mine.data()), mine.size(),
                               DataType::kUInt8, 0);
    got = comm::broadcastAsync(*ring_.fromPrev, in.data(), in.size(), DataType::kUInt8, 0);
    out->wait();
    got->wait();
  } catch (const Error&) {
    failed = std::current_exception();
    ring_.toNext->interrupt();
    ring_.fromPrev->interrupt();
    for (auto& w : {out, got}) {
      try {
        if (w) w->wait();
      } catch (const Error&) {
      }
    }
  }
  comm::barrier(group);
  if (failed) std::rethrow_exception(failed);  // nobody died: the pair's own error
  return in;
}

namespace {

// The whole tensors of step `step` from every part of it, or nothing when some element of a
// tensor (or a tensor the module has) is in no piece.
struct Whole {
  std::map<std::string, torch::Tensor> tensors;
  int64_t optimizerStep = 0;
  ElasticProgress progress;
};
std::optional<Whole> assemble(const std::vector<ElasticPart>& parts, int64_t step,
                              const std::set<std::string>& required) {
  Whole w;
  std::map<std::string, std::vector<char>> covered;
  for (const auto& part : parts) {
    if (part.progress.step != step) continue;
    w.progress = part.progress;
    w.optimizerStep = std::max(w.optimizerStep, part.optimizerStep);
    for (const auto& piece : part.pieces) {
      const int64_t n = elasticElements(piece.shape);
      auto& t = w.tensors[piece.name];
      auto& mask = covered[piece.name];
      if (!t.defined()) {
        t = torch::zeros({n}, piece.data.options());
        mask.assign(static_cast<size_t>(n), 0);
      }
      if (t.numel() != n) {
        SHOAL_THROW(InvalidArgument,
                    "elastic state: '{}' has {} elements in one piece, {} in another", piece.name,
                    n, t.numel());
      }
      t.narrow(0, piece.offset, piece.data.numel()).copy_(piece.data);
      std::fill_n(mask.begin() + piece.offset, piece.data.numel(), 1);
    }
  }
  for (const auto& name : required) {
    if (!w.tensors.count(name)) return std::nullopt;
  }
  for (const auto& [name, mask] : covered) {
    if (std::find(mask.begin(), mask.end(), 0) != mask.end()) return std::nullopt;
  }
  return w;
}

const torch::nn::Module& required(const std::shared_ptr<torch::nn::Module>& module) {
  SHOAL_CHECK(module != nullptr, "ElasticZero needs a module");
  return *module;
}

}  // namespace

ElasticZero::ElasticZero(std::shared_ptr<torch::nn::Module> module, ZeroOptions options)
    : module_(std::move(module)),
      options_(std::move(options)),
      hookState_(options_.commHook, required(module_), BucketsBuilt::kBeforeRestore) {
  if (options_.stage != 1 && options_.stage != 2) {
    SHOAL_THROW(InvalidArgument,
                "ElasticZero: stage {} is not elastic (stages 1 and 2 are: stage 3's parameters "
                "live only in the shards)",
                options_.stage);
  }
}

ElasticZero::~ElasticZero() = default;

ZeroDataParallel& ElasticZero::zero() {
  if (!zero_) {
    SHOAL_THROW(InvalidArgument,
                "ElasticZero::zero(): no view yet (call it inside ElasticState::run's function)");
  }
  return *zero_;
}

void ElasticZero::commit(comm::Group& group, const ElasticProgress& progress) {
  int64_t optimizerStep = 0;
  const auto pieces = zero().statePieces(optimizerStep);
  Held now{progress, encodeElasticPart(progress, optimizerStep, pieces), {}};
  if (group.size() > 1) now.kept = passAlong(group, now.own);
  previous_ = std::move(current_);
  current_ = std::move(now);
  hookState_.take(progress.step);
}

void ElasticZero::leave() {
  zero_.reset();  // they hold the failed view's group
  ring_ = Ring{};
}

void ElasticZero::enter(comm::Group& group, const comm::View& view) {
  const bool fresh = std::all_of(view.members.begin(), view.members.end(),
                                 [](const comm::View::Member& m) { return m.committed < 0; });
  zero_.reset();
  zero_ = std::make_unique<ZeroDataParallel>(module_, group.shared_from_this(), options_);
  ring_.build(group);
  if (fresh) {
    commit(group, ElasticProgress{});
    return;
  }
  recover(group);
}

void ElasticZero::recover(comm::Group& group) {
  // Everything every rank holds, to everyone (a joiner sends nothing).
  std::string mine;
  for (const Held* h : {&current_, &previous_}) {
    for (const std::string* s : {&h->own, &h->kept}) {
      if (!s->empty()) putBytes(mine, s->data(), s->size());
    }
  }
  std::vector<ElasticPart> parts;
  std::set<int64_t> steps;
  for (int r = 0; r < group.size(); ++r) {
    const std::string bytes =
        comm::broadcastBytes(group, r == group.rank() ? mine : std::string(), r, size_t{1} << 40);
    ByteReader reader(bytes, fmt::format("elastic shards from rank {}", r));
    while (!reader.atEnd()) {
      parts.push_back(decodeElasticPart(reader.bytes(), reader.source()));
      steps.insert(parts.back().progress.step);
    }
  }
  std::set<std::string> required;
  for (auto& item : module_->named_parameters(/*recurse=*/true)) {
    if (item.value().requires_grad()) required.insert(shards::paramKey(item.key()));
  }
  for (auto& item : module_->named_buffers(/*recurse=*/true))
    required.insert(shards::bufferKey(item.key()));
  std::optional<Whole> whole;
  for (auto it = steps.rbegin(); it != steps.rend() && !whole; ++it) {
    whole = assemble(parts, *it, required);
  }
  parts.clear();
  if (!whole) {
    SHOAL_THROW(InvalidArgument,
                "elastic ZeRO: the survivors do not hold every shard of any step they committed "
                "(two neighbouring ranks failed together?); resume from a sharded checkpoint");
  }
  zero_->loadState(whole->tensors, whole->optimizerStep);
  const ElasticProgress progress = whole->progress;
  whole.reset();
  // Steps after the chosen one are another history now (Note [Elastic shards]).
  if (current_.progress.step > progress.step) current_ = std::exchange(previous_, Held{});
  if (previous_.progress.step > progress.step) previous_ = Held{};
  hookState_.restore(group, progress.step);
  SHOAL_LOG_INFO("elastic ZeRO: rank {} of {} continues from step {} with its new shard",
                 group.rank(), group.size(), progress.step);
  commit(group, progress);
}

void ElasticZero::scaleLr(double factor) {
  zero().setLearningRate(options_.optimizer.lr * factor);
}

std::string ElasticZero::encode() const {
  SHOAL_THROW(InvalidArgument, "ElasticZero: a sharded state has no one-file form");
}

void ElasticZero::decode(const std::string&, const std::string& what) {
  SHOAL_THROW(InvalidArgument, "{}: ElasticZero loads sharded checkpoints only", what);
}

}  // namespace shoal::train::zero
