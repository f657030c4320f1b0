// The bootstrap under attack: silent, garbage, wrong-secret and wrong-group connections opened
// to every rank's listener before any real peer connects must not delay the job.
#include <gtest/gtest.h>

#include <iostream>
#include <thread>

#include "comm/collectives.h"
#include "common/error.h"
#include "common/hmac_auth.h"
#include "common/socket.h"
#include "store/memory_store.h"
#include "tests/thread_ranks.h"

namespace shoal {
namespace {

using namespace std::chrono_literals;

// A store that holds back each rank's address record ("shoal/g0/peer/<r>") from the other ranks
// until the attackers have opened their connections to rank r: so the attack is in every
// listener's backlog before the first real peer connects. The attackers read the records
// from the inner store directly.
class GatedStore : public store::MemoryStore {
 public:
  std::string get(const std::string& key, Duration timeout) override {
    if (key.rfind("shoal/g0/peer/", 0) == 0) {
      MemoryStore::wait({"attacked/" + key.substr(14)}, timeout);
    }
    return MemoryStore::get(key, timeout);
  }
};

struct Attack {
  std::vector<Fd> held;  // silent and garbage connections, kept open until the job is done
  std::vector<std::thread> handshakes;
  std::vector<std::string> handshakeErrors;
  std::mutex mutex;
};

// Opens the four kinds of hostile connection to rank r's listener, then releases its record.
void attackRank(store::MemoryStore& inner, int r, Attack& attack, bool hostile) {
  if (hostile) {
    // Past the gate: the attackers are the ones it waits for.
    std::string record = inner.MemoryStore::get(fmt::format("shoal/g0/peer/{}", r), 20s);
    HostPort at = parseHostPort(record.substr(0, record.find('|')));
    Fd silent = connectTcp(at, Deadline(5s), "silent attacker");
    Fd garbage = connectTcp(at, Deadline(5s), "garbage attacker");
    std::string junk(200, 'x');
    writeAll(garbage.get(), junk.data(), junk.size(), Deadline(5s), "garbage attacker");
    {
      std::lock_guard<std::mutex> lock(attack.mutex);
      attack.held.push_back(std::move(silent));
      attack.held.push_back(std::move(garbage));
    }
    // A rank's true group id is its group's hash; neither of these can get it right.
    for (const auto& [secret, group] :
         {std::pair<std::string, uint32_t>{"wrong secret", 0},
          std::pair<std::string, uint32_t>{"thread-test-secret", 12345}}) {
      auto conn = std::make_shared<Fd>(connectTcp(at, Deadline(5s), "attacker"));
      std::lock_guard<std::mutex> lock(attack.mutex);
      attack.handshakes.emplace_back([conn, secret, group, r, &attack] {
        // Refused (ProtocolError), or closed unanswered when the rank's bootstrap ended (the
        // highest rank accepts nobody): anything but success is right.
        std::string outcome;
        try {
          auth::connect(conn->get(), secret, auth::Channel::kData, group, r + 1, r, Deadline(20s),
                        "attacker");
          outcome = fmt::format("rank {} accepted a hostile connection", r);
        } catch (const Error&) {
        }
        std::lock_guard<std::mutex> lock(attack.mutex);
        if (!outcome.empty()) attack.handshakeErrors.push_back(outcome);
      });
    }
  }
  inner.set(fmt::format("attacked/{}", r), "1");
}

// Bootstraps n thread ranks and runs one all-reduce; returns the seconds it took.
double runJob(int n, TransportKind transport, bool hostile, Attack& attack) {
  auto store = std::make_shared<GatedStore>();
  auto options = test::testOptions(transport, 30);
  std::vector<std::thread> attackers;
  for (int r = 0; r < n; ++r) {
    attackers.emplace_back([&, r] {
      try {
        attackRank(*store, r, attack, hostile);
      } catch (const std::exception& e) {
        ADD_FAILURE() << "attacker of rank " << r << ": " << e.what();
        store->set(fmt::format("attacked/{}", r), "1");  // let the job go on
      }
    });
  }
  const auto t0 = Clock::now();
  auto errors = test::runThreadRanks(
      n, options,
      [n](comm::Group& g) {
        int64_t v = g.rank() + 1;
        comm::allreduce(g, &v, 1, DataType::kInt64, ReduceOp::kSum);
        EXPECT_EQ(v, int64_t{n} * (n + 1) / 2);
      },
      store);
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  for (auto& t : attackers) t.join();
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  return seconds;
}

class BootstrapUnderAttack : public ::testing::TestWithParam<TransportKind> {};

TEST_P(BootstrapUnderAttack, HostileConnectionsNeverDelayRealPeers) {
  const int n = 4;
  Attack none;
  const double clean = runJob(n, GetParam(), false, none);
  Attack attack;
  const double attacked = runJob(n, GetParam(), true, attack);
  {
    std::lock_guard<std::mutex> lock(attack.mutex);
    EXPECT_EQ(attack.held.size(), 2u * n);
  }
  for (auto& t : attack.handshakes) t.join();
  EXPECT_EQ(attack.handshakes.size(), 2u * n);
  for (auto& e : attack.handshakeErrors) ADD_FAILURE() << "a hostile handshake: " << e;
  std::cerr << "clean " << clean << " s, attacked " << attacked << " s\n";
  // The per-handshake limit is 2 s: a bootstrap that waited for any hostile connection would
  // take at least that. Generous slack for a loaded machine, still well below it.
  EXPECT_LT(attacked, 2 * clean + 1.0) << "clean " << clean << " s, attacked " << attacked << " s";
}

INSTANTIATE_TEST_SUITE_P(Transports, BootstrapUnderAttack,
                         ::testing::Values(TransportKind::kTcp, TransportKind::kAuto),
                         [](const auto& info) {
                           return info.param == TransportKind::kTcp ? std::string("tcp")
                                                                    : std::string("auto");
                         });

}  // namespace
}  // namespace shoal
