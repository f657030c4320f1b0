// The store contract on a real etcd (store/etcd_store.h). Started by tests/etcd/etcd_test.sh,
// which runs etcd in a private network namespace and passes its URL in SHOAL_TEST_ETCD.
#include "store/etcd_store.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <future>
#include <string>
#include <vector>

#include "comm/membership.h"
#include "common/error.h"

namespace shoal::store {
namespace {

std::shared_ptr<EtcdStore> connect(const std::string& ns) {
  const char* url = std::getenv("SHOAL_TEST_ETCD");
  if (url == nullptr) {
    ADD_FAILURE() << "SHOAL_TEST_ETCD is not set: run tests/etcd/etcd_test.sh";
    return nullptr;
  }
  auto a = EtcdAddress::parse(url);
  a.ns += "/" + ns;
  return std::make_shared<EtcdStore>(a, std::chrono::seconds(10));
}

TEST(EtcdStore, SetGetCheckDelete) {
  auto s = connect("basic");
  ASSERT_TRUE(s);
  const std::string binary("a\0b\xff\n", 5);
  s->set("k", binary);
  EXPECT_EQ(s->get("k", std::chrono::seconds(1)), binary);
  EXPECT_TRUE(s->check({"k"}));
  EXPECT_FALSE(s->check({"k", "missing"}));
  EXPECT_TRUE(s->deleteKey("k"));
  EXPECT_FALSE(s->deleteKey("k"));
  EXPECT_FALSE(s->check({"k"}));
  try {
    s->get("missing", std::chrono::milliseconds(200));
    FAIL() << "no timeout";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("missing"), std::string::npos) << e.what();
  }
}

TEST(EtcdStore, AddFromManyClientsIsExact) {
  auto s = connect("add");
  ASSERT_TRUE(s);
  std::vector<std::future<void>> clients;
  for (int c = 0; c < 4; ++c) {
    clients.push_back(std::async(std::launch::async, [&] {
      auto mine = connect("add");  // its own connections, as another process would have
      for (int i = 0; i < 25; ++i) mine->add("n", 1);
    }));
  }
  for (auto& c : clients) c.get();
  EXPECT_EQ(s->add("n", 0), 100);
  EXPECT_EQ(s->add("n", -100), 0);
  s->set("text", "x");
  EXPECT_THROW(s->add("text", 1), StoreError);
}

TEST(EtcdStore, CompareSet) {
  auto s = connect("cas");
  ASSERT_TRUE(s);
  EXPECT_EQ(s->compareSet("c", "", "one"), "one");  // absent equals ""
  EXPECT_EQ(s->compareSet("c", "", "two"), "one");  // present: unchanged, the value returned
  EXPECT_EQ(s->compareSet("c", "zzz", "two"), "one");
  EXPECT_EQ(s->compareSet("c", "one", "two"), "two");
  EXPECT_EQ(s->get("c", std::chrono::seconds(1)), "two");
}

TEST(EtcdStore, MembersAgreeOnAViewThroughEtcd) {
  auto s = connect("membership");
  ASSERT_TRUE(s);
  comm::MembershipOptions o;
  o.range = {2, 3};
  o.initialSize = 3;
  std::vector<std::future<std::string>> members;
  for (int id = 0; id < 3; ++id) {
    members.push_back(std::async(std::launch::async, [&, id] {
      comm::Membership m(connect("membership"), id, o);
      return m.next(-1).encode();
    }));
  }
  const std::string first = members[0].get();
  EXPECT_EQ(members[1].get(), first);
  EXPECT_EQ(members[2].get(), first);
  EXPECT_EQ(comm::View::decode(first, "view").size(), 3);
}

TEST(EtcdStore, UnreachableIsAStoreErrorNamingTheAddress) {
  EtcdStore s(EtcdAddress::parse("etcd://127.0.0.1:1/x"), std::chrono::milliseconds(300));
  try {
    s.set("k", "v");
    FAIL() << "no error";
  } catch (const StoreError& e) {
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:1"), std::string::npos) << e.what();
  }
  EXPECT_THROW(EtcdAddress::parse("etcd://host"), InvalidArgument);
  EXPECT_THROW(EtcdAddress::parse("etcd://host:2379/"), InvalidArgument);
  EXPECT_THROW(EtcdAddress::parse("http://host:2379"), InvalidArgument);
  EXPECT_EQ(EtcdAddress::parse("etcd://h:2379/a/b").ns, "a/b");
}

}  // namespace
}  // namespace shoal::store
