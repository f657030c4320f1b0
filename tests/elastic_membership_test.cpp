// Elastic membership (comm/membership.h) with members as threads on one in-memory store, and
// the elastic data order (train/elastic_sampler.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <future>
#include <set>
#include <vector>

#include "comm/membership.h"
#include "common/error.h"
#include "store/memory_store.h"
#include "train/elastic_sampler.h"

namespace shoal {
namespace {

using comm::ElasticRange;
using comm::Membership;
using comm::MembershipOptions;
using comm::View;

MembershipOptions options(int initial, int min, int max) {
  MembershipOptions o;
  o.range = {min, max};
  o.initialSize = initial;
  o.settle = std::chrono::seconds(20);  // only the known failures may end a wait early here
  o.waitForMembers = std::chrono::seconds(20);
  o.startup = std::chrono::seconds(20);
  return o;
}

// Runs `fn(i)` on `n` threads; returns their results in order.
template <typename Fn>
auto onThreads(int n, Fn fn) {
  std::vector<std::future<decltype(fn(0))>> futures;
  for (int i = 0; i < n; ++i) futures.push_back(std::async(std::launch::async, fn, i));
  std::vector<decltype(fn(0))> out;
  for (auto& f : futures) out.push_back(f.get());
  return out;
}

TEST(ElasticRangeTest, ParsesAndRefuses) {
  auto r = ElasticRange::parse("2:4");
  EXPECT_EQ(r.minSize, 2);
  EXPECT_EQ(r.maxSize, 4);
  EXPECT_EQ(ElasticRange::parse("3").minSize, 3);
  EXPECT_EQ(ElasticRange::parse("3").maxSize, 3);
  EXPECT_THROW(ElasticRange::parse("4:2"), InvalidArgument);
  EXPECT_THROW(ElasticRange::parse("0:2"), InvalidArgument);
  EXPECT_THROW(ElasticRange::parse("a:2"), InvalidArgument);
  EXPECT_THROW(ElasticRange::parse("2:"), InvalidArgument);
  EXPECT_THROW(ElasticRange::parse(""), InvalidArgument);
}

TEST(ViewTest, EncodesDecodesAndChecks) {
  View v;
  v.generation = 7;
  v.members = {{3, 12}, {0, 12}, {5, -1}};
  const View back = View::decode(v.encode(), "test");
  EXPECT_EQ(back.generation, 7u);
  ASSERT_EQ(back.size(), 3);
  EXPECT_EQ(back.rankOf(0), 1);
  EXPECT_EQ(back.rankOf(5), 2);
  EXPECT_EQ(back.rankOf(9), -1);
  EXPECT_EQ(back.source(), 0);
  EXPECT_TRUE(back.needsSync());  // member 5 is a joiner
  v.members = {{1, 4}, {2, 5}};
  EXPECT_EQ(v.source(), 1);  // the most advanced
  v.members = {{1, 5}, {2, 5}};
  EXPECT_FALSE(v.needsSync());
  for (const char* bad :
       {"", "x", "1", "1 2", "1 2:x", "1 2:3 2:3", "1 -2:3", "1 2:-5", "1 2:3:4"}) {
    EXPECT_THROW(View::decode(bad, "bad"), ProtocolError) << bad;
  }
}

TEST(MembershipTest, AllInitialMembersAgreeOnViewZero) {
  auto store = std::make_shared<store::MemoryStore>();
  auto views = onThreads(4, [&](int id) {
    Membership m(store, id, options(4, 2, 4));
    return m.next(-1);
  });
  for (const auto& v : views) {
    EXPECT_EQ(v.encode(), views[0].encode());
    EXPECT_EQ(v.size(), 4);
    EXPECT_EQ(v.generation, 0u);
  }
  // Rank order is the launch order.
  for (int id = 0; id < 4; ++id) EXPECT_EQ(views[0].rankOf(id), id);
}

TEST(MembershipTest, SurvivorsAgreeWithoutTheFailedMemberAndKeepTheirOrder) {
  auto store = std::make_shared<store::MemoryStore>();
  std::vector<std::unique_ptr<Membership>> ms;
  for (int id = 0; id < 4; ++id)
    ms.push_back(std::make_unique<Membership>(store, id, options(4, 2, 4)));
  onThreads(4, [&](int id) { return ms[static_cast<size_t>(id)]->next(-1); });
  // Member 1 is gone; member 0 saw it fail, the others only arrive. The survivors committed
  // different steps (member 3 missed the last one).
  const int64_t committed[] = {9, -1, 9, 8};
  auto views = onThreads(3, [&](int i) {
    const int id = i == 0 ? 0 : i + 1;
    return ms[static_cast<size_t>(id)]->next(committed[id],
                                             id == 0 ? std::vector<int>{1} : std::vector<int>{});
  });
  for (const auto& v : views) EXPECT_EQ(v.encode(), views[0].encode());
  const View& v = views[0];
  EXPECT_EQ(v.generation, 1u);
  ASSERT_EQ(v.size(), 3);
  EXPECT_EQ(v.rankOf(0), 0);
  EXPECT_EQ(v.rankOf(2), 1);
  EXPECT_EQ(v.rankOf(3), 2);
  EXPECT_EQ(v.source(), 0);
  EXPECT_TRUE(v.needsSync());
}

TEST(MembershipTest, AJoinerWaitsUntilTheMembersMoveAndComesLast) {
  auto store = std::make_shared<store::MemoryStore>();
  std::vector<std::unique_ptr<Membership>> ms;
  for (int id = 0; id < 2; ++id)
    ms.push_back(std::make_unique<Membership>(store, id, options(2, 1, 3)));
  onThreads(2, [&](int id) { return ms[static_cast<size_t>(id)]->next(-1); });
  EXPECT_FALSE(ms[0]->joinersWaiting());
  auto joiner = std::async(std::launch::async, [&] {
    Membership j(store, 7, options(2, 1, 3));
    return j.next(-1);
  });
  // Its arrival record (comm/membership.cpp's key) is what the members see.
  store->wait({"elastic/g1/arrival0"}, std::chrono::seconds(20));
  EXPECT_TRUE(ms[0]->joinersWaiting());
  // A joiner never proposes: without the members it would still wait.
  EXPECT_EQ(joiner.wait_for(std::chrono::milliseconds(100)), std::future_status::timeout);
  auto views = onThreads(2, [&](int id) { return ms[static_cast<size_t>(id)]->next(4); });
  const View j = joiner.get();
  EXPECT_EQ(j.encode(), views[0].encode());
  EXPECT_EQ(views[1].encode(), views[0].encode());
  ASSERT_EQ(j.size(), 3);
  EXPECT_EQ(j.rankOf(7), 2);
  EXPECT_EQ(j.members[2].committed, -1);
  EXPECT_EQ(j.source(), 0);
}

TEST(MembershipTest, AJoinerOfAJobThatFinishedStopsWaitingAtOnce) {
  auto store = std::make_shared<store::MemoryStore>();
  std::vector<std::unique_ptr<Membership>> ms;
  for (int id = 0; id < 2; ++id)
    ms.push_back(std::make_unique<Membership>(store, id, options(2, 1, 3)));
  onThreads(2, [&](int id) { return ms[static_cast<size_t>(id)]->next(-1); });
  ms[0]->finish(9);
  ms[1]->finish(8);  // the first call wins
  Membership late(store, 7, options(2, 1, 3));
  // Without the record it would wait 40 s for a view and then time out instead.
  try {
    late.next(-1);
    FAIL() << "admitted to a job that finished";
  } catch (const comm::JobFinished& e) {
    EXPECT_NE(std::string(e.what()).find("the job finished (at step 9) before this worker"),
              std::string::npos)
        << e.what();
  }
}

TEST(MembershipTest, BelowTheMinimumTimesOutNamingTheCount) {
  auto store = std::make_shared<store::MemoryStore>();
  auto o = options(3, 2, 3);
  o.settle = std::chrono::milliseconds(50);
  o.waitForMembers = std::chrono::milliseconds(300);
  std::vector<std::unique_ptr<Membership>> ms;
  for (int id = 0; id < 3; ++id) ms.push_back(std::make_unique<Membership>(store, id, o));
  onThreads(3, [&](int id) { return ms[static_cast<size_t>(id)]->next(-1); });
  try {
    ms[0]->next(3, {1, 2});
    FAIL() << "no timeout";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("1 worker arrived, the minimum is 2"), std::string::npos)
        << e.what();
  }
}

TEST(MembershipTest, AboveTheMaximumTheLateMemberWaitsForTheNextView) {
  auto store = std::make_shared<store::MemoryStore>();
  auto o = options(2, 1, 2);
  std::vector<std::unique_ptr<Membership>> ms;
  for (int id = 0; id < 2; ++id) ms.push_back(std::make_unique<Membership>(store, id, o));
  onThreads(2, [&](int id) { return ms[static_cast<size_t>(id)]->next(-1); });
  // A joiner arrives, but the view is full: the members move on (as after a commit) and the
  // joiner is left out of generation 1; it is not admitted before its deadline.
  auto jo = o;
  jo.waitForMembers = std::chrono::milliseconds(200);
  jo.startup = std::chrono::milliseconds(200);
  auto joiner = std::async(std::launch::async, [&] {
    Membership j(store, 5, jo);
    return j.next(-1);
  });
  store->wait({"elastic/g1/arrival0"}, std::chrono::seconds(20));
  EXPECT_TRUE(ms[0]->joinersWaiting());
  auto views = onThreads(2, [&](int id) { return ms[static_cast<size_t>(id)]->next(1); });
  EXPECT_EQ(views[0].size(), 2);
  EXPECT_EQ(views[0].rankOf(5), -1);
  EXPECT_THROW(joiner.get(), TimeoutError);
}

TEST(ElasticSamplerTest, EveryEpochIsTakenOnceWhateverTheWorldSizes) {
  const int64_t n = 103;
  train::ElasticSampler s(n, {.shuffle = true, .seed = 5});
  // The world changes size at every step: 4, 3, 1, 2, 4, ...
  const int worlds[] = {4, 3, 1, 2};
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    std::multiset<int64_t> seen;
    int64_t position = 0;
    for (int k = 0; position < n; ++k) {
      const int world = worlds[k % 4];
      int64_t total = -1;
      for (int r = 0; r < world; ++r) {
        auto step = s.step(epoch, position, r, world, 5);
        seen.insert(step.indices.begin(), step.indices.end());
        if (total < 0) total = step.total;
        EXPECT_EQ(step.total, total);
        EXPECT_EQ(step.nextPosition, position + total);
      }
      position += total;
    }
    EXPECT_EQ(position, n);
    ASSERT_EQ(seen.size(), static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(seen.count(i), 1u) << i;
  }
  // Epochs are shuffled differently, and the same on every call.
  EXPECT_NE(s.step(0, 0, 0, 1, 10).indices, s.step(1, 0, 0, 1, 10).indices);
  EXPECT_EQ(s.step(0, 0, 0, 1, 10).indices, s.step(0, 0, 0, 1, 10).indices);
}

TEST(ElasticSamplerTest, TheLastStepSpreadsTheRest) {
  train::ElasticSampler s(10, {.shuffle = false});
  // 2 left for 4 ranks: ranks 1 and 3 get one each, the others none.
  std::vector<size_t> sizes;
  for (int r = 0; r < 4; ++r) sizes.push_back(s.step(0, 8, r, 4, 3).indices.size());
  EXPECT_EQ(sizes, (std::vector<size_t>{0, 1, 0, 1}));
  EXPECT_EQ(s.step(0, 8, 0, 4, 3).total, 2);
  EXPECT_EQ(s.step(0, 0, 1, 2, 3).indices, (std::vector<int64_t>{3, 4, 5}));
  EXPECT_THROW(s.step(0, 10, 0, 1, 1), InvalidArgument);
  EXPECT_THROW(s.step(0, -1, 0, 1, 1), InvalidArgument);
  EXPECT_THROW(s.step(0, 0, 2, 2, 1), InvalidArgument);
  EXPECT_THROW(s.step(0, 0, 0, 1, 0), InvalidArgument);
  EXPECT_THROW(train::ElasticSampler(-1), InvalidArgument);
}

}  // namespace
}  // namespace shoal
