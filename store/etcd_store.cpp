#include "store/etcd_store.h"

#include <fmt/format.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>
#include <tuple>

#include "common/error.h"
#include "common/tls_client.h"

namespace shoal::store {

namespace {

using nlohmann::json;

constexpr size_t kMaxReply = 1 << 20;
constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::string base64(const std::string& in) {
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  for (size_t i = 0; i < in.size(); i += 3) {
    uint32_t n = static_cast<uint8_t>(in[i]) << 16;
    if (i + 1 < in.size()) n |= static_cast<uint8_t>(in[i + 1]) << 8;
    if (i + 2 < in.size()) n |= static_cast<uint8_t>(in[i + 2]);
    out += kAlphabet[(n >> 18) & 63];
    out += kAlphabet[(n >> 12) & 63];
    out += i + 1 < in.size() ? kAlphabet[(n >> 6) & 63] : '=';
    out += i + 2 < in.size() ? kAlphabet[n & 63] : '=';
  }
  return out;
}

std::string unbase64(const std::string& in, const std::string& what) {
  std::string out;
  uint32_t acc = 0;
  int bits = 0;
  for (char c : in) {
    if (c == '=') break;
    const char* at = std::strchr(kAlphabet, c);
    if (c == '\0' || at == nullptr)
      SHOAL_THROW(StoreError, "{}: malformed base64 in a reply", what);
    acc = (acc << 6) | static_cast<uint32_t>(at - kAlphabet);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((acc >> bits) & 0xff);
    }
  }
  return out;
}

// etcd's JSON gateway prints int64 fields as strings.
int64_t jsonInt(const json& j, const char* field) {
  if (!j.contains(field)) return 0;
  const auto& v = j.at(field);
  if (v.is_number_integer()) return v.get<int64_t>();
  return std::stoll(v.get<std::string>());
}

// The status and body of an HTTP/1.1 reply read to the end of the connection: chunked or not.
std::pair<int, std::string> httpReply(const std::string& reply, const std::string& what) {
  const auto end = reply.find("\r\n\r\n");
  if (reply.compare(0, 9, "HTTP/1.1 ") != 0 || end == std::string::npos) {
    SHOAL_THROW(StoreError, "{}: not an HTTP reply", what);
  }
  const int status = std::atoi(reply.c_str() + 9);
  std::string head = reply.substr(0, end);
  std::transform(head.begin(), head.end(), head.begin(), ::tolower);
  std::string body = reply.substr(end + 4);
  if (head.find("transfer-encoding: chunked") != std::string::npos) {
    std::string plain;
    size_t at = 0;
    while (true) {
      const auto eol = body.find("\r\n", at);
      if (eol == std::string::npos) SHOAL_THROW(StoreError, "{}: truncated chunked reply", what);
      const size_t n = std::strtoul(body.c_str() + at, nullptr, 16);
      if (n == 0) break;
      if (eol + 2 + n > body.size()) SHOAL_THROW(StoreError, "{}: truncated chunk", what);
      plain.append(body, eol + 2, n);
      at = eol + 2 + n + 2;
    }
    body = std::move(plain);
  }
  return {status, std::move(body)};
}

// etcd's error text in a reply body ({"error": ..., "code": ...}), else the body's start.
std::string etcdError(const std::string& body) {
  const auto j = json::parse(body, nullptr, false);
  if (!j.is_discarded() && j.is_object()) {
    if (j.contains("message") && j["message"].is_string()) return j["message"];
    if (j.contains("error") && j["error"].is_string()) return j["error"];
  }
  return body.substr(0, 200);
}

// Refusals that a new token may cure: the token expired or was revoked.
bool tokenRefused(int status, const std::string& body) {
  return status == 401 || body.find("invalid auth token") != std::string::npos;
}

// One request's connection to etcd: plain TCP, or TLS over it when `tls` is given, so that a
// request is written once for both.
class Connection {
 public:
  // Connected, and for TLS past the handshake (verification included), by `deadline`.
  Connection(const HostPort& address, const std::shared_ptr<const tls::ClientContext>& tls,
             const Deadline& deadline, const std::string& what)
      : fd_(connectTcp(address, deadline, what)), what_(what) {
    if (tls) {
      secure_.emplace(tls, fd_.get(), address.host, what);
      secure_->handshake(deadline);
    }
  }

