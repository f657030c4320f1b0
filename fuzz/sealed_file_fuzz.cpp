// Sealed files (common/sealed_file.h) as found on disk: any bytes under the file's name.
//
// Oracle: reading returns only a payload whose framing is exact (magic, length, payload,
// SHA-256: 8 + 8 + n + 32 bytes), else a typed error; a payload read back is the one written.
#include "common/sealed_file.h"
#include "fuzz/fuzz_util.h"

using namespace shoal;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  constexpr const char* kTarget = "sealed_file";
  const std::string path = fuzz::scratchDir() + "/file";
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  fuzz::writeFile(path, bytes);
  std::string payload;
  if (fuzz::expectTypedErrors(kTarget, [&] { payload = readSealedFile(path); })) {
    SHOAL_FUZZ_CHECK(kTarget, size == 8 + 8 + payload.size() + 32);
    SHOAL_FUZZ_CHECK(kTarget, bytes.substr(16, payload.size()) == payload);
  }
  // Sealing the input as a payload and reading it back is the identity.
  const std::string sealed = fuzz::scratchDir() + "/sealed";
  fuzz::expectTypedErrors(kTarget, [&] {
    writeSealedFile(sealed, bytes);
    SHOAL_FUZZ_CHECK(kTarget, readSealedFile(sealed) == bytes);
  });
  return 0;
}
