#include "common/hmac_auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <cstddef>
#include <cstring>

#include "common/error.h"
#include "common/socket.h"

namespace shoal::auth {

namespace {

constexpr uint32_t kGreetingMagic = 0x52474853;  // "SHGR"
constexpr uint32_t kHelloMagic = 0x4c454853;     // "SHEL"
constexpr uint32_t kVerdictMagic = 0x45564853;   // "SHVE"
constexpr uint32_t kVersion = 2;

// The MAC covers every hello field before the MAC itself, so the identity claims (channel,
// group, ranks) are as authenticated as the secret.
void mac(const std::string& secret, char role, const Hello& hello, const uint8_t* nonceA,
         uint8_t* out) {
  std::string msg(1, role);
  msg.append(reinterpret_cast<const char*>(&hello), offsetof(Hello, mac));
  msg.append(reinterpret_cast<const char*>(nonceA), kNonceBytes);
  unsigned int len = kMacBytes;
  if (!HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
            reinterpret_cast<const uint8_t*>(msg.data()), msg.size(), out, &len)) {
    SHOAL_THROW(SystemError, "OpenSSL HMAC failed");
  }
}

void randomBytes(uint8_t* out, size_t n) {
  if (RAND_bytes(out, static_cast<int>(n)) != 1) {
    SHOAL_THROW(SystemError, "OpenSSL RAND_bytes failed");
  }
}

}  // namespace

bool equalMacs(const uint8_t* a, const uint8_t* b) {
  return CRYPTO_memcmp(a, b, kMacBytes) == 0;
}

Greeting makeGreeting(GreetingStatus status) {
  Greeting g{kGreetingMagic, kVersion, static_cast<uint32_t>(status), {}};
  randomBytes(g.nonce, kNonceBytes);
  return g;
}

Hello makeHello(const std::string& secret, const Greeting& greeting, Channel channel,
                uint32_t group, int32_t from, int32_t to) {
  Hello h{kHelloMagic, kVersion, static_cast<uint32_t>(channel), group, from, to, {}, {}};
  randomBytes(h.nonce, kNonceBytes);
  mac(secret, 'C', h, greeting.nonce, h.mac);
  return h;
}

Verdict refuse(VerdictCode code) {
  return Verdict{kVerdictMagic, static_cast<uint32_t>(code), {}};
}

namespace {
// The role letter of an acceptor's proof: 'A' accepts; each authenticated refusal has its own
// letter, so a proof for one code cannot be passed off as another.
char answerRole(VerdictCode code) {
  return code == VerdictCode::kAccepted ? 'A' : static_cast<char>('a' + static_cast<int>(code));
}
}  // namespace

Verdict answer(const std::string& secret, const Greeting& greeting, const Hello& hello,
               VerdictCode code) {
  Verdict v = refuse(code);
  mac(secret, answerRole(code), hello, greeting.nonce, v.mac);
  return v;
}

Verdict checkHello(const std::string& secret, const Greeting& greeting, const Hello& hello,
                   Channel channel, std::string* why) {
  if (hello.magic != kHelloMagic || hello.version != kVersion) {
    *why =
        fmt::format("not a Shoal hello (magic 0x{:08x}, version {})", hello.magic, hello.version);
    return refuse(VerdictCode::kWrongPeer);
  }
  uint8_t expected[kMacBytes];
  mac(secret, 'C', hello, greeting.nonce, expected);
  if (!equalMacs(expected, hello.mac)) {
    *why =
        fmt::format("connection claiming rank {} failed authentication (wrong secret)", hello.from);
    return refuse(VerdictCode::kWrongSecret);
  }
  if (hello.channel != static_cast<uint32_t>(channel)) {
    *why = fmt::format("hello for channel {} on a channel {} listener", hello.channel,
                       static_cast<uint32_t>(channel));
    return refuse(VerdictCode::kWrongPeer);
  }
  Verdict v = refuse(VerdictCode::kAccepted);
  mac(secret, 'A', hello, greeting.nonce, v.mac);
  // The acceptor's proof also covers the connector's nonce (part of the hello), so the
  // connector knows it was made for this exchange.
  return v;
}

