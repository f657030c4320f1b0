#include "comm/world.h"

#include "common/error.h"
#include "common/log.h"
#include "store/tcp_store.h"

namespace shoal::comm {

std::shared_ptr<Group> joinWorld() {
  EnvConfig env = readEnvConfig();
  setLogLevel(env.logLevel);
  if (!env.rank || !env.worldSize || !env.storeAddress) {
    SHOAL_THROW(InvalidArgument,
                "joinWorld: SHOAL_RANK, SHOAL_WORLD_SIZE and SHOAL_STORE_ADDR must be set (start "
                "the program with Shoal's launcher)");
  }
  if (*env.rank >= *env.worldSize) {
    SHOAL_THROW(InvalidArgument, "SHOAL_RANK={} is not below SHOAL_WORLD_SIZE={}", *env.rank,
                *env.worldSize);
  }
  if (*env.rank == 0) SHOAL_LOG_INFO("configuration: {}", describe(env));
  GroupOptions options = GroupOptions::from(env);
  auto store = std::make_shared<store::TcpStore>(parseHostPort(*env.storeAddress), options.timeout);
  return Group::create(store, *env.rank, *env.worldSize, options);
}

}  // namespace shoal::comm
