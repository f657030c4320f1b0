// A parameter server's shard checkpoint payload (ps/shard.h), as restore reads it once the
// sealed framing around it checked out (the checksum only proves the bytes are the ones
// written, not that the writer was this version, this partition or honest).
//
// Oracle: restore either throws a typed error or accepts a payload that snapshot() reproduces
// byte for byte.
#include "fuzz/fuzz_util.h"
#include "ps/config.h"
#include "ps/partition.h"
#include "ps/shard.h"

using namespace shoal;
using namespace shoal::ps;

namespace shoal::fuzz {
// Also used by the seed generator (train/make_corpus.cpp), so seeds fit the shard restored here.
Shard makeRestoreShard(const Partition& p);
const Partition& restorePartition();
}  // namespace shoal::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  constexpr const char* kTarget = "shard_restore";
  const std::string payload(reinterpret_cast<const char*>(data), size);
  Shard shard = fuzz::makeRestoreShard(fuzz::restorePartition());
  uint64_t round = 0;
  std::vector<uint64_t> clocks;
  std::string header;
  fuzz::expectTypedErrors(kTarget, [&] { (void)Shard::snapshotHeader(payload); });
  if (fuzz::expectTypedErrors(kTarget, [&] { header = shard.restore(payload, round, clocks); })) {
    SHOAL_FUZZ_CHECK(kTarget, shard.snapshot(header, round, clocks) == payload);
  }
  return 0;
}
