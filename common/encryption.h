// Which connections are encrypted (SHOAL_ENCRYPT), how the two ends of one agree on it, and the
// keys. The TLS itself is common/tls.h; this file is the policy around it, shared by the data
// links (transport/tcp/link_security.h) and the store (store/tcp_store.h).
//
// Modes:
//   off   never encrypt.
//   on    encrypt every TCP connection: data links between ranks (also on one host) and store
//         connections. Shared memory stays as it is (see below).
//   auto  (the default) encrypt what crosses hosts: a data link whose peer has another host
//         identity (hostname + boot id, what the bootstrap uses to choose shm vs TCP), and a
//         store connection unless both of its ends are loopback addresses.
// What stays in clear under auto: loopback TCP and shared memory between ranks of one host.
// Those bytes never leave this machine's kernel, and anyone who could read them (the same user,
// or root) can read the ranks' memory anyway: the memfd segments are opened only by the same
// user, through /proc/<pid>/fd. Encrypting them would cost a core's AES throughput for nothing.
//
// Agreement: right after the HMAC handshake (common/hmac_auth.h) each end sends an Offer (its
// mode and its stance on this very connection) and reads the other's. A stance is kRequire (on;
// auto on a connection that crosses hosts), kAllow (auto on one host) or kRefuse (off). The
// connection is encrypted when either end requires it, clear when either refuses it or both
// merely allow it, and fails when one requires and the other refuses: both ends then raise the
// same one-line error naming the peer and both settings (never a hang, never a silent
// downgrade). A side that requires encryption never sends a byte in clear after its offer,
// whatever the offer it reads says, so a forged offer can make a connection fail but never
// turn its encryption off.
//
// Keys: every connection's TLS pre-shared key is HMAC-SHA256(job secret, "shoal-tls-psk|v1|" +
// purpose), purpose naming the channel ("store", or "data|group <id>|ranks <lo>-<hi>"), so a key
// serves one purpose only and the secret itself never keys anything directly.
//
// All functions are thread-safe; negotiate() blocks up to its deadline.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "common/deadline.h"

namespace shoal {

enum class EncryptMode : uint8_t { kOff = 0, kOn = 1, kAuto = 2 };

std::string_view toString(EncryptMode mode);
// "0" / "off", "1" / "on", "auto". Throws InvalidArgument naming the value:
//   "'x': expected 0, off, 1, on or auto".
EncryptMode parseEncryptMode(std::string_view text);

namespace encryption {

enum class Stance : uint8_t { kRefuse = 1, kAllow = 2, kRequire = 3 };

#pragma pack(push, 1)
struct Offer {
  uint8_t mode;    // EncryptMode, for the error message
  uint8_t stance;  // Stance
};
#pragma pack(pop)

// This end's offer for a connection that does (or does not) cross hosts.
Offer makeOffer(EncryptMode mode, bool crossesHosts);

// Whether to encrypt, given both offers: true / false, or nullopt when they conflict (or the
// peer's offer is malformed), with *why set to a one-line reason naming both settings.
std::optional<bool> decide(const Offer& mine, const Offer& theirs, std::string* why);

// Blocking, on a connected socket right after authentication: sends this end's offer, reads
// the peer's, returns decide()'s answer. Throws ProtocolError "<what>: <why>" on a conflict,
// PeerError / TimeoutError (naming `what`) when the peer closes or stalls past the deadline.
bool negotiate(int fd, EncryptMode mode, bool crossesHosts, const Deadline& deadline,
               const std::string& what);

// The 32-byte TLS pre-shared key for `purpose` (see above). Throws SystemError if OpenSSL fails.
std::string derivePsk(const std::string& secret, std::string_view purpose);

}  // namespace encryption
}  // namespace shoal