  void writeAll(const std::string& data, const Deadline& deadline) {
    if (secure_) {
      secure_->writeAll(data.data(), data.size(), deadline);
    } else {
      shoal::writeAll(fd_.get(), data.data(), data.size(), deadline, what_);
    }
  }

  // At least one byte and at most n; 0 at the end of the reply. StoreError ("no reply within")
  // when nothing came by `deadline`.
  size_t read(char* buf, size_t n, const Deadline& deadline) {
    if (secure_) {
      try {
        return secure_->read(buf, n, deadline);
      } catch (const TimeoutError&) {
        noReply(deadline);
      }
    }
    while (true) {
      if (!pollFor(fd_.get(), POLLIN, deadline)) noReply(deadline);
      const ssize_t r = ::read(fd_.get(), buf, n);
      if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (r < 0) throwSystemError("read from " + what_, errno);
      return static_cast<size_t>(r);
    }
  }

 private:
  [[noreturn]] void noReply(const Deadline& deadline) const {
    SHOAL_THROW(StoreError, "{}: no reply within {:.1f} s", what_, deadline.timeoutSeconds());
  }

  Fd fd_;
  // Declared after fd_: destroyed (its TLS state freed) before the socket closes.
  std::optional<tls::ClientConnection> secure_;
  std::string what_;
};

}  // namespace

bool EtcdAddress::matches(const std::string& url) {
  return url.rfind("etcd://", 0) == 0 || url.rfind("etcds://", 0) == 0;
}

EtcdAddress EtcdAddress::parse(const std::string& url) {
  if (!matches(url)) {
    SHOAL_THROW(InvalidArgument, "'{}' is not an etcd://host:port or etcds://host:port URL", url);
  }
  EtcdAddress a;
  a.tls = url.rfind("etcds://", 0) == 0;
  std::string rest = url.substr(a.tls ? 8 : 7);
  const auto slash = rest.find('/');
  if (slash != std::string::npos) {
    a.ns = rest.substr(slash + 1);
    rest = rest.substr(0, slash);
    while (!a.ns.empty() && a.ns.back() == '/') a.ns.pop_back();
    if (a.ns.empty()) SHOAL_THROW(InvalidArgument, "'{}': empty etcd namespace", url);
  }
  a.address = parseHostPort(rest);
  return a;
}

EtcdCredentials EtcdCredentials::fromEnvironment(const EnvReader& env) {
  EtcdCredentials c;
  c.user = env("SHOAL_ETCD_USER").value_or("");
  const auto file = env("SHOAL_ETCD_PASSWORD_FILE");
  const auto password = env("SHOAL_ETCD_PASSWORD");
  if (file) {
    std::ifstream in(*file);
    std::error_code ec;
    const auto size = std::filesystem::file_size(*file, ec);
    if (!in || ec) {
      SHOAL_THROW(InvalidArgument, "SHOAL_ETCD_PASSWORD_FILE={}: cannot be read", *file);
    }
    if (size > 4096) {
      SHOAL_THROW(InvalidArgument, "SHOAL_ETCD_PASSWORD_FILE={}: {} bytes, more than 4096", *file,
                  size);
    }
    std::getline(in, c.password);
    if (!c.password.empty() && c.password.back() == '\r') c.password.pop_back();
  } else if (password) {
    c.password = *password;
  }
  if (c.user.empty() && !c.password.empty()) {
    SHOAL_THROW(InvalidArgument, "an etcd password is set but no SHOAL_ETCD_USER");
  }
  if (!c.user.empty() && c.password.empty()) {
    SHOAL_THROW(InvalidArgument,
                "SHOAL_ETCD_USER={} has no password: set SHOAL_ETCD_PASSWORD_FILE (or "
                "SHOAL_ETCD_PASSWORD)",
                c.user);
  }
  return c;
}

