// What each launcher's variables tell a rank (run/rendezvous.h), and host lists (run/hosts.h).
#include "run/rendezvous.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <map>

#include "common/error.h"
#include "run/hosts.h"

namespace shoal::run {
namespace {

Rendezvous detect(std::map<std::string, std::string> vars) {
  return detectRendezvous([vars](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  });
}

TEST(Rendezvous, NothingSetIsAWorldOfOne) {
  auto r = detect({});
  EXPECT_EQ(r.launcher, Launcher::kNone);
  EXPECT_EQ(r.size, 1);
}

TEST(Rendezvous, ShoalRun) {
  auto r = detect({{"SHOAL_RANK", "2"},
                   {"SHOAL_WORLD_SIZE", "4"},
                   {"SHOAL_LOCAL_RANK", "0"},
                   {"SHOAL_LOCAL_WORLD_SIZE", "2"},
                   {"SHOAL_NUM_HOSTS", "2"},
                   {"SHOAL_STORE_ADDR", "10.0.0.1:4000"},
                   // Ignored: shoal run's own variables win.
                   {"OMPI_COMM_WORLD_RANK", "1"},
                   {"SLURM_PROCID", "3"}});
  EXPECT_EQ(r.launcher, Launcher::kShoal);
  EXPECT_EQ(r.rank, 2);
  EXPECT_EQ(r.size, 4);
  EXPECT_EQ(r.localSize, 2);
  EXPECT_EQ(r.hosts, 2);
  EXPECT_EQ(r.storeHost, "10.0.0.1");
  EXPECT_EQ(r.storePort, 4000);
  EXPECT_FALSE(r.hostsStore);
  EXPECT_THROW(
      detect({{"SHOAL_RANK", "4"}, {"SHOAL_WORLD_SIZE", "4"}, {"SHOAL_STORE_ADDR", "h:1"}}),
      InvalidArgument);
  EXPECT_THROW(detect({{"SHOAL_RANK", "x"}, {"SHOAL_WORLD_SIZE", "4"}}), InvalidArgument);
}

TEST(Rendezvous, MpirunAsksMpiUnlessMasterIsGiven) {
  auto r = detect({{"OMPI_COMM_WORLD_RANK", "0"},
                   {"OMPI_COMM_WORLD_SIZE", "4"},
                   {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                   {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                   {"SLURM_PROCID", "3"}});  // mpirun inside an allocation: mpirun wins
  EXPECT_EQ(r.launcher, Launcher::kMpirun);
  EXPECT_TRUE(r.storeHost.empty());
  EXPECT_TRUE(r.hostsStore);
  EXPECT_EQ(r.hosts, 2);
  auto m = detect({{"OMPI_COMM_WORLD_RANK", "1"},
                   {"OMPI_COMM_WORLD_SIZE", "2"},
                   {"MASTER_ADDR", "node1"},
                   {"MASTER_PORT", "29500"}});
  EXPECT_EQ(m.storeHost, "node1");
  EXPECT_EQ(m.storePort, 29500);
  EXPECT_FALSE(m.hostsStore);
}

TEST(Rendezvous, SlurmFindsTheFirstNodeAndAJobPort) {
  auto r = detect({{"SLURM_PROCID", "5"},
                   {"SLURM_NTASKS", "7"},
                   {"SLURM_LOCALID", "1"},
                   {"SLURM_NODEID", "2"},
                   {"SLURM_TASKS_PER_NODE", "2(x3),1"},
                   {"SLURM_JOB_NUM_NODES", "4"},
                   {"SLURM_JOB_NODELIST", "gpu[07-10],cpu1"},
                   {"SLURM_JOB_ID", "123456"}});
  EXPECT_EQ(r.launcher, Launcher::kSlurm);
  EXPECT_EQ(r.rank, 5);
  EXPECT_EQ(r.size, 7);
  EXPECT_EQ(r.localRank, 1);
  EXPECT_EQ(r.localSize, 2);
  EXPECT_EQ(r.hosts, 4);
  EXPECT_EQ(r.storeHost, "gpu07");
  EXPECT_EQ(r.storePort, 20000 + 123456 % 20000);
  EXPECT_FALSE(r.hostsStore);
  EXPECT_THROW(detect({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}}), InvalidArgument);
}

TEST(Rendezvous, KubernetesIndexedJob) {
  auto r = detect({{"JOB_COMPLETION_INDEX", "3"},
                   {"SHOAL_WORLD_SIZE", "4"},
                   {"HOSTNAME", "train-mnist-3"},
                   {"SHOAL_K8S_SERVICE", "train-mnist"}});
  EXPECT_EQ(r.launcher, Launcher::kKubernetes);
  EXPECT_EQ(r.rank, 3);
  EXPECT_EQ(r.storeHost, "train-mnist-0.train-mnist");
  EXPECT_EQ(r.storePort, 29400);
  auto rank0 = detect({{"JOB_COMPLETION_INDEX", "0"},
                       {"WORLD_SIZE", "4"},
                       {"HOSTNAME", "train-mnist-0"},
                       {"SHOAL_K8S_SERVICE", "train-mnist"},
                       {"MASTER_PORT", "1234"}});
  EXPECT_TRUE(rank0.hostsStore);
  EXPECT_EQ(rank0.storePort, 1234);
  EXPECT_THROW(
      detect({{"JOB_COMPLETION_INDEX", "0"}, {"HOSTNAME", "x-0"}, {"SHOAL_K8S_SERVICE", "s"}}),
      InvalidArgument);  // no world size
  EXPECT_THROW(detect({{"JOB_COMPLETION_INDEX", "1"},
                       {"SHOAL_WORLD_SIZE", "2"},
                       {"HOSTNAME", "x-0"},
                       {"SHOAL_K8S_SERVICE", "s"}}),
               InvalidArgument);  // hostname does not carry the index
}

TEST(Rendezvous, TheLastRanksServe) {
  std::map<std::string, std::string> base{
      {"OMPI_COMM_WORLD_RANK", "4"}, {"OMPI_COMM_WORLD_SIZE", "6"}, {"SHOAL_NUM_SERVERS", "2"}};
  auto r = detect(base);
  EXPECT_EQ(r.role, Role::kServer);
  EXPECT_EQ(r.roleRank, 0);
  EXPECT_EQ(r.numServers, 2);
  base["OMPI_COMM_WORLD_RANK"] = "3";
  r = detect(base);
  EXPECT_EQ(r.role, Role::kWorker);
  EXPECT_EQ(r.roleRank, 3);
  EXPECT_EQ(detect({}).role, Role::kWorker);
  base["SHOAL_ROLE"] = "server";  // disagrees: rank 3 is a worker
  EXPECT_THROW(detect(base), InvalidArgument);
  EXPECT_THROW(detect({{"SHOAL_NUM_SERVERS", "1"}}), InvalidArgument);  // no worker left
}

// A worker started by hand (shoal join) has the rank past the launch size, as an elastic job
// allows: it is a worker (an elastic job has no servers), its id taken from the store.
TEST(Rendezvous, AnElasticWorkerPastTheLaunchSizeIsAWorker) {
  std::map<std::string, std::string> joiner{{"SHOAL_RANK", "2"},
                                            {"SHOAL_WORLD_SIZE", "2"},
                                            {"SHOAL_LOCAL_RANK", "0"},
                                            {"SHOAL_LOCAL_WORLD_SIZE", "1"},
                                            {"SHOAL_STORE_ADDR", "127.0.0.1:1234"},
                                            {"SHOAL_ELASTIC", "1:4"},
                                            {"SHOAL_ROLE", "worker"},
                                            {"SHOAL_ELASTIC_MEMBER", "auto"}};
  auto r = detect(joiner);
  EXPECT_EQ(r.role, Role::kWorker);
  EXPECT_EQ(r.roleRank, 2);
  EXPECT_EQ(r.memberId, -1);
  joiner.erase("SHOAL_ELASTIC");  // not elastic: rank 2 of 2 does not exist
  EXPECT_THROW(detect(joiner), InvalidArgument);
}

TEST(Rendezvous, ReplicatedShardsNeedTwoServers) {
  std::map<std::string, std::string> base{
      {"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "6"}, {"SHOAL_NUM_SERVERS", "2"}};
  EXPECT_EQ(detect(base).psReplicas, 1);
  base["SHOAL_PS_REPLICAS"] = "2";
  EXPECT_EQ(detect(base).psReplicas, 2);
  for (const char* bad : {"0", "3", "two"}) {
    base["SHOAL_PS_REPLICAS"] = bad;
    EXPECT_THROW(detect(base), InvalidArgument) << bad;
  }
  base["SHOAL_PS_REPLICAS"] = "2";
  base["SHOAL_NUM_SERVERS"] = "1";
  try {
    detect(base);
    ADD_FAILURE() << "one server accepted for two copies";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("SHOAL_PS_REPLICAS=2 needs at least 2 servers"),
              std::string::npos)
        << e.what();
  }
}

// Note [Replacement servers] (ps/replacement.h): only a server of a replicated job may be one.
TEST(Rendezvous, OnlyAServerOfAReplicatedJobIsAReplacement) {
  std::map<std::string, std::string> server{{"OMPI_COMM_WORLD_RANK", "5"},
                                            {"OMPI_COMM_WORLD_SIZE", "6"},
                                            {"SHOAL_NUM_SERVERS", "2"},
                                            {"SHOAL_PS_REPLICAS", "2"}};
  EXPECT_EQ(detect(server).psReplacement, 0);
  server["SHOAL_PS_REPLACEMENT"] = "3";
  EXPECT_EQ(detect(server).psReplacement, 3);
  for (const char* bad : {"-1", "x", ""}) {
    server["SHOAL_PS_REPLACEMENT"] = bad;
    EXPECT_THROW(detect(server), InvalidArgument) << bad;
  }
  server["SHOAL_PS_REPLACEMENT"] = "1";
  auto worker = server;
  worker["OMPI_COMM_WORLD_RANK"] = "0";
  auto unreplicated = server;
  unreplicated["SHOAL_PS_REPLICAS"] = "1";
  for (const auto& env : {worker, unreplicated}) {
    try {
      detect(env);
      ADD_FAILURE() << "a replacement accepted: rank " << env.at("OMPI_COMM_WORLD_RANK");
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("only a parameter server of a job with "
                                           "SHOAL_PS_REPLICAS=2 is started as a replacement"),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(Rendezvous, SlurmLists) {
  EXPECT_EQ(firstSlurmNode("node[01-04,07],gpu1"), "node01");
  EXPECT_EQ(firstSlurmNode("a,b[1-2]"), "a");
  EXPECT_EQ(firstSlurmNode("single"), "single");
  EXPECT_EQ(firstSlurmNode("n[5]"), "n5");
  EXPECT_THROW(firstSlurmNode("n[]"), InvalidArgument);
  EXPECT_EQ(expandSlurmTasksPerNode("2(x3),1"), (std::vector<int>{2, 2, 2, 1}));
  EXPECT_EQ(expandSlurmTasksPerNode("4"), (std::vector<int>{4}));
  EXPECT_THROW(expandSlurmTasksPerNode("x"), InvalidArgument);
  EXPECT_THROW(expandSlurmTasksPerNode("2(x0)"), InvalidArgument);
}

TEST(Hosts, ListsFilesAndPlacement) {
  auto h = parseHostList("localhost:2,127.0.0.1");
  ASSERT_EQ(h.size(), 2u);
  EXPECT_EQ(h[0].slots, 2);
  EXPECT_EQ(h[1].slots, 1);
  EXPECT_THROW(parseHostList("a:0"), InvalidArgument);
  EXPECT_THROW(parseHostList("a:,b"), InvalidArgument);
  EXPECT_THROW(parseHostList(",a"), InvalidArgument);

  char path[] = "/tmp/shoal-hostfile-XXXXXX";
  int fd = ::mkstemp(path);
  const char text[] = "# cluster\nlocalhost slots=3\n\n127.0.0.1:2  # second\n";
  ASSERT_EQ(::write(fd, text, sizeof(text) - 1), static_cast<ssize_t>(sizeof(text) - 1));
  ::close(fd);
  auto f = readHostfile(path);
  ::unlink(path);
  ASSERT_EQ(f.size(), 2u);
  EXPECT_EQ(f[0].host, "localhost");
  EXPECT_EQ(f[0].slots, 3);
  EXPECT_EQ(f[1].host, "127.0.0.1");
  EXPECT_EQ(f[1].slots, 2);

  auto p = placeRanks(4, f);
  ASSERT_EQ(p.size(), 4u);
  EXPECT_EQ(p[2].host, "localhost");
  EXPECT_EQ(p[2].localRank, 2);
  EXPECT_EQ(p[2].localSize, 3);
  EXPECT_EQ(p[3].host, "127.0.0.1");
  EXPECT_EQ(p[3].localRank, 0);
  EXPECT_EQ(p[3].localSize, 1);
  EXPECT_EQ(placeRanks(0, f).size(), 5u);  // one per slot
  EXPECT_THROW(placeRanks(6, f), InvalidArgument);
}

}  // namespace
}  // namespace shoal::run
