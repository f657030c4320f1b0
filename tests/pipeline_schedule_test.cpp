// Pipeline schedules as data: exact lists for small cases, every generator's lists through the
// checker over a range of shapes, the checker's refusals of broken lists, activation memory, and
// the cost model's bubble against the closed forms.
#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "common/error.h"
#include "train/pipeline/schedule.h"

namespace shoal::train::pipeline {
namespace {

// Compact list notation for the exact cases: "F0" Forward(mb 0, chunk 0), "RA1c1"
// RecvActivation(mb 1, chunk 1); kinds F B SA RA SG RG.
std::vector<Action> parse(const std::string& text) {
  std::vector<Action> out;
  std::istringstream in(text);
  for (std::string tok; in >> tok;) {
    const size_t digit = tok.find_first_of("-0123456789");
    const std::string kind = tok.substr(0, digit);
    Action a;
    if (kind == "F")
      a.kind = ActionKind::kForward;
    else if (kind == "B")
      a.kind = ActionKind::kBackward;
    else if (kind == "SA")
      a.kind = ActionKind::kSendActivation;
    else if (kind == "RA")
      a.kind = ActionKind::kRecvActivation;
    else if (kind == "SG")
      a.kind = ActionKind::kSendGradient;
    else if (kind == "RG")
      a.kind = ActionKind::kRecvGradient;
    else
      ADD_FAILURE() << "bad token " << tok;
    const size_t c = tok.find('c');
    a.microBatch = std::stoi(tok.substr(digit, c == std::string::npos ? c : c - digit));
    a.chunk = c == std::string::npos ? 0 : std::stoi(tok.substr(c + 1));
    out.push_back(a);
  }
  return out;
}

std::string show(const std::vector<Action>& list) {
  std::string out;
  for (const Action& a : list) out += describe(a) + " ";
  return out;
}

Schedule handMade(int stages, int microBatches, std::vector<std::string> lists) {
  Schedule s{.name = "hand", .stages = stages, .microBatches = microBatches, .chunks = 1};
  for (const auto& l : lists) s.ranks.push_back(parse(l));
  return s;
}

// check()'s message for a schedule it must refuse ("" if it accepts it).
std::string refusal(const Schedule& s) {
  try {
    check(s);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_REFUSED(schedule, ...)                                             \
  do {                                                                            \
    const std::string msg_ = refusal(schedule);                                   \
    ASSERT_FALSE(msg_.empty()) << "check() accepted a broken schedule";           \
    EXPECT_EQ(msg_.find('\n'), std::string::npos) << msg_;                        \
    for (const char* part_ : {__VA_ARGS__}) {                                     \
      EXPECT_NE(msg_.find(part_), std::string::npos) << part_ << " in: " << msg_; \
    }                                                                             \
  } while (0)

TEST(PipelineSchedule, DescribeAndKindName) {
  EXPECT_EQ(describe({ActionKind::kForward, 3, 1}), "Forward(mb 3, chunk 1)");
  EXPECT_EQ(describe({ActionKind::kRecvGradient, 0, 0}), "RecvGradient(mb 0, chunk 0)");
  EXPECT_EQ(kindName(ActionKind::kSendActivation), "SendActivation");
}

TEST(PipelineSchedule, PeerAndBoundary) {
  Schedule s{.name = "x", .stages = 3, .microBatches = 1, .chunks = 2};
  // Rank 2 chunk 0 is virtual stage 2; its activation goes to stage 3 = rank 0 chunk 1.
  EXPECT_EQ(s.peer(2, {ActionKind::kSendActivation, 0, 0}), 0);
  EXPECT_EQ(s.boundary(2, {ActionKind::kSendActivation, 0, 0}), 2);
  EXPECT_EQ(s.peer(0, {ActionKind::kRecvActivation, 0, 1}), 2);
  EXPECT_EQ(s.boundary(0, {ActionKind::kRecvActivation, 0, 1}), 2);
  EXPECT_EQ(s.peer(0, {ActionKind::kSendGradient, 0, 1}), 2);
  EXPECT_EQ(s.boundary(0, {ActionKind::kSendGradient, 0, 1}), 2);
  EXPECT_EQ(s.peer(1, {ActionKind::kRecvGradient, 0, 0}), 2);
  EXPECT_EQ(s.boundary(1, {ActionKind::kRecvGradient, 0, 0}), 1);
  EXPECT_THROW(s.peer(0, {ActionKind::kForward, 0, 0}), InvalidArgument);
  EXPECT_THROW(s.peer(2, {ActionKind::kSendActivation, 0, 1}), InvalidArgument);  // last stage
  EXPECT_THROW(s.boundary(0, {ActionKind::kRecvActivation, 0, 0}), InvalidArgument);
}

TEST(PipelineSchedule, MakeScheduleByName) {
  EXPECT_EQ(makeSchedule("gpipe", 3, 4).ranks, gpipe(3, 4).ranks);
  EXPECT_EQ(makeSchedule("1f1b", 3, 4).ranks, oneForwardOneBackward(3, 4).ranks);
  EXPECT_EQ(makeSchedule("interleaved", 3, 4, 2).ranks,
            interleavedOneForwardOneBackward(3, 4, 2).ranks);
  EXPECT_EQ(makeSchedule("interleaved", 3, 4, 2).chunks, 2);
  try {
    makeSchedule("zero-bubble", 2, 2);
    ADD_FAILURE() << "unknown name accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("zero-bubble"), std::string::npos) << e.what();
  }
  EXPECT_THROW(makeSchedule("gpipe", 0, 2), InvalidArgument);
  EXPECT_THROW(makeSchedule("1f1b", 2, 0), InvalidArgument);
  EXPECT_THROW(makeSchedule("interleaved", 2, 2, 0), InvalidArgument);
  EXPECT_THROW(gpipe(-1, 1), InvalidArgument);
}

TEST(PipelineSchedule, GPipeExactLists) {
  const Schedule s = gpipe(2, 2);
  EXPECT_EQ(s.ranks[0], parse("F0 SA0 F1 SA1 RG0 B0 RG1 B1")) << show(s.ranks[0]);
  EXPECT_EQ(s.ranks[1], parse("RA0 F0 RA1 F1 B0 SG0 B1 SG1")) << show(s.ranks[1]);
}

TEST(PipelineSchedule, OneForwardOneBackwardExactLists) {
  const Schedule s = oneForwardOneBackward(2, 3);
  EXPECT_EQ(s.ranks[0], parse("F0 SA0 F1 SA1 RG0 B0 F2 SA2 RG1 B1 RG2 B2")) << show(s.ranks[0]);
  EXPECT_EQ(s.ranks[1], parse("RA0 F0 B0 SG0 RA1 F1 B1 SG1 RA2 F2 B2 SG2")) << show(s.ranks[1]);

  const Schedule t = oneForwardOneBackward(3, 2);  // m < p: rank 0 warms up with all of m
  EXPECT_EQ(t.ranks[0], parse("F0 SA0 F1 SA1 RG0 B0 RG1 B1")) << show(t.ranks[0]);
  EXPECT_EQ(t.ranks[1], parse("RA0 F0 SA0 RA1 F1 SA1 RG0 B0 SG0 RG1 B1 SG1")) << show(t.ranks[1]);
  EXPECT_EQ(t.ranks[2], parse("RA0 F0 B0 SG0 RA1 F1 B1 SG1")) << show(t.ranks[2]);
}

TEST(PipelineSchedule, InterleavedExactLists) {
  // p = 2, m = 2, v = 2: one group {0, 1}; rank 0's warm-up 1*2 + 2 covers all 4 forwards.
  const Schedule s = interleavedOneForwardOneBackward(2, 2, 2);
  EXPECT_EQ(s.chunks, 2);
  EXPECT_EQ(s.ranks[0], parse("F0c0 SA0c0 F1c0 SA1c0 RA0c1 F0c1 SA0c1 RA1c1 F1c1 SA1c1 "
                              "RG0c1 B0c1 SG0c1 RG1c1 B1c1 SG1c1 RG0c0 B0c0 RG1c0 B1c0"))
      << show(s.ranks[0]);
  EXPECT_EQ(s.ranks[1], parse("RA0c0 F0c0 SA0c0 RA1c0 F1c0 SA1c0 RA0c1 F0c1 B0c1 SG0c1 "
                              "RA1c1 F1c1 B1c1 SG1c1 RG0c0 B0c0 SG0c0 RG1c0 B1c0 SG1c0"))
      << show(s.ranks[1]);
}

TEST(PipelineSchedule, InterleavedGroupsTakeTheRemainderFirst) {
  // p = 2, m = 5, v = 2: groups {0,1,2} and {3,4}. Last rank (warm-up 1*3): forwards 0..2 of
  // chunk 0, then 1F1B starting with chunk 1's forward of micro-batch 0.
  const Schedule s = interleavedOneForwardOneBackward(2, 5, 2);
  std::vector<Action> computes;
  for (const Action& a : s.ranks[1]) {
    if (a.kind == ActionKind::kForward || a.kind == ActionKind::kBackward) computes.push_back(a);
  }
  EXPECT_EQ(computes, parse("F0c0 F1c0 F2c0 F0c1 B0c1 F1c1 B1c1 F2c1 B2c1 F3c0 B0c0 F4c0 B1c0 "
                            "F3c1 B2c0 F4c1 B3c1 B4c1 B3c0 B4c0"))
      << show(computes);
}

TEST(PipelineSchedule, OneStageHasNoTransfers) {
  for (const Schedule& s :
       {gpipe(1, 3), oneForwardOneBackward(1, 3), interleavedOneForwardOneBackward(1, 3, 4)}) {
    EXPECT_EQ(s.chunks, 1) << s.name;
    for (const Action& a : s.ranks[0]) {
      EXPECT_TRUE(a.kind == ActionKind::kForward || a.kind == ActionKind::kBackward)
          << s.name << ": " << describe(a);
    }
    EXPECT_NO_THROW(check(s));
  }
  EXPECT_EQ(oneForwardOneBackward(1, 2).ranks[0], parse("F0 B0 F1 B1"));
  EXPECT_EQ(interleavedOneForwardOneBackward(1, 2, 3).ranks[0], parse("F0 B0 F1 B1"));
  EXPECT_EQ(interleavedOneForwardOneBackward(3, 4, 1).ranks, oneForwardOneBackward(3, 4).ranks);
}

TEST(PipelineSchedule, EveryGeneratedScheduleChecks) {
  int checked = 0;
  for (int p = 1; p <= 8; ++p) {
    for (int m = 1; m <= 3 * p + 1; ++m) {
      std::vector<Schedule> all = {gpipe(p, m), oneForwardOneBackward(p, m)};
      for (int v = 1; v <= 4; ++v) all.push_back(interleavedOneForwardOneBackward(p, m, v));
      for (const Schedule& s : all) {
        ASSERT_EQ(static_cast<int>(s.ranks.size()), p);
        ASSERT_EQ(s.stages, p);
        ASSERT_EQ(s.microBatches, m);
        ASSERT_NO_THROW(check(s)) << s.name << " p " << p << " m " << m << " v " << s.chunks << ": "
                                  << refusal(s);
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 6 * (8 * 9 / 2 * 3 + 8));
}

TEST(PipelineSchedule, PeakInFlight) {
  for (int p = 1; p <= 8; ++p) {
    for (int m = 1; m <= 3 * p + 1; ++m) {
      const Schedule g = gpipe(p, m), f = oneForwardOneBackward(p, m);
      for (int r = 0; r < p; ++r) {
        EXPECT_EQ(peakInFlight(g, r), m);
        EXPECT_EQ(peakInFlight(f, r), std::min(p - r, m)) << "p " << p << " m " << m;
        EXPECT_LE(peakInFlight(f, r), p);
      }
      for (int v = 2; v <= 4 && p > 1; ++v) {
        const Schedule s = interleavedOneForwardOneBackward(p, m, v);
        const int firstGroup = m < 2 * p ? m : p + m % p;
        for (int r = 0; r < p; ++r) {
          EXPECT_EQ(peakInFlight(s, r), std::min(v * m, (v - 1) * firstGroup + 2 * (p - r - 1) + 1))
              << "p " << p << " m " << m << " v " << v << " rank " << r;
        }
      }
    }
  }
  EXPECT_THROW(peakInFlight(gpipe(2, 2), 2), InvalidArgument);
}

TEST(PipelineScheduleCheck, RefusesWrongListCount) {
  Schedule s = gpipe(3, 2);
  s.ranks.pop_back();
  EXPECT_REFUSED(s, "2 rank lists for 3 stages");
}

TEST(PipelineScheduleCheck, RefusesMissingReceive) {
  // Rank 1 lost its RecvActivation(mb 0): its forward has no input.
  EXPECT_REFUSED(handMade(2, 2, {"F0 SA0 F1 SA1 RG0 B0 RG1 B1", "F0 RA1 F1 B0 SG0 B1 SG1"}),
                 "rank 1 action 0 Forward(mb 0, chunk 0): runs before its input",
                 "RecvActivation(mb 0, chunk 0)");
  // Rank 0 lost its RecvGradient(mb 1): the backward has no gradient to start from.
  EXPECT_REFUSED(handMade(2, 2, {"F0 SA0 F1 SA1 RG0 B0 B1", "RA0 F0 RA1 F1 B0 SG0 B1 SG1"}),
                 "rank 0 action 6 Backward(mb 1, chunk 0): runs before its input",
                 "RecvGradient(mb 1, chunk 0)");
}

TEST(PipelineScheduleCheck, RefusesMissingSend) {
  // Rank 0 never sends its activation: rank 1 waits for it while rank 0 waits for a gradient.
  EXPECT_REFUSED(handMade(2, 1, {"F0 RG0 B0", "RA0 F0 B0 SG0"}),
                 "rank 0 action 1 RecvGradient(mb 0, chunk 0): deadlock: waits on rank 1 action 0 "
                 "RecvActivation(mb 0, chunk 0), which waits on rank 0");
  // Rank 1 never sends the gradient and ends: rank 0 waits forever.
  EXPECT_REFUSED(handMade(2, 1, {"F0 SA0 RG0 B0", "RA0 F0 B0"}),
                 "rank 0 action 2 RecvGradient(mb 0, chunk 0): never matched: rank 1 ended its "
                 "list");
  // The same through a chain: rank 0 waits on rank 1, which waits on rank 2, which ended.
  EXPECT_REFUSED(handMade(3, 1, {"F0 SA0 RG0 B0", "RA0 F0 SA0 RG0 B0 SG0", "RA0 F0 B0"}),
                 "rank 1 action 3 RecvGradient(mb 0, chunk 0): never matched: rank 2 ended",
                 "rank 0 waits behind it");
}

TEST(PipelineScheduleCheck, RefusesCycle) {
  // Both ranks receive first.
  EXPECT_REFUSED(handMade(2, 1, {"RG0 F0 SA0 B0", "RA0 F0 B0 SG0"}),
                 "rank 0 action 0 RecvGradient(mb 0, chunk 0): deadlock: waits on rank 1 action 0 "
                 "RecvActivation(mb 0, chunk 0), which waits on rank 0");
  // Three ranks: the cycle is reported from its lowest rank.
  Schedule s = oneForwardOneBackward(3, 1);
  std::swap(s.ranks[1][0], s.ranks[1][3]);  // rank 1 waits for a gradient before its forward
  EXPECT_REFUSED(s, "deadlock", "rank 1 action 0 RecvGradient(mb 0, chunk 0)",
                 "which waits on rank 1");
}

TEST(PipelineScheduleCheck, RefusesComputeBeforeInput) {
  EXPECT_REFUSED(handMade(1, 1, {"B0 F0"}),
                 "rank 0 action 0 Backward(mb 0, chunk 0): runs before its input: no earlier "
                 "Forward(mb 0, chunk 0)");
  EXPECT_REFUSED(handMade(2, 1, {"SA0 F0 RG0 B0", "RA0 F0 B0 SG0"}),
                 "rank 0 action 0 SendActivation(mb 0, chunk 0): runs before its input");
  EXPECT_REFUSED(handMade(2, 1, {"F0 SA0 RG0 B0", "RA0 F0 SG0 B0"}),
                 "rank 1 action 2 SendGradient(mb 0, chunk 0): runs before its input");
}

TEST(PipelineScheduleCheck, RefusesDuplicates) {
  EXPECT_REFUSED(handMade(1, 2, {"F0 F0 B0 B1"}),
                 "rank 0 action 1 Forward(mb 0, chunk 0): runs twice on virtual stage 0");
  EXPECT_REFUSED(handMade(1, 1, {"F0 B0 B0"}),
                 "rank 0 action 2 Backward(mb 0, chunk 0): runs twice");
  EXPECT_REFUSED(handMade(2, 1, {"F0 SA0 SA0 RG0 B0", "RA0 F0 B0 SG0"}),
                 "rank 0 action 2 SendActivation(mb 0, chunk 0): sent twice");
}

TEST(PipelineScheduleCheck, RefusesNeverComputed) {
  EXPECT_REFUSED(handMade(1, 2, {"F0 B0"}), "rank 0: Forward(mb 1, chunk 0) never runs");
  EXPECT_REFUSED(handMade(1, 2, {"F0 F1 B0"}), "rank 0: Backward(mb 1, chunk 0) never runs");
}

TEST(PipelineScheduleCheck, RefusesMismatchedMicroBatch) {
  // Rank 1 receives micro-batch 1 first, but rank 0 sent micro-batch 0 first.
  EXPECT_REFUSED(
      handMade(2, 2, {"F0 SA0 F1 SA1 RG0 B0 RG1 B1", "RA1 F1 RA0 F0 B0 SG0 B1 SG1"}),
      "rank 1 action 0 RecvActivation(mb 1, chunk 0): its matching send, rank 0 action 1 "
      "SendActivation(mb 0, chunk 0), carries micro-batch 0");
}

TEST(PipelineScheduleCheck, RefusesUnreceivedSend) {
  // Rank 1 dropped micro-batch 1 entirely (and rank 0 its backward): rank 0's send of it stays.
  EXPECT_REFUSED(handMade(2, 2, {"F0 SA0 F1 SA1 RG0 B0", "RA0 F0 B0 SG0"}),
                 "rank 0 action 3 SendActivation(mb 1, chunk 0): nobody receives it");
}

TEST(PipelineScheduleCheck, RefusesOutOfRange) {
  EXPECT_REFUSED(handMade(1, 1, {"F0 B0 F1"}),
                 "rank 0 action 2 Forward(mb 1, chunk 0): micro-batch out of range 0..0");
  EXPECT_REFUSED(handMade(1, 1, {"F0c1 B0"}),
                 "rank 0 action 0 Forward(mb 0, chunk 1): chunk out of range 0..0");
  EXPECT_REFUSED(handMade(1, 1, {"F0 B0 F-1"}), "micro-batch out of range");
  EXPECT_REFUSED(handMade(2, 1, {"F0 SA0 RG0 B0", "RA0 F0 SA0 B0 SG0"}),
                 "rank 1 action 2 SendActivation(mb 0, chunk 0): the last virtual stage sends no "
                 "activation");
  EXPECT_REFUSED(handMade(2, 1, {"RA0 F0 SA0 RG0 B0", "RA0 F0 B0 SG0"}),
                 "virtual stage 0 receives no activation");
  Schedule bad = handMade(1, 1, {"F0 B0"});
  bad.microBatches = 0;
  EXPECT_REFUSED(bad, "need >= 1");
}

TEST(PipelineScheduleCheck, AcceptsInterleavedSelfTransfers) {
  // One rank holding two chunks passes activations to itself; the semantics allow it.
  Schedule s{.name = "self", .stages = 1, .microBatches = 1, .chunks = 2};
  s.ranks.push_back(parse("F0c0 SA0c0 RA0c1 F0c1 B0c1 SG0c1 RG0c0 B0c0"));
  EXPECT_NO_THROW(check(s)) << refusal(s);
  s.ranks[0] = parse("F0c0 RA0c1 SA0c0 F0c1 B0c1 SG0c1 RG0c0 B0c0");
  EXPECT_REFUSED(s, "rank 0 action 1 RecvActivation(mb 0, chunk 1): deadlock: waits on rank 0");
}

double gpipeBubble(int p, int m) {
  return double(p - 1) / (m + p - 1);
}

// The interleaved bubble (interleaved.cpp): (p-1)/(vm+p-1) for m >= p; for m < p the ring
// cannot be filled.
double interleavedBubble(int p, int m, int v) {
  if (m >= p) return double(p - 1) / (v * m + p - 1);
  return double(v * (p - m) + m - 1) / (v * p + m - 1);
}

TEST(PipelineBubble, GPipeAndOneForwardOneBackwardMatchTheFormula) {
  for (auto [f, b] : {std::pair{1.0, 1.0}, std::pair{1.0, 2.0}, std::pair{3.0, 1.0}}) {
    for (int p = 1; p <= 8; ++p) {
      for (int m = 1; m <= 3 * p + 1; ++m) {
        for (const Schedule& s : {gpipe(p, m), oneForwardOneBackward(p, m)}) {
          const std::vector<double> idle = simulatedBubble(s, f, b);
          ASSERT_EQ(static_cast<int>(idle.size()), p);
          for (double x : idle) {
            EXPECT_NEAR(x, gpipeBubble(p, m), 1e-9) << s.name << " p " << p << " m " << m;
          }
        }
      }
    }
  }
}

TEST(PipelineBubble, InterleavedMatchesTheFormula) {
  for (auto [f, b] : {std::pair{1.0, 1.0}, std::pair{1.0, 2.0}}) {
    for (int p = 2; p <= 8; ++p) {
      for (int m = 1; m <= 3 * p + 1; ++m) {
        for (int v = 1; v <= 4; ++v) {
          const std::vector<double> idle =
              simulatedBubble(interleavedOneForwardOneBackward(p, m, v), f, b);
          const double want = v == 1 ? gpipeBubble(p, m) : interleavedBubble(p, m, v);
          if (m % p == 0) {
            EXPECT_NEAR(want, double(p - 1) / (v * m + p - 1), 1e-12);
          }
          for (double x : idle) {
            EXPECT_NEAR(x, want, 1e-9) << "p " << p << " m " << m << " v " << v;
          }
        }
      }
    }
  }
  EXPECT_NEAR(simulatedBubble(interleavedOneForwardOneBackward(2, 8, 2), 1, 2)[0], 1.0 / 17, 1e-9);
  EXPECT_NEAR(simulatedBubble(interleavedOneForwardOneBackward(4, 9, 2), 1, 2)[0], 3.0 / 21, 1e-9);
}

TEST(PipelineBubble, TransferCostAndArguments) {
  // Slow transfers only add idle time; one stage has none to wait for.
  const Schedule s = interleavedOneForwardOneBackward(4, 8, 2);
  EXPECT_GT(simulatedBubble(s, 1, 2, 0.5)[0], simulatedBubble(s, 1, 2)[0]);
  EXPECT_NEAR(simulatedBubble(oneForwardOneBackward(1, 4), 1, 2, 5)[0], 0.0, 1e-12);
  EXPECT_THROW(simulatedBubble(s, -1, 2), InvalidArgument);
  EXPECT_THROW(simulatedBubble(s, 0, 0), InvalidArgument);
  Schedule broken = s;
  broken.ranks[1].pop_back();
  EXPECT_THROW(simulatedBubble(broken, 1, 2), InvalidArgument);
}

}  // namespace
}  // namespace shoal::train::pipeline