std::string EtcdTls::variables() const {
  std::string out;
  for (const auto& [name, value] :
       {std::pair<const char*, const std::string*>{"SHOAL_ETCD_CACERT", &caFile},
        {"SHOAL_ETCD_CERT", &certFile},
        {"SHOAL_ETCD_KEY", &keyFile}}) {
    if (value->empty()) continue;
    if (!out.empty()) out += ", ";
    out += name;
  }
  return out;
}

EtcdTls EtcdTls::fromEnvironment(const EnvReader& env) {
  EtcdTls t;
  for (const auto& [name, field] :
       {std::pair<const char*, std::string*>{"SHOAL_ETCD_CACERT", &t.caFile},
        {"SHOAL_ETCD_CERT", &t.certFile},
        {"SHOAL_ETCD_KEY", &t.keyFile}}) {
    const auto value = env(name);
    if (!value) continue;
    if (value->empty())
      SHOAL_THROW(InvalidArgument, "{} is set but empty: expected a PEM file", name);
    if (!std::ifstream(*value)) SHOAL_THROW(InvalidArgument, "{}={}: cannot be read", name, *value);
    *field = *value;
  }
  if (t.certFile.empty() != t.keyFile.empty()) {
    SHOAL_THROW(InvalidArgument,
                "{} is set without {}: a client certificate needs both the certificate and its key",
                t.certFile.empty() ? "SHOAL_ETCD_KEY" : "SHOAL_ETCD_CERT",
                t.certFile.empty() ? "SHOAL_ETCD_CERT" : "SHOAL_ETCD_KEY");
  }
  return t;
}

void EtcdTls::checkFor(const EtcdAddress& address) const {
  if (!address.tls && !empty()) {
    SHOAL_THROW(InvalidArgument,
                "{} set for the plain-HTTP etcd store etcd://{}: use etcds://{} for TLS, or unset "
                "them",
                variables(), address.address.str(), address.address.str());
  }
}

EtcdStore::EtcdStore(EtcdAddress address, Duration requestTimeout, EtcdCredentials credentials,
                     EtcdTls tls)
    : address_(std::move(address)),
      requestTimeout_(requestTimeout),
      credentials_(std::move(credentials)) {
  tls.checkFor(address_);
  if (address_.tls) {
    tlsContext_ = std::make_shared<const tls::ClientContext>(
        tls::ClientOptions{tls.caFile, tls.certFile, tls.keyFile});
  }
}

EtcdStore::~EtcdStore() = default;

std::string EtcdStore::what() const {
  return fmt::format("etcd store {}{}", address_.tls ? "etcds://" : "", address_.address.str());
}

