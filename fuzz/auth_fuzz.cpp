// The authentication handshake (common/hmac_auth.h, transport/auth.h) against a peer that sends
// arbitrary bytes, over a socketpair whose other end holds the fuzzed bytes followed by
// end-of-file. The first input byte picks the side: bit 0 set, the acceptor (a rank accepting a
// data connection: the fuzzed bytes are the connector's hello); clear, the connector (the fuzzed
// bytes are the acceptor's greeting and verdict). Bit 1 picks the store's channel instead of the
// data channel: the store client's connect, and the check the store server's event loop makes of
// a hello (auth::checkHello, which it calls without a socket).
//
// Oracle: every handshake ends in a typed error well within its deadline (the fuzzer cannot
// forge the HMAC, so none may succeed), and never reads past what the peer sent or hangs.
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "common/hmac_auth.h"
#include "common/socket.h"
#include "fuzz/fuzz_util.h"
#include "transport/auth.h"

using namespace shoal;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  constexpr const char* kTarget = "auth";
  if (size < 1 || size > 64 * 1024) return 0;  // the socket buffer holds the whole input
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    fuzz::finding(kTarget, "socketpair failed");
  }
  Fd mine(sv[0]), peer(sv[1]);
  const bool acceptor = data[0] & 1;
  const bool store = data[0] & 2;
  if (size > 1) {
    const Deadline writeDeadline(seconds(5));
    writeAll(peer.get(), data + 1, size - 1, writeDeadline, "fuzz peer");
  }
  ::shutdown(peer.get(), SHUT_WR);

  const std::string secret = "fuzz-secret";
  const uint32_t group = 0x5eed0001;
  const auto start = Clock::now();
  const Deadline deadline(seconds(5));
  if (acceptor && store) {
    // The store server reads a whole hello before checking it; a shorter input is a client that
    // never finished (its idle limit closes it).
    if (size - 1 < sizeof(auth::Hello)) return 0;
    auth::Hello hello;
    std::memcpy(&hello, data + 1, sizeof(hello));
    const auth::Greeting greeting = auth::makeGreeting(auth::GreetingStatus::kChallenge);
    std::string why;
    const auth::Verdict v = auth::checkHello(secret, greeting, hello, auth::Channel::kStore, &why);
    SHOAL_FUZZ_CHECK(kTarget, v.code != static_cast<uint32_t>(auth::VerdictCode::kAccepted));
    SHOAL_FUZZ_CHECK(kTarget, !why.empty());
    return 0;
  }
  const bool ok = fuzz::expectTypedErrors(kTarget, [&] {
    if (acceptor) {
      (void)transport::authenticateAcceptor(mine.get(), secret, group, 0, 4, deadline);
    } else if (store) {
      (void)auth::connect(mine.get(), secret, auth::Channel::kStore, 0, -1, -1, deadline,
                          "fuzz store client");
    } else {
      transport::authenticateConnector(mine.get(), secret, group, 2, 0, deadline);
    }
  });
  SHOAL_FUZZ_CHECK(kTarget, !ok);
  // End-of-file answers every read at once: taking anywhere near the deadline means a wait
  // that does not notice the peer is gone.
  SHOAL_FUZZ_CHECK(kTarget, Clock::now() - start < seconds(2));
  return 0;
}
