// The TCP store's request serving (store/tcp_store_requests.h) as its server runs it: three
// clients' bytes arrive in chunks, each chunk followed by a drain of that client, and a drain
// that answered something is followed by a drain of every parked client (a write may be what
// they wait for). Small limits (8-byte keys, 24-byte values, 96 bytes held, 2 parked requests) so
// that inputs reach them.
//
// Input: repeated [control byte, chunk]. Control: bits 0-1 the client (0-2; 3 is client 0),
// bit 2: the client reads its replies first, bit 3: the client hangs up first (a new one takes
// its place), bits 4-7: the chunk is 5 x that + 1 bytes.
//
// Oracle: only typed errors escape a drain (the server then drops the client); every reply is a
// whole frame with status ok or failed carrying at most one field; the bytes held and the parked
// requests never pass their limits and the parked count is the clients' parked requests; a
// client's unread replies stay within one frame past the limit; and a drain stops only where it
// must: replies at the limit, a parked request, or no whole frame left to serve.
#include <array>

#include "fuzz/fuzz_util.h"
#include "store/tcp_store_requests.h"

using namespace shoal;
using namespace shoal::store;

namespace {

constexpr const char* kTarget = "store_requests";

struct Client {
  RequestStream s;
  size_t checked = 0;  // bytes of s.out already checked to be whole replies
};

// Every reply appended since the last check is a whole frame the client can read.
void checkReplies(Client& c) {
  std::string rest = c.s.out.substr(c.checked);
  while (!rest.empty()) {
    std::optional<wire::Message> m;
    SHOAL_FUZZ_CHECK(kTarget, fuzz::expectTypedErrors(kTarget, [&] { m = wire::tryDecode(rest); }));
    SHOAL_FUZZ_CHECK(kTarget, m.has_value());
    SHOAL_FUZZ_CHECK(kTarget, m->code == wire::kOk || m->code == wire::kFailed);
    SHOAL_FUZZ_CHECK(kTarget, m->fields.size() <= 1);
  }
  c.checked = c.s.out.size();
}

bool holdsWholeFrame(const RequestStream& s) {
  if (s.skip > 0) return !s.in.empty();
  auto len = wire::peekLength(s.in);
  return len && s.in.size() >= size_t{4} + *len;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  TcpStoreServerOptions o;
  o.maxKeyBytes = 8;
  o.maxValueBytes = 24;
  o.maxStoredBytes = 96;
  o.maxParked = 2;
  StoreRequests requests(o);
  std::array<Client, 3> clients;

  // Serves one client as the server does; false when it was dropped (and replaced).
  auto serve = [&](Client& c) {
    const bool ok = fuzz::expectTypedErrors(kTarget, [&] { requests.drain(c.s); });
    if (!ok) {
      requests.forget(c.s);
      c = Client{};
      return false;
    }
    checkReplies(c);
    SHOAL_FUZZ_CHECK(kTarget, c.s.out.size() < requests.maxFrame() + 512);
    SHOAL_FUZZ_CHECK(kTarget, c.s.out.size() >= requests.maxFrame() || c.s.parked.has_value() ||
                                  !holdsWholeFrame(c.s));
    return true;
  };

  size_t at = 0;
  while (at < size) {
    const uint8_t control = data[at++];
    Client& c = clients[(control & 3) % 3];
    if (control & 4) {
      c.s.out.clear();
      c.checked = 0;
    }
    if (control & 8) {
      requests.forget(c.s);
      c = Client{};
    }
    const size_t n = std::min<size_t>(size - at, 5 * (control >> 4) + 1);
    c.s.in.append(reinterpret_cast<const char*>(data + at), n);
    at += n;
    const size_t before = c.s.out.size();
    if (serve(c) && c.s.out.size() != before) {
      for (Client& other : clients) {
        if (other.s.parked) serve(other);
      }
    }
    int parked = 0;
    for (const Client& k : clients) parked += k.s.parked ? 1 : 0;
    SHOAL_FUZZ_CHECK(kTarget, requests.parkedCount() == parked);
    SHOAL_FUZZ_CHECK(kTarget, parked <= o.maxParked);
    SHOAL_FUZZ_CHECK(kTarget, requests.storedBytes() <= o.maxStoredBytes);
  }
  return 0;
}
