// The HMAC-SHA256 challenge-response every Shoal connection starts with: data connections
// between ranks (transport/auth.h) and store connections (store/tcp_store.h). It lives here,
// below both, so the store can authenticate without depending on the transport layer.
//
// Handshake (three messages, fixed sizes, the secret never on the wire):
//   acceptor  → connector: Greeting {magic, version, status, nonceA}
//   connector → acceptor:  Hello    {magic, version, channel, group, from, to, nonceC,
//                                    macC = HMAC(secret, "C" | hello fields | nonceA)}
//   acceptor  → connector: Verdict  {magic, verdict, macA = HMAC(secret, "A" | hello | nonceA)}
// The acceptor speaks first, so it can refuse a connection (at its connection limit) before the
// connector has sent anything, and a closed socket never discards an unread refusal. Each side
// proves the secret over both nonces of this very exchange (no replay), with a role letter so a
// proof cannot be reflected back. The acceptor checks the connector's proof before it sends its
// own, so a guesser learns nothing but "rejected". `channel` binds the proof to what the
// connection is for: a store client's hello cannot open a data connection, nor the reverse.
//
// Everything here is pure computation on fixed-size messages, so an event loop (the store
// server) and a thread (the bootstrap) can drive the acceptor side without blocking; the
// blocking connector side takes a deadline. No function keeps state between calls; all are
// thread-safe.
#pragma once

#include <cstdint>
#include <string>

#include "common/deadline.h"

namespace shoal::auth {

inline constexpr size_t kNonceBytes = 32;
inline constexpr size_t kMacBytes = 32;

// What a connection is for; part of the authenticated hello.
enum class Channel : uint32_t { kData = 1, kStore = 2 };

// The acceptor's first word to a new connection.
enum class GreetingStatus : uint32_t {
  kChallenge = 1,  // prove the secret (the nonce below is the challenge)
  kOpen = 2,       // this acceptor has no secret: no handshake, talk right away
  kBusy = 3,       // at its connection limit: closing; try again later
};

enum class VerdictCode : uint32_t {
  kAccepted = 1,
  kWrongSecret = 2,  // the connector's proof did not verify
  kWrongPeer = 3,    // proof fine, but the hello is for another group, rank or channel
  // Authenticated refusals of a data connection (transport/acceptor.h): the connector proved
  // the secret and the acceptor proves it back (its MAC covers the code), so the connector can
  // act on them: the group is gone here, this rank aborted it, or the pair is being connected
  // from the other side (Note [Simultaneous dial] in transport/mesh.cpp).
  kDeparted = 4,
  kAborted = 5,
  kCollision = 6,
};

#pragma pack(push, 1)
struct Greeting {
  uint32_t magic;
  uint32_t version;
  uint32_t status;  // GreetingStatus
  uint8_t nonce[kNonceBytes];
};
struct Hello {
  uint32_t magic;
  uint32_t version;
  uint32_t channel;  // Channel
  uint32_t group;    // data: the group id; store: 0
  int32_t from;      // data: the connecting rank; store: -1
  int32_t to;        // data: the accepting rank; store: -1
  uint8_t nonce[kNonceBytes];
  uint8_t mac[kMacBytes];
};
struct Verdict {
  uint32_t magic;
  uint32_t code;  // VerdictCode
  uint8_t mac[kMacBytes];
};
#pragma pack(pop)

// A greeting with a fresh random nonce (throws SystemError if OpenSSL's generator fails).
Greeting makeGreeting(GreetingStatus status);

// Connector: the hello answering `greeting`, proving `secret`.
Hello makeHello(const std::string& secret, const Greeting& greeting, Channel channel,
                uint32_t group, int32_t from, int32_t to);

// Acceptor: checks a received hello (magic, version, channel, proof) against the greeting it
// sent. Returns the verdict to send back: kAccepted (carrying the acceptor's own proof) or a
// refusal, with `why` set to a one-line reason for the log. Identity checks beyond the channel
// (group, ranks) are the caller's: it may turn kAccepted into kWrongPeer with refuse().
Verdict checkHello(const std::string& secret, const Greeting& greeting, const Hello& hello,
                   Channel channel, std::string* why);
Verdict refuse(VerdictCode code);
// Acceptor, for a hello that checkHello() accepted: an authenticated refusal (kDeparted,
// kAborted, kCollision) whose MAC proves the secret and binds the code to this exchange.
Verdict answer(const std::string& secret, const Greeting& greeting, const Hello& hello,
               VerdictCode code);

// Connector: checks the acceptor's verdict. Throws ProtocolError naming `what` when the acceptor
// refused ("authentication failed: wrong job secret?") or could not prove the secret itself.
// Returns kAccepted, or an authenticated refusal (see answer()) whose proof verified.
VerdictCode checkVerdict(const std::string& secret, const Greeting& greeting, const Hello& hello,
                         const Verdict& verdict, const std::string& what);

// Connector, blocking, on a connected non-blocking socket: reads the greeting and, if
// challenged, runs the whole handshake. Returns the greeting's status (kChallenge after a
// successful handshake, or kOpen when the acceptor has no secret and `secret` is empty).
// Throws, naming `what`: ProtocolError for a peer that is not a Shoal acceptor, refuses our
// proof, cannot prove its own, asks for a secret we do not have, or is open while we hold a
// secret (talking to an unauthenticated impostor would leak the job's data); PeerError if the
// acceptor is busy or closes; TimeoutError at the deadline. An authenticated refusal (see
// answer()) is returned in *refusal when the caller passes one, else thrown as ProtocolError;
// such a caller also gets a close before the verdict as the PeerError it is.
GreetingStatus connect(int fd, const std::string& secret, Channel channel, uint32_t group,
                       int32_t from, int32_t to, const Deadline& deadline, const std::string& what,
                       VerdictCode* refusal = nullptr);

// Compares in constant time (for MACs).
bool equalMacs(const uint8_t* a, const uint8_t* b);

}  // namespace shoal::auth
