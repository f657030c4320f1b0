// What `shoal run` gives each rank and a join file (run/rank_environment.h), without starting
// anything.
#include "run/rank_environment.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>

namespace shoal::test {
namespace {

using run::Variables;

// The last value `name` has in `v` (a later one wins in an environment), or none.
std::optional<std::string> valueOf(const Variables& v, const std::string& name) {
  std::optional<std::string> found;
  for (const auto& [k, value] : v) {
    if (k == name) found = value;
  }
  return found;
}

run::JobEnvironment job() {
  return {.worldSize = 5,
          .numHosts = 2,
          .workers = 3,
          .storeAddress = "10.0.0.1:2300",
          .storeHost = "10.0.0.1",
          .storePort = "2300",
          .secret = "s3cret",
          .attempt = 2};
}

run::Placement slot(int localRank, int localSize) {
  run::Placement p;
  p.host = "h1";
  p.localRank = localRank;
  p.localSize = localSize;
  return p;
}

TEST(RankEnvironment, WorkersThenServersEachWithItsRoleRankAndTheJobsShape) {
  run::LaunchOptions o;
  o.servers = 2;
  o.psReplicas = 2;
  const Variables w = run::rankVariables(o, job(), slot(1, 3), 2, 2);
  EXPECT_EQ(valueOf(w, "SHOAL_ROLE"), "worker");
  EXPECT_EQ(valueOf(w, "SHOAL_ROLE_RANK"), "2");
  EXPECT_EQ(valueOf(w, "SHOAL_RANK"), "2");
  EXPECT_EQ(valueOf(w, "RANK"), "2");
  EXPECT_EQ(valueOf(w, "WORLD_SIZE"), "5");
  EXPECT_EQ(valueOf(w, "LOCAL_RANK"), "1");
  EXPECT_EQ(valueOf(w, "SHOAL_LOCAL_WORLD_SIZE"), "3");
  EXPECT_EQ(valueOf(w, "SHOAL_NUM_HOSTS"), "2");
  EXPECT_EQ(valueOf(w, "SHOAL_PS_REPLICAS"), "2");
  EXPECT_EQ(valueOf(w, "TORCHELASTIC_RESTART_COUNT"), "2");
  EXPECT_EQ(valueOf(w, "MASTER_ADDR"), "10.0.0.1");
  EXPECT_EQ(valueOf(w, "MASTER_PORT"), "2300");
  const Variables s = run::rankVariables(o, job(), slot(0, 2), 4, 4);
  EXPECT_EQ(valueOf(s, "SHOAL_ROLE"), "server");
  EXPECT_EQ(valueOf(s, "SHOAL_ROLE_RANK"), "1");
  // The secret travels apart (environment or ssh's stdin), never with the rank's variables.
  EXPECT_FALSE(valueOf(w, "SHOAL_SECRET"));
  EXPECT_FALSE(valueOf(s, "SHOAL_SECRET"));
  EXPECT_FALSE(valueOf(w, "SHOAL_ELASTIC"));
  EXPECT_FALSE(valueOf(w, "SHOAL_TRACE"));
}

// Elastic jobs have no servers: slots past the launch (discovery's growth) are workers.
TEST(RankEnvironment, AnElasticSlotPastTheLaunchIsAWorkerWithItsMemberId) {
  run::LaunchOptions o;
  o.elastic = "2:8";
  const Variables v = run::rankVariables(o, job(), slot(0, 1), 6, 11);
  EXPECT_EQ(valueOf(v, "SHOAL_ROLE"), "worker");
  EXPECT_EQ(valueOf(v, "SHOAL_ROLE_RANK"), "6");
  EXPECT_EQ(valueOf(v, "SHOAL_ELASTIC"), "2:8");
  EXPECT_EQ(valueOf(v, "SHOAL_ELASTIC_MEMBER"), "11");
}

TEST(RankEnvironment, AnEtcdStoreHasNoMasterAddressAndTheUsersVariablesComeLast) {
  run::LaunchOptions o;
  o.opTimeoutSeconds = 7.5;
  o.tracePath = "/tmp/job.json";
  o.env = {{"SHOAL_RANK", "mine"}, {"EXTRA", "1"}};
  run::JobEnvironment etcd = job();
  etcd.storeAddress = "etcd://127.0.0.1:2379";
  etcd.storeHost.clear();
  etcd.storePort.clear();
  const Variables v = run::rankVariables(o, etcd, slot(0, 1), 0, 0);
  EXPECT_FALSE(valueOf(v, "MASTER_ADDR"));
  EXPECT_FALSE(valueOf(v, "MASTER_PORT"));
  EXPECT_EQ(valueOf(v, "SHOAL_STORE_ADDR"), "etcd://127.0.0.1:2379");
  EXPECT_EQ(valueOf(v, "SHOAL_TIMEOUT"), "7.5");
  EXPECT_EQ(valueOf(v, "SHOAL_TRACE"), "/tmp/job.json.ranks");
  EXPECT_EQ(v.back().first, "EXTRA");
  EXPECT_EQ(valueOf(v, "SHOAL_RANK"), "mine");  // -x wins
}

TEST(RankEnvironment, AJoinFileCarriesTheSecretAndTheStoresEncryptionButNoSlot) {
  run::LaunchOptions o;
  o.elastic = "2:4";
  o.encrypt = EncryptMode::kOn;
  const Variables v = run::joinVariables(o, job());
  EXPECT_EQ(valueOf(v, "SHOAL_SECRET"), "s3cret");
  EXPECT_EQ(valueOf(v, "SHOAL_ENCRYPT"), "on");
  EXPECT_EQ(valueOf(v, "SHOAL_ELASTIC"), "2:4");
  EXPECT_EQ(valueOf(v, "SHOAL_WORLD_SIZE"), "5");
  EXPECT_FALSE(valueOf(v, "SHOAL_RANK"));
  EXPECT_FALSE(valueOf(v, "SHOAL_LOCAL_RANK"));
}

}  // namespace
}  // namespace shoal::test