std::pair<int, std::string> EtcdStore::request(const std::string& path, const std::string& body,
                                               const std::string& token) {
  const std::string what = this->what();
  const Deadline deadline(requestTimeout_);
  std::string lastError;
  // A connection refused (an etcd member restarting) is tried again until the deadline.
  while (true) {
    try {
      Connection connection(address_.address, tlsContext_, deadline, what);
      const std::string request = fmt::format(
          "POST {} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n{}Content-Length: "
          "{}\r\nConnection: close\r\n\r\n{}",
          path, address_.address.str(),
          token.empty() ? std::string() : "Authorization: " + token + "\r\n", body.size(), body);
      connection.writeAll(request, deadline);
      std::string reply;
      char buf[16384];
      while (true) {
        const size_t n = connection.read(buf, sizeof buf, deadline);
        if (n == 0) break;
        if (reply.size() + n > kMaxReply) {
          SHOAL_THROW(StoreError, "{}: a reply above {} bytes", what, kMaxReply);
        }
        reply.append(buf, n);
      }
      return httpReply(reply, what);
    } catch (const StoreError&) {
      throw;
    } catch (const InvalidArgument&) {
      throw;  // a host name TLS cannot check: no retry cures it
    } catch (const ProtocolError& e) {
      // TLS refused (a certificate that does not verify, etcd refusing this client): trying
      // again would meet the same refusal until the deadline.
      SHOAL_THROW(StoreError, "{}", e.what());
    } catch (const Error& e) {
      lastError = e.what();
    }
    if (deadline.expired()) {
      SHOAL_THROW(StoreError, "{}: unreachable within {:.1f} s: {}", what,
                  deadline.timeoutSeconds(), lastError);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

std::string EtcdStore::authenticate() {
  const auto [status, body] =
      request("/v3/auth/authenticate",
              json{{"name", credentials_.user}, {"password", credentials_.password}}.dump(), "");
  const auto reply = json::parse(body, nullptr, false);
  if (status != 200 || reply.is_discarded() || !reply.contains("token") ||
      !reply["token"].is_string() || reply["token"].get<std::string>().empty()) {
    SHOAL_THROW(StoreError, "{}: etcd refused user '{}': {}", what(), credentials_.user,
                status == 200 ? "no token in its reply" : etcdError(body));
  }
  return reply["token"].get<std::string>();
}

std::string EtcdStore::post(const std::string& path, const std::string& body) {
  std::string token;
  if (!credentials_.empty()) {
    std::lock_guard<std::mutex> lock(tokenMutex_);
    if (token_.empty()) token_ = authenticate();
    token = token_;
  }
  auto [status, reply] = request(path, body, token);
  if (!credentials_.empty() && tokenRefused(status, reply)) {
    {
      std::lock_guard<std::mutex> lock(tokenMutex_);
      // Another thread may have renewed it already.
      if (token_ == token) token_ = authenticate();
      token = token_;
    }
    std::tie(status, reply) = request(path, body, token);
  }
  if (status == 200) return reply;
  const std::string error = etcdError(reply);
  if (credentials_.empty() && (error.find("user name is empty") != std::string::npos ||
                               error.find("invalid auth token") != std::string::npos)) {
    SHOAL_THROW(StoreError,
                "{}: etcd has authentication on: set SHOAL_ETCD_USER and "
                "SHOAL_ETCD_PASSWORD_FILE",
                what());
  }
  SHOAL_THROW(StoreError, "{}: HTTP {}: {}", what(), status, error);
}

EtcdStore::Value EtcdStore::range(const std::string& key) {
  const auto reply =
      json::parse(post("/v3/kv/range", json{{"key", base64(full(key))}}.dump()), nullptr, false);
  if (reply.is_discarded()) SHOAL_THROW(StoreError, "etcd store: malformed range reply");
  Value v;
  if (reply.contains("kvs") && !reply["kvs"].empty()) {
    const auto& kv = reply["kvs"][0];
    v.exists = true;
    v.value = unbase64(kv.value("value", ""), "etcd store");
    v.modRevision = jsonInt(kv, "mod_revision");
  }
  return v;
}

void EtcdStore::set(const std::string& key, const std::string& value) {
  post("/v3/kv/put", json{{"key", base64(full(key))}, {"value", base64(value)}}.dump());
}

std::string EtcdStore::get(const std::string& key, Duration timeout) {
  wait({key}, timeout);
  return range(key).value;
}

int64_t EtcdStore::add(const std::string& key, int64_t delta) {
  const Deadline deadline(requestTimeout_);
  while (true) {
    const Value v = range(key);
    int64_t now = 0;
    if (v.exists) {
      try {
        size_t used = 0;
        now = std::stoll(v.value, &used);
        if (used != v.value.size()) throw std::invalid_argument("trailing");
      } catch (const std::exception&) {
        SHOAL_THROW(StoreError, "etcd store: key '{}' holds '{}', not a counter", key,
                    v.value.substr(0, 64));
      }
    }
    const int64_t sum = now + delta;
    // Put only if nobody changed the key since it was read (absent: created since).
    json cmp = v.exists ? json{{"key", base64(full(key))},
                               {"target", "MOD"},
                               {"result", "EQUAL"},
                               {"mod_revision", std::to_string(v.modRevision)}}
                        : json{{"key", base64(full(key))},
                               {"target", "CREATE"},
                               {"result", "EQUAL"},
                               {"create_revision", "0"}};
    json txn{{"compare", json::array({cmp})},
             {"success", json::array({json{{"request_put",
                                            {{"key", base64(full(key))},
                                             {"value", base64(std::to_string(sum))}}}}})}};
    const auto reply = json::parse(post("/v3/kv/txn", txn.dump()), nullptr, false);
    if (reply.is_discarded()) SHOAL_THROW(StoreError, "etcd store: malformed txn reply");
    if (reply.value("succeeded", false)) return sum;
    if (deadline.expired()) {
      SHOAL_THROW(StoreError, "etcd store: add to '{}' kept losing to other clients for {:.1f} s",
                  key, deadline.timeoutSeconds());
    }
  }
}

std::string EtcdStore::compareSet(const std::string& key, const std::string& expected,
                                  const std::string& desired) {
  // An absent key equals "": compare its creation (absent) or its value.
  json cmp = expected.empty() ? json{{"key", base64(full(key))},
                                     {"target", "CREATE"},
                                     {"result", "EQUAL"},
                                     {"create_revision", "0"}}
                              : json{{"key", base64(full(key))},
                                     {"target", "VALUE"},
                                     {"result", "EQUAL"},
                                     {"value", base64(expected)}};
  json txn{{"compare", json::array({cmp})},
           {"success",
            json::array(
                {json{{"request_put", {{"key", base64(full(key))}, {"value", base64(desired)}}}}})},
           {"failure", json::array({json{{"request_range", {{"key", base64(full(key))}}}}})}};
  const auto reply = json::parse(post("/v3/kv/txn", txn.dump()), nullptr, false);
  if (reply.is_discarded()) SHOAL_THROW(StoreError, "etcd store: malformed txn reply");
  if (reply.value("succeeded", false)) return desired;
  // Failed: the value the range inside the transaction saw.
  try {
    const auto& kvs = reply.at("responses").at(0).at("response_range").value("kvs", json::array());
    return kvs.empty() ? std::string() : unbase64(kvs[0].value("value", ""), "etcd store");
  } catch (const json::exception&) {
    SHOAL_THROW(StoreError, "etcd store: malformed txn reply");
  }
}

void EtcdStore::wait(const std::vector<std::string>& keys, Duration timeout) {
  const Deadline deadline(timeout);
  auto pause = std::chrono::milliseconds(10);
  while (!check(keys)) {
    if (deadline.expired()) {
      SHOAL_THROW(TimeoutError, "etcd store {}: keys [{}] did not appear within {:.1f} s",
                  address_.address.str(), joinKeys(keys), deadline.timeoutSeconds());
    }
    std::this_thread::sleep_for(std::min<Duration>(pause, deadline.remaining()));
    pause = std::min(pause * 2, std::chrono::milliseconds(100));
  }
}

bool EtcdStore::deleteKey(const std::string& key) {
  const auto reply = json::parse(
      post("/v3/kv/deleterange", json{{"key", base64(full(key))}}.dump()), nullptr, false);
  if (reply.is_discarded()) SHOAL_THROW(StoreError, "etcd store: malformed delete reply");
  return jsonInt(reply, "deleted") > 0;
}

bool EtcdStore::check(const std::vector<std::string>& keys) {
  for (const auto& k : keys) {
    if (!range(k).exists) return false;
  }
  return true;
}

}  // namespace shoal::store