VerdictCode checkVerdict(const std::string& secret, const Greeting& greeting, const Hello& hello,
                         const Verdict& verdict, const std::string& what) {
  if (verdict.magic != kVerdictMagic) {
    SHOAL_THROW(ProtocolError, "{}: not a Shoal handshake reply (magic 0x{:08x})", what,
                verdict.magic);
  }
  switch (static_cast<VerdictCode>(verdict.code)) {
    case VerdictCode::kAccepted:
    case VerdictCode::kDeparted:
    case VerdictCode::kAborted:
    case VerdictCode::kCollision:
      break;
    case VerdictCode::kWrongSecret:
      SHOAL_THROW(ProtocolError,
                  "{}: authentication failed: wrong job secret? (the other side rejected our "
                  "proof; check SHOAL_SECRET)",
                  what);
    case VerdictCode::kWrongPeer:
      SHOAL_THROW(ProtocolError, "{}: rejected: the other side expected another group or rank",
                  what);
    default:
      SHOAL_THROW(ProtocolError, "{}: unknown handshake verdict {}", what, verdict.code);
  }
  const auto code = static_cast<VerdictCode>(verdict.code);
  uint8_t expected[kMacBytes];
  mac(secret, answerRole(code), hello, greeting.nonce, expected);
  if (!equalMacs(expected, verdict.mac)) {
    SHOAL_THROW(ProtocolError,
                "{}: authentication failed: the other side could not prove the job secret "
                "(different SHOAL_SECRET, or not a Shoal process)",
                what);
  }
  return code;
}

GreetingStatus connect(int fd, const std::string& secret, Channel channel, uint32_t group,
                       int32_t from, int32_t to, const Deadline& deadline, const std::string& what,
                       VerdictCode* refusal) {
  Greeting g{};
  readAll(fd, &g, sizeof(g), deadline, what + ": handshake");
  if (g.magic != kGreetingMagic || g.version != kVersion) {
    SHOAL_THROW(ProtocolError, "{}: not a Shoal listener (greeting magic 0x{:08x}, version {})",
                what, g.magic, g.version);
  }
  switch (static_cast<GreetingStatus>(g.status)) {
    case GreetingStatus::kBusy:
      SHOAL_THROW(PeerError, "{}: refused: the listener is at its connection limit", what);
    case GreetingStatus::kOpen:
      if (!secret.empty()) {
        SHOAL_THROW(ProtocolError,
                    "{}: authentication failed: the listener has no job secret (not started "
                    "with this job's SHOAL_SECRET); refusing to talk to it",
                    what);
      }
      return GreetingStatus::kOpen;
    case GreetingStatus::kChallenge:
      break;
    default:
      SHOAL_THROW(ProtocolError, "{}: unknown greeting status {}", what, g.status);
  }
  if (secret.empty()) {
    SHOAL_THROW(ProtocolError,
                "{}: authentication failed: the listener requires the job secret and none is "
                "configured (set SHOAL_SECRET)",
                what);
  }
  Hello h = makeHello(secret, g, channel, group, from, to);
  writeAll(fd, &h, sizeof(h), deadline, what + ": handshake");
  Verdict v{};
  try {
    readAll(fd, &v, sizeof(v), deadline, what + ": handshake");
  } catch (const PeerError&) {
    // A caller that takes refusals (a data connection's dialer) knows that the acceptor may be
    // going away with its process: the close is its to judge.
    if (refusal) throw;
    // Acceptors always answer a well-formed hello before closing; a close here means the
    // other side is not a current Shoal acceptor.
    SHOAL_THROW(ProtocolError, "{}: authentication failed: closed during the handshake", what);
  }
  const VerdictCode code = checkVerdict(secret, g, h, v, what);
  if (refusal) {
    *refusal = code;
  } else if (code != VerdictCode::kAccepted) {
    SHOAL_THROW(ProtocolError, "{}: refused (verdict {})", what, v.code);
  }
  return GreetingStatus::kChallenge;
}

}  // namespace shoal::auth
