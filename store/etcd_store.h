// A store kept in etcd (the store torchrun's elastic rendezvous uses): the job's rendezvous and
// elastic membership then survive the loss of any worker host, and of etcd members while a
// quorum remains. Selected by SHOAL_STORE_ADDR=etcd://host:port[/namespace] (plain HTTP) or
// etcds://host:port[/namespace] (HTTPS: TLS, below).
//
// Speaks etcd's v3 API through its JSON gateway (POST /v3/kv/range, put, deleterange, txn;
// keys and values base64), one HTTP/1.1 connection per request: the rendezvous makes few
// requests, and a new connection finds a restarted etcd member by itself. Every key is put
// under "<namespace>/" (default "shoal"): give each job its own namespace.
// - add and compareSet are etcd transactions (compare the key's revision or value, then put), so
//   they are atomic whatever the number of clients; add retries when another client won.
// - get and wait look for their keys every 10 ms to 100 ms (doubling) until their deadline:
//   the gateway's watch is a streaming call this client does not hold open.
// - etcd's authentication (EtcdCredentials: a user and its password, from SHOAL_ETCD_USER and
//   SHOAL_ETCD_PASSWORD_FILE): the store asks etcd for a token (/v3/auth/authenticate) before
//   its first request and sends it with each; a token etcd no longer accepts (it expired:
//   etcd's --auth-token-ttl, 5 minutes idle by default) is renewed once and the request sent
//   again. Without credentials, an etcd with authentication on answers with a StoreError saying
//   to set them.
// - TLS (EtcdTls, etcds:// only; etcd started with --cert-file/--key-file): every connection
//   is TLS 1.2 or later (common/tls_client.h) and verifies etcd's certificate chain, against
//   the CA in SHOAL_ETCD_CACERT or else the system's trust store, and that the certificate
//   names the URL's host (a DNS name, sent as SNI, or an IP address SAN for an IP literal).
//   SHOAL_ETCD_CERT and SHOAL_ETCD_KEY give a client certificate for etcd's
//   --client-cert-auth. A refused certificate is a StoreError naming the address and OpenSSL's
//   reason ("certificate verify failed: IP address mismatch"), at once: it is not retried.
//   With plain etcd:// the password and the keys travel in clear, so keep such an etcd on a
//   network only the job reaches; TLS variables set with an etcd:// URL are an error, never
//   ignored. The job's data connections are authenticated by the job secret
//   (transport/auth.h) whatever the store.
//
// Threads: every call is independent and thread-safe. Errors: an unreachable etcd, an HTTP
// error or a malformed reply is StoreError naming the address; get and wait throw TimeoutError
// naming the missing keys. Each request (connect, TLS handshake, send, reply) is bounded by the
// request timeout. Replies are size-checked before they are buffered (1 MiB at most).
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "common/deadline.h"
#include "common/env.h"
#include "common/socket.h"
#include "store/store.h"

namespace shoal::tls {
class ClientContext;  // common/tls_client.h
}

namespace shoal::store {

// "etcd://host:port[/namespace]" or "etcds://..." (TLS) -> address, namespace and whether TLS;
// InvalidArgument (one line) for anything else.
struct EtcdAddress {
  HostPort address;
  std::string ns = "shoal";
  bool tls = false;                             // etcds://
  static bool matches(const std::string& url);  // starts with etcd:// or etcds://
  static EtcdAddress parse(const std::string& url);
};

// An etcd user (etcd's role-based access control); empty: no authentication.
struct EtcdCredentials {
  std::string user, password;
  bool empty() const { return user.empty(); }
  // SHOAL_ETCD_USER with SHOAL_ETCD_PASSWORD_FILE (its first line; a file keeps the password
  // out of the environment that `ps e` shows) or SHOAL_ETCD_PASSWORD. InvalidArgument (one
  // line) for a user without a password, a password without a user, or a password file that
  // cannot be read or is over 4 KiB.
  static EtcdCredentials fromEnvironment(const EnvReader& env);
};

// TLS settings for an etcds:// store: files, PEM. All empty: the system's trust store and no
// client certificate.
struct EtcdTls {
  std::string caFile;    // SHOAL_ETCD_CACERT: the CA that signed etcd's certificate
  std::string certFile;  // SHOAL_ETCD_CERT: a client certificate (etcd's --client-cert-auth)
  std::string keyFile;   // SHOAL_ETCD_KEY: its private key
  bool empty() const { return caFile.empty() && certFile.empty() && keyFile.empty(); }
  // The variables that are set, for errors: "SHOAL_ETCD_CACERT, SHOAL_ETCD_CERT".
  std::string variables() const;
  // Reads the three variables. InvalidArgument (one line, naming the variable) for one set
  // empty, a file that cannot be read, or a certificate without its key or a key without its
  // certificate.
  static EtcdTls fromEnvironment(const EnvReader& env);
  // InvalidArgument unless these settings fit `address`: TLS settings with a plain etcd:// URL
  // would otherwise be ignored while the user believes the connection is encrypted.
  void checkFor(const EtcdAddress& address) const;
};

class EtcdStore : public Store {
 public:
  // `requestTimeout` bounds each request (connect, TLS handshake, send, reply), and the retries
  // of add. Loads the TLS files now (InvalidArgument when one cannot be used, or when `tls` is
  // not empty with a plain etcd:// address).
  EtcdStore(EtcdAddress address, Duration requestTimeout, EtcdCredentials credentials = {},
            EtcdTls tls = {});
  ~EtcdStore() override;

  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, Duration timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::string compareSet(const std::string& key, const std::string& expected,
                         const std::string& desired) override;
  void wait(const std::vector<std::string>& keys, Duration timeout) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;

 private:
  struct Value {
    bool exists = false;
    std::string value;
    int64_t modRevision = 0;
  };
  Value range(const std::string& key);
  // POSTs `body` (JSON) to `path` with the token, authenticating first when there is none and
  // again once when etcd refuses it; the reply's JSON text.
  std::string post(const std::string& path, const std::string& body);
  // One request: the reply's HTTP status and body.
  std::pair<int, std::string> request(const std::string& path, const std::string& body,
                                      const std::string& token);
  // A new token for credentials_ (StoreError naming the user when etcd refuses them).
  std::string authenticate();
  std::string full(const std::string& key) const { return address_.ns + "/" + key; }
  std::string what() const;

  EtcdAddress address_;
  Duration requestTimeout_;
  EtcdCredentials credentials_;
  std::shared_ptr<const tls::ClientContext> tlsContext_;  // null: plain HTTP
  std::mutex tokenMutex_;
  std::string token_;  // under tokenMutex_; empty: none yet
};

}  // namespace shoal::store
