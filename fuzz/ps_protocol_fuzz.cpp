// The parameter server's hello as the server decodes it (ps/protocol.h, ps/server_requests.cpp):
// the training settings line, a newline, then the model's keys. The server parses both, builds the
// partition and allocates its shard from them, so this target does the same.
//
// The per-request checks (key, dtype, shape, byte counts) live inside the parameter server's class
// (ps/server_state.h) and are reached only through a running server; see fuzz/README.md.
//
// Oracle: bad text ends in a typed error; text that parses re-encodes to text that parses to
// the same keys.
#include "fuzz/fuzz_util.h"
#include "ps/config.h"
#include "ps/partition.h"
#include "ps/shard.h"

using namespace shoal;
using namespace shoal::ps;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  constexpr const char* kTarget = "ps_protocol";
  const std::string text(reinterpret_cast<const char*>(data), size);
  const auto nl = text.find('\n');
  if (nl == std::string::npos) return 0;  // the server refuses this before parsing
  TrainingConfig config;
  std::vector<KeySpec> keys;
  const bool parsed = fuzz::expectTypedErrors(kTarget, [&] {
    config = TrainingConfig::parse(std::string_view(text).substr(0, nl));
    keys = Partition::parseKeys(std::string_view(text).substr(nl + 1));
  });
  if (!parsed) return 0;

  fuzz::expectTypedErrors(kTarget, [&] {
    const std::string again = TrainingConfig::parse(config.toText()).toText();
    SHOAL_FUZZ_CHECK(kTarget, again == config.toText());
  });

  // What the first hello makes the server build: two servers, this is server 0, three workers.
  fuzz::expectTypedErrors(kTarget, [&] {
    Partition partition(keys, 2);
    const auto reparsed = Partition::parseKeys(partition.keysText());
    SHOAL_FUZZ_CHECK(kTarget, partition.firstDifference(reparsed).empty());
    // parseKeys admits models up to kMaxModelElements (256 GiB): an authenticated worker may
    // describe one that big, and a server then needs that memory. Building such a shard here
    // would only measure this machine's RAM, so the harness stops at 16 Mi elements.
    if (partition.elements(0) > (size_t{1} << 24)) return;
    Shard shard(partition, 0, 3, config);
    SHOAL_FUZZ_CHECK(kTarget, shard.elements() == partition.elements(0));
  });
  return 0;
}
