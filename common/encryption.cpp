#include "common/encryption.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "common/error.h"
#include "common/socket.h"

namespace shoal {

std::string_view toString(EncryptMode mode) {
  switch (mode) {
    case EncryptMode::kOff:
      return "off";
    case EncryptMode::kOn:
      return "on";
    case EncryptMode::kAuto:
      return "auto";
  }
  return "invalid";
}

EncryptMode parseEncryptMode(std::string_view v) {
  if (v == "0" || v == "off") return EncryptMode::kOff;
  if (v == "1" || v == "on") return EncryptMode::kOn;
  if (v == "auto") return EncryptMode::kAuto;
  SHOAL_THROW(InvalidArgument, "'{}': expected 0, off, 1, on or auto", v);
}

namespace encryption {

namespace {

// "requires TLS (SHOAL_ENCRYPT=auto, across hosts)" and the like, for conflict messages.
std::string describe(const Offer& o) {
  const auto mode = static_cast<EncryptMode>(o.mode);
  const auto stance = static_cast<Stance>(o.stance);
  return fmt::format(
      "{} TLS (SHOAL_ENCRYPT={}{})",
      stance == Stance::kRequire  ? "requires"
      : stance == Stance::kRefuse ? "refuses"
                                  : "allows",
      toString(mode),
      mode == EncryptMode::kAuto && stance == Stance::kRequire ? ", across hosts" : "");
}

bool valid(const Offer& o) {
  return o.mode <= static_cast<uint8_t>(EncryptMode::kAuto) &&
         o.stance >= static_cast<uint8_t>(Stance::kRefuse) &&
         o.stance <= static_cast<uint8_t>(Stance::kRequire);
}

}  // namespace

Offer makeOffer(EncryptMode mode, bool crossesHosts) {
  Stance s = Stance::kAllow;
  if (mode == EncryptMode::kOff) s = Stance::kRefuse;
  if (mode == EncryptMode::kOn || (mode == EncryptMode::kAuto && crossesHosts)) {
    s = Stance::kRequire;
  }
  return Offer{static_cast<uint8_t>(mode), static_cast<uint8_t>(s)};
}

std::optional<bool> decide(const Offer& mine, const Offer& theirs, std::string* why) {
  if (!valid(theirs)) {
    *why = fmt::format("malformed encryption offer (mode {}, stance {}) from the peer", theirs.mode,
                       theirs.stance);
    return std::nullopt;
  }
  const auto a = static_cast<Stance>(mine.stance), b = static_cast<Stance>(theirs.stance);
  if ((a == Stance::kRequire && b == Stance::kRefuse) ||
      (a == Stance::kRefuse && b == Stance::kRequire)) {
    *why = fmt::format(
        "encryption settings disagree: this side {} and the peer {}; set SHOAL_ENCRYPT alike on "
        "every rank and the launcher",
        describe(mine), describe(theirs));
    return std::nullopt;
  }
  return a == Stance::kRequire || b == Stance::kRequire;
}

bool negotiate(int fd, EncryptMode mode, bool crossesHosts, const Deadline& deadline,
               const std::string& what) {
  const Offer mine = makeOffer(mode, crossesHosts);
  Offer theirs{};
  // Both ends write before they read: two bytes always fit an idle socket, so neither waits on
  // the other's read.
  writeAll(fd, &mine, sizeof(mine), deadline, what + ": encryption offer");
  readAll(fd, &theirs, sizeof(theirs), deadline, what + ": encryption offer");
  std::string why;
  auto d = decide(mine, theirs, &why);
  if (!d) SHOAL_THROW(ProtocolError, "{}: {}", what, why);
  return *d;
}

std::string derivePsk(const std::string& secret, std::string_view purpose) {
  const std::string label = fmt::format("shoal-tls-psk|v1|{}", purpose);
  std::string key(32, '\0');
  unsigned int len = static_cast<unsigned int>(key.size());
  if (!HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
            reinterpret_cast<const unsigned char*>(label.data()), label.size(),
            reinterpret_cast<unsigned char*>(key.data()), &len) ||
      len != key.size()) {
    SHOAL_THROW(SystemError, "OpenSSL HMAC failed while deriving a TLS key");
  }
  return key;
}

}  // namespace encryption
}  // namespace shoal
