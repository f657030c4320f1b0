#include "transport/auth.h"

#include <openssl/rand.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "common/error.h"
#include "common/socket.h"

namespace shoal::transport {

namespace {

constexpr size_t kGeneratedSecret = 32;

void randomBytes(uint8_t* out, size_t n) {
  if (RAND_bytes(out, static_cast<int>(n)) != 1) {
    SHOAL_THROW(SystemError, "OpenSSL RAND_bytes failed");
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
  auth::connect(fd, secret, auth::Channel::kData, group, rank, peer, deadline,
                fmt::format("rank {} → peer {}", rank, peer));
}

std::optional<std::string> misaddressed(const auth::Hello& hello, uint32_t group, int rank,
                                        int size) {
  if (hello.group == group && hello.to == rank && hello.from >= 0 && hello.from < size &&
      hello.from != rank) {
    return std::nullopt;
  }
  return fmt::format(
      "hello for group {:08x} from rank {} to rank {} (this is group {:08x}, rank {} of {})",
      hello.group, hello.from, hello.to, group, rank, size);
}

auth::Verdict checkDataHello(const std::string& secret, const auth::Greeting& greeting,
                             const auth::Hello& hello, uint32_t group, int rank, int size,
                             int* from, std::string* why) {
  auth::Verdict v = auth::checkHello(secret, greeting, hello, auth::Channel::kData, why);
  if (v.code != static_cast<uint32_t>(auth::VerdictCode::kAccepted)) return v;
  if (auto wrong = misaddressed(hello, group, rank, size)) {
    *why = *wrong;
    return auth::refuse(auth::VerdictCode::kWrongPeer);
  }
  *from = hello.from;
  return v;
}

int authenticateAcceptor(int fd, const std::string& secret, uint32_t group, int rank, int size,
                         const Deadline& deadline) {
  const std::string what = fmt::format("rank {}: handshake with an incoming connection", rank);
  const auth::Greeting greeting = auth::makeGreeting(auth::GreetingStatus::kChallenge);
  writeAll(fd, &greeting, sizeof(greeting), deadline, what);
  auth::Hello hello{};
  readAll(fd, &hello, sizeof(hello), deadline, what);
  int from = -1;
  std::string why;
  auth::Verdict v = checkDataHello(secret, greeting, hello, group, rank, size, &from, &why);
  writeAll(fd, &v, sizeof(v), deadline, what);
  if (v.code != static_cast<uint32_t>(auth::VerdictCode::kAccepted)) {
    SHOAL_THROW(ProtocolError, "{}: {}", what, why);
  }
  return from;
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
  int pid = 0, fd = 0;
  char tail = 0;
  if (std::sscanf(loc.c_str() + bar1 + 1, "%d|%d%c", &pid, &fd, &tail) != 2 || pid <= 0 || fd < 0) {
    SHOAL_THROW(ProtocolError, "malformed secret location '{}' in the store", loc);
  }
  auto seg = shm::Segment::open(pid, fd, kGeneratedSecret);
  return {std::string(static_cast<char*>(seg->data()), kGeneratedSecret), nullptr};
}

}  // namespace shoal::transport
