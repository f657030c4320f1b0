// The TCP store's framing as its server reads a client's bytes (store/tcp_store_protocol.h):
// the bytes arrive in chunks of arbitrary sizes (the first input byte picks the chunk size) and
// after each chunk the server decodes every whole frame at the front of its buffer, as
// TcpStoreServer::drain does, until a frame is malformed (the server drops the client).
//
// Oracle: tryDecode either asks for more bytes, throws a typed error, or returns a message whose
// re-encoding is exactly the bytes it consumed (nothing invented, nothing skipped).
#include "fuzz/fuzz_util.h"
#include "store/tcp_store_protocol.h"

using namespace shoal;
namespace wire = shoal::store::wire;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  constexpr const char* kTarget = "store_protocol";
  if (size < 1) return 0;
  const size_t chunk = 1 + data[0] % 97;
  const std::string_view in(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::string buf;
  for (size_t at = 0; at < in.size(); at += chunk) {
    buf.append(in.substr(at, chunk));
    bool broken = false;
    for (;;) {
      const std::string before = buf;
      std::optional<wire::Message> m;
      if (!fuzz::expectTypedErrors(kTarget, [&] { m = wire::tryDecode(buf); })) {
        broken = true;
        break;
      }
      if (!m) {
        SHOAL_FUZZ_CHECK(kTarget, buf == before);
        break;
      }
      SHOAL_FUZZ_CHECK(kTarget, buf.size() < before.size());
      const size_t consumed = before.size() - buf.size();
      std::string again;
      fuzz::expectTypedErrors(kTarget, [&] { again = wire::encode(m->code, m->fields); });
      SHOAL_FUZZ_CHECK(kTarget, again == before.substr(0, consumed));
    }
    if (broken) break;
  }
  return 0;
}
