#include "transport/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <sstream>

#include "common/error.h"
#include "common/socket.h"

namespace shoal::transport {

namespace {

constexpr uint32_t kHelloMagic = 0x4b414853;  // "SHAK"
constexpr uint32_t kOkMagic = 0x4b4f4853;     // "SHOK"
constexpr size_t kNonce = 32;
constexpr size_t kMac = 32;
constexpr size_t kGeneratedSecret = 32;

#pragma pack(push, 1)
struct Hello {
  uint32_t magic;
  uint32_t version;
  uint32_t group;
  int32_t from;
  int32_t to;
  uint8_t nonce[kNonce];
};
#pragma pack(pop)

void randomBytes(uint8_t* out, size_t n) {
  if (RAND_bytes(out, static_cast<int>(n)) != 1) {
    SHOAL_THROW(SystemError, "OpenSSL RAND_bytes failed");
  }
}

void mac(const std::string& secret, char role, const Hello& hello, const uint8_t* nonceA,
         uint8_t* out) {
  std::string msg(1, role);
  msg.append(reinterpret_cast<const char*>(&hello), sizeof(hello));
  msg.append(reinterpret_cast<const char*>(nonceA), kNonce);
  unsigned int len = kMac;
  if (!HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
            reinterpret_cast<const uint8_t*>(msg.data()), msg.size(), out, &len)) {
    SHOAL_THROW(SystemError, "OpenSSL HMAC failed");
  }
}

}  // namespace

std::string generateSecret() {
  uint8_t b[32];
  randomBytes(b, sizeof(b));
  std::string hex;
  for (uint8_t c : b) hex += fmt::format("{:02x}", c);
  return hex;
}

void authenticateConnector(int fd, const std::string& secret, uint32_t group, int rank, int peer,
                           const Deadline& deadline) {
  const std::string what = fmt::format("rank {} → peer {}: handshake", rank, peer);
  Hello hello{kHelloMagic, 1, group, rank, peer, {}};
  randomBytes(hello.nonce, kNonce);
  writeAll(fd, &hello, sizeof(hello), deadline, what);
  uint8_t reply[kNonce + kMac];
  readAll(fd, reply, sizeof(reply), deadline, what);
  uint8_t expected[kMac];
  mac(secret, 'A', hello, reply, expected);
  if (CRYPTO_memcmp(expected, reply + kNonce, kMac) != 0) {
    SHOAL_THROW(ProtocolError,
                "{}: the peer could not prove the job secret (different SHOAL_SECRET, or not a "
                "Shoal rank)",
                what);
  }
  uint8_t proof[kMac];
  mac(secret, 'C', hello, reply, proof);
  writeAll(fd, proof, kMac, deadline, what);
  uint32_t ok = 0;
  readAll(fd, &ok, sizeof(ok), deadline, what);
  if (ok != kOkMagic) SHOAL_THROW(ProtocolError, "{}: rejected by the peer", what);
}

int authenticateAcceptor(int fd, const std::string& secret, uint32_t group, int rank, int size,
                         const Deadline& deadline) {
  const std::string what = fmt::format("rank {}: handshake with an incoming connection", rank);
  Hello hello{};
  readAll(fd, &hello, sizeof(hello), deadline, what);
  if (hello.magic != kHelloMagic || hello.version != 1) {
    SHOAL_THROW(ProtocolError, "{}: not a Shoal hello (magic 0x{:08x})", what, hello.magic);
  }
  if (hello.group != group || hello.to != rank || hello.from <= rank || hello.from >= size) {
    SHOAL_THROW(ProtocolError,
                "{}: hello for group {:08x} from rank {} to rank {} (this is group "
                "{:08x}, rank {} of {})",
                what, hello.group, hello.from, hello.to, group, rank, size);
  }
  uint8_t reply[kNonce + kMac];
  randomBytes(reply, kNonce);
  mac(secret, 'A', hello, reply, reply + kNonce);
  writeAll(fd, reply, sizeof(reply), deadline, what);
  uint8_t proof[kMac], expected[kMac];
  readAll(fd, proof, kMac, deadline, what);
  mac(secret, 'C', hello, reply, expected);
  if (CRYPTO_memcmp(expected, proof, kMac) != 0) {
    SHOAL_THROW(ProtocolError,
                "{}: connection claiming rank {} failed authentication (wrong "
                "secret)",
                what, hello.from);
  }
  uint32_t ok = kOkMagic;
  writeAll(fd, &ok, sizeof(ok), deadline, what);
  return hello.from;
}

JobSecret resolveJobSecret(const std::optional<std::string>& secret,
                           const std::optional<std::string>& secretFile, store::Store& store,
                           int rank, Duration timeout) {
  if (secret) return {*secret, nullptr};
  if (secretFile) {
    std::ifstream in(*secretFile, std::ios::binary);
    if (!in) SHOAL_THROW(InvalidArgument, "SHOAL_SECRET_FILE {}: cannot be read", *secretFile);
    std::ostringstream ss;
    ss << in.rdbuf();
    std::string s = ss.str();
    while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
    if (s.empty()) SHOAL_THROW(InvalidArgument, "SHOAL_SECRET_FILE {} is empty", *secretFile);
    return {s, nullptr};
  }
  const std::string host = shm::hostIdentity();
  if (rank == 0) {
    auto seg = shm::Segment::create(kGeneratedSecret, "shoal-secret");
    randomBytes(static_cast<uint8_t*>(seg->data()), kGeneratedSecret);
    store.set("secret/location", fmt::format("{}|{}|{}", host, ::getpid(), seg->fd()));
    return {std::string(static_cast<char*>(seg->data()), kGeneratedSecret), seg};
  }
  std::string loc = store.get("secret/location", timeout);
  auto bar1 = loc.find('|'), bar2 = loc.rfind('|');
  if (bar1 == std::string::npos || bar1 == bar2) {
    SHOAL_THROW(ProtocolError, "malformed secret location '{}' in the store", loc);
  }
  if (loc.substr(0, bar1) != host) {
    SHOAL_THROW(InvalidArgument,
                "rank {}: no SHOAL_SECRET or SHOAL_SECRET_FILE is set and the ranks are on "
                "several hosts; set one of them (the launcher does) so ranks can authenticate",
                rank);
  }
  pid_t pid = std::stoi(loc.substr(bar1 + 1, bar2 - bar1 - 1));
  int fd = std::stoi(loc.substr(bar2 + 1));
  auto seg = shm::Segment::open(pid, fd, kGeneratedSecret);
  return {std::string(static_cast<char*>(seg->data()), kGeneratedSecret), nullptr};
}

}  // namespace shoal::transport
