// `shoal sweep --hosts`'s slot pool (run/sweep/trial_slots.h): first fit in the hosts' order,
// spanning hosts, release whatever the outcome, waiting when too few are free, and the refusal
// of a trial larger than every slot.
#include <gtest/gtest.h>

#include <set>

#include "common/error.h"
#include "run/sweep/trial_slots.h"

namespace sw = shoal::run::sweep;
using shoal::InvalidArgument;

namespace {

sw::TrialSlots pool(const std::string& hosts) {
  return sw::TrialSlots(shoal::run::parseHostList(hosts));
}

}  // namespace

TEST(TrialSlots, FirstFitInTheHostsOrder) {
  auto p = pool("nodea:2,nodeb:2");
  EXPECT_EQ(p.total(), 4);
  EXPECT_EQ(p.free(), 4);
  const auto a = p.take(2);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->hostList(), "nodea:2");
  EXPECT_EQ(a->slotList(), "nodea:0,nodea:1");
  const auto b = p.take(2);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->hostList(), "nodeb:2");
  EXPECT_EQ(b->slotList(), "nodeb:0,nodeb:1");
  EXPECT_EQ(p.free(), 0);
}

TEST(TrialSlots, ATrialMaySpanHosts) {
  auto p = pool("nodea:3,nodeb:1");
  const auto a = p.take(2);
  const auto b = p.take(2);  // nodea's last slot and nodeb's only one
  ASSERT_TRUE(a && b);
  EXPECT_EQ(b->hostList(), "nodea:1,nodeb:1");
  EXPECT_EQ(b->slotList(), "nodea:2,nodeb:0");
  ASSERT_EQ(b->hosts().size(), 2u);
  EXPECT_EQ(b->hosts()[0].host, "nodea");
  EXPECT_EQ(b->hosts()[1].slots, 1);
  // Ranks in the order `shoal run --hosts` places them: the hosts in order, each up to its count.
  const auto c = pool("x:1,y:4").take(5);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->slotList(), "x:0,y:0,y:1,y:2,y:3");
}

TEST(TrialSlots, WaitsWhenTooFewAreFreeAndReleasesWhateverTheOutcome) {
  auto p = pool("nodea:2,nodeb:1");
  const auto a = p.take(2);
  ASSERT_TRUE(a);
  EXPECT_FALSE(p.take(2).has_value());  // one free: a 2-rank trial waits
  EXPECT_EQ(p.free(), 1);               // and nothing was taken by the refusal
  const auto one = p.take(1);
  ASSERT_TRUE(one);
  EXPECT_EQ(one->slotList(), "nodeb:0");
  p.release(*a);
  EXPECT_EQ(p.free(), 2);
  const auto b = p.take(2);  // the released slots again, lowest first
  ASSERT_TRUE(b);
  EXPECT_EQ(b->slotList(), "nodea:0,nodea:1");
  p.release(*one);
  p.release(*b);
  EXPECT_EQ(p.free(), 3);
  // Releasing twice, or slots never taken, is a bug: refused, nothing changed.
  EXPECT_THROW(p.release(*b), InvalidArgument);
  EXPECT_THROW(p.release(sw::TrialAllocation{{{"nodec", 0}}}), InvalidArgument);
  EXPECT_EQ(p.free(), 3);
}

TEST(TrialSlots, HolesLeftByReleasesAreFilledFirstFit) {
  auto p = pool("nodea:4");
  std::vector<sw::TrialAllocation> ones;
  for (int i = 0; i < 4; ++i) ones.push_back(*p.take(1));
  p.release(ones[1]);
  p.release(ones[3]);
  const auto two = p.take(2);
  ASSERT_TRUE(two);
  EXPECT_EQ(two->slotList(), "nodea:1,nodea:3");
  EXPECT_EQ(two->hostList(), "nodea:2");
}

TEST(TrialSlots, NoSlotServesTwoTrials) {
  // Random takes and releases of 1..3 ranks over 3 uneven hosts: the held slots never repeat
  // and free() always counts the rest.
  auto p = pool("a:3,b:1,c:2");
  std::vector<sw::TrialAllocation> held;
  uint32_t state = 12345;
  auto next = [&] { return state = state * 1664525u + 1013904223u; };
  for (int step = 0; step < 2000; ++step) {
    if (!held.empty() && next() % 2 == 0) {
      const size_t i = next() % held.size();
      p.release(held[i]);
      held.erase(held.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      const int k = 1 + static_cast<int>(next() % 3);
      const int before = p.free();
      if (auto a = p.take(k)) {
        EXPECT_EQ(static_cast<int>(a->slots.size()), k);
        held.push_back(*a);
      } else {
        EXPECT_LT(before, k);
      }
    }
    std::set<std::pair<std::string, int>> used;
    size_t count = 0;
    for (const auto& a : held) {
      for (const auto& s : a.slots) {
        used.insert({s.host, s.index});
        ++count;
      }
    }
    ASSERT_EQ(used.size(), count) << "a slot held twice at step " << step;
    ASSERT_EQ(p.free(), 6 - static_cast<int>(count));
  }
}

TEST(TrialSlots, RefusesATrialLargerThanTheSlots) {
  auto p = pool("nodea:2,nodeb:1");
  p.checkFits(3);
  try {
    p.checkFits(4);
    FAIL() << "4 ranks on 3 slots accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("ranks_per_trial 4 is more than the 3 slots"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("nodea:2,nodeb:1"), std::string::npos) << e.what();
  }
  EXPECT_THROW(p.take(4), InvalidArgument);
  EXPECT_EQ(p.free(), 3);
  EXPECT_THROW(sw::TrialSlots({}), InvalidArgument);
}

TEST(TrialSlots, AHostNamedTwiceIsOneHost) {
  auto p = pool("nodea:1,nodeb:1,nodea:2");
  EXPECT_EQ(p.total(), 4);
  ASSERT_EQ(p.hosts().size(), 2u);
  EXPECT_EQ(p.hosts()[0].slots, 3);
  const auto a = p.take(4);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->hostList(), "nodea:3,nodeb:1");
}
