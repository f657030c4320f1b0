// Flight recorder files (common/flight_recorder.h) as `shoal flight` finds them: any bytes
// under a rank file's name.
//
// Oracle: reading either refuses the file with a typed error or returns what a recorder could
// have written: a size of exactly a header and `capacity` slots, at most `capacity` entries,
// each with an id of at most `begun`, in increasing order, texts shorter than their fields.
#include "common/flight_recorder.h"
#include "fuzz/fuzz_util.h"

using namespace shoal;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  constexpr const char* kTarget = "flight_file";
  const std::string path = fuzz::scratchDir() + "/" + flightFileName(0);
  fuzz::writeFile(path, std::string_view(reinterpret_cast<const char*>(data), size));
  FlightFile f;
  if (fuzz::expectTypedErrors(kTarget, [&] { f = readFlightFile(path); })) {
    SHOAL_FUZZ_CHECK(kTarget, size == sizeof(FlightHeader) + f.capacity * sizeof(FlightEntry));
    SHOAL_FUZZ_CHECK(kTarget, f.entries.size() + f.torn <= f.capacity);
    uint64_t last = 0;
    for (const auto& e : f.entries) {
      SHOAL_FUZZ_CHECK(kTarget, e.id > last && e.id <= f.begun);
      SHOAL_FUZZ_CHECK(kTarget, e.group.size() < sizeof(FlightEntry::group));
      SHOAL_FUZZ_CHECK(kTarget, e.op.size() < sizeof(FlightEntry::op));
      SHOAL_FUZZ_CHECK(kTarget, e.detail.size() < sizeof(FlightEntry::detail));
      last = e.id;
    }
  }
  return 0;
}
