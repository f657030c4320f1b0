#include "ps/replacement.h"

#include "comm/collectives.h"
#include "comm/native/native_engine.h"
#include "common/error.h"

namespace shoal::ps {

const char* copyName(bool backup) { return backup ? "backup" : "primary"; }

std::string replacementKey(int shard, bool backup) {
  return fmt::format("ps-replace/{}/{}", shard, copyName(backup));
}

std::string handoverKey(int shard, bool backup, int64_t incarnation) {
  return fmt::format("ps-replace/{}/{}/{}", shard, copyName(backup), incarnation);
}

std::string handoverName(int shard, bool backup, int64_t incarnation) {
  return fmt::format("ps-handover-{}-{}-r{}", shard, copyName(backup), incarnation);
}

std::string replacementPairName(const std::string& pair, int64_t incarnation) {
  return fmt::format("{}-r{}", pair, incarnation);
}

uint64_t replacementFlags(int64_t incarnation) {
  return kReplacementReady | (static_cast<uint64_t>(incarnation) << 32);
}

int64_t announcedReplacement(uint64_t replyFlags) {
  if ((replyFlags & kReplacementReady) == 0) return 0;
  return static_cast<int64_t>(replyFlags >> 32);
}

void sendHandover(comm::Group& world, int shard, bool backup, int64_t incarnation,
                  const std::string& snapshot) {
  comm::nativeEngine(world, "a parameter-server handover")
      .store()
      .set(handoverKey(shard, backup, incarnation), kHandoverReady);
  auto pair = world.connect(handoverName(shard, backup, incarnation), 0, 2);
  const uint64_t size = snapshot.size();
  comm::send(*pair, &size, sizeof(size), DataType::kUInt8, 1);
  comm::send(*pair, snapshot.data(), snapshot.size(), DataType::kUInt8, 1);
}

bool receiveHandover(comm::Group& world, int shard, bool backup, int64_t incarnation,
                     std::string& snapshot) {
  store::Store& store = comm::nativeEngine(world, "a parameter-server handover").store();
  const std::string key = handoverKey(shard, backup, incarnation);
  while (true) {
    try {
      store.wait({key}, world.options().timeout);
      break;
    } catch (const TimeoutError&) {
      // Still running, or done without anyone to tell us (then the count is closed).
      if (store.add(replacementKey(shard, backup), 0) >= kReplacementsClosed) return false;
    }
  }
  if (store.get(key, world.options().timeout) == kHandoverEnded) return false;
  auto pair = world.connect(handoverName(shard, backup, incarnation), 1, 2);
  uint64_t size = 0;
  comm::recv(*pair, &size, sizeof(size), DataType::kUInt8, 0);
  if (size > kMaxHandoverBytes) {
    SHOAL_THROW(ProtocolError, "a {}-byte handover of shard {}'s {} (at most {})", size, shard,
                copyName(backup), kMaxHandoverBytes);
  }
  snapshot.resize(size);
  comm::recv(*pair, snapshot.data(), size, DataType::kUInt8, 0);
  return true;
}

}  // namespace shoal::ps
