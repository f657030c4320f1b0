// A collective's time split in the timeline (issue 16, Note [Operation spans] in
// comm/group.cpp): a 2-rank `shoal run --trace` job in which rank 1 enters an all-reduce, and
// rank 0 a broadcast it roots, kLateMs late. The punctual side's span must show the delay as
// wait_us, the late side's must not, the root that receives nothing has no split, and every
// split adds up to its span.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "tests/process_util.h"
#include "tests/trace_util.h"

namespace shoal::test {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;

constexpr int kRanks = 2;
constexpr int kLateMs = 300;
// Half the delay, on either side: a punctual rank's wait is the delay less the skew of the ranks'
// exits from the barrier before it, a late rank's is how long it takes to read a message that
// is already there; a loaded machine moves each by milliseconds, not by half of kLateMs.
constexpr double kHalfLateUs = kLateMs * 1e3 / 2;

const json* arg(const json& span, const char* key) {
  const json& args = span.at("args");
  const auto it = args.find(key);
  return it == args.end() ? nullptr : &*it;
}

double argUs(const json& span, const char* key) {
  const json* a = arg(span, key);
  if (a == nullptr) {
    ADD_FAILURE() << "no " << key << " in " << span.dump();
    return -1;
  }
  return a->get<double>();
}

// The one world collective named `name` on `rank`.
const json& only(const Merged& m, int rank, const std::string& name) {
  const json* found = nullptr;
  int count = 0;
  for (const json& e : m.spans.at(rank)) {
    if (e.at("cat") == "comm" && e.at("name") == name && e.at("args").at("group_size") == kRanks) {
      found = &e;
      ++count;
    }
  }
  EXPECT_EQ(count, 1) << name << " on rank " << rank;
  if (found == nullptr) throw std::runtime_error(fmt::format("no {} on rank {}", name, rank));
  return *found;
}

// Every comm span has both parts of the split or neither, neither negative, adding up to the
// span's duration within 0.002 us (the file's microseconds keep 3 decimals) plus `relative` of
// it. Returns how many spans are split.
int expectSplitsAddUp(const Merged& m, double relative) {
  int split = 0;
  for (const auto& [rank, spans] : m.spans) {
    for (const json& e : spans) {
      if (e.at("cat") != "comm") continue;
      const json* wait = arg(e, "wait_us");
      const json* transfer = arg(e, "transfer_us");
      EXPECT_EQ(wait == nullptr, transfer == nullptr) << e.dump();
      if (wait == nullptr || transfer == nullptr) continue;
      ++split;
      const double dur = e.at("dur").get<double>();
      EXPECT_GE(wait->get<double>(), 0) << e.dump();
      EXPECT_GE(transfer->get<double>(), 0) << e.dump();
      EXPECT_NEAR(wait->get<double>() + transfer->get<double>(), dur, 0.002 + relative * dur)
          << "rank " << rank << ": " << e.dump();
    }
  }
  return split;
}

TEST(Timeline, ASpanSplitsWaitingForALatePeerFromMovingData) {
  TempDir dir;
  const std::string out = dir.path + "/job.json";
  const auto r = shoalRun(SHOAL_BIN,
                          {"-n", std::to_string(kRanks), "--timeout", "60", "--trace", out, "--",
                           SHOAL_TRACE_WORKER, "late", std::to_string(kLateMs)},
                          dir, 120s);
  ASSERT_EQ(r.code, 0) << r.output;
  const Merged m = readMerged(out);
  ASSERT_EQ(m.spans.size(), static_cast<size_t>(kRanks)) << r.output;

  // Rank 1 entered the all-reduce late: rank 0 waited for its message, and then little was left
  // to do; rank 1 found rank 0's message there at once.
  const json& punctual = only(m, 0, "allreduce");
  const json& late = only(m, 1, "allreduce");
  EXPECT_GE(argUs(punctual, "wait_us"), kHalfLateUs) << punctual.dump();
  EXPECT_LT(argUs(punctual, "transfer_us"), kHalfLateUs) << punctual.dump();
  EXPECT_LT(argUs(late, "wait_us"), kHalfLateUs) << late.dump();

  // The broadcast's root entered late: rank 1 waited for it. The root receives nothing, so
  // nothing tells its waiting from its sending: its span has no split.
  const json& receiver = only(m, 1, "broadcast");
  EXPECT_GE(argUs(receiver, "wait_us"), kHalfLateUs) << receiver.dump();
  const json& root = only(m, 0, "broadcast");
  EXPECT_EQ(arg(root, "wait_us"), nullptr) << root.dump();
  EXPECT_EQ(arg(root, "transfer_us"), nullptr) << root.dump();

  // Each rank's own file holds its spans as recorded: the parts add up to the duration exactly.
  for (int rank = 0; rank < kRanks; ++rank) {
    const Merged own = readMerged(fmt::format("{}.ranks/trace.rank{}.json", out, rank));
    // Three barriers and the all-reduce at least.
    EXPECT_GE(expectSplitsAddUp(own, 0), 4) << "rank " << rank;
  }
  // The merge maps a span's end through the drift between a rank's clock measurements (Note
  // [Aligning a rank's times] in run/trace_merge.cpp), which stretches its duration but not its
  // arguments: by at most the two measurements' error bounds over the time between them, here
  // more than the two delays (0.5 s is taken).
  const double errorUs = m.doc.at("otherData").at("alignment_error_us").get<double>();
  EXPECT_GE(expectSplitsAddUp(m, 2 * errorUs / 0.5e6), 2 * 4 + 1);
}

}  // namespace
}  // namespace shoal::test
