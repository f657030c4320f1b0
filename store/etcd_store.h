// A store kept in etcd (the store torchrun's elastic rendezvous uses): the job's rendezvous and
// elastic membership then survive the loss of any worker host, and of etcd members while a
// quorum remains. Selected by SHOAL_STORE_ADDR=etcd://host:port[/namespace].
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
//   to set them. No TLS: the password and the keys travel in clear, so keep etcd on a network
//   only the job reaches. The job's data connections are authenticated by the job secret
//   (transport/auth.h) whatever the store.
//
// Threads: every call is independent and thread-safe. Errors: an unreachable etcd, an HTTP
// error or a malformed reply is StoreError naming the address; get and wait throw TimeoutError
// naming the missing keys. Replies are size-checked before they are buffered (1 MiB at most).
#pragma once

#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "common/deadline.h"
#include "common/env.h"
#include "common/socket.h"
#include "store/store.h"

namespace shoal::store {

// "etcd://host:port[/namespace]" -> address and namespace; InvalidArgument (one line) for
// anything else.
struct EtcdAddress {
  HostPort address;
  std::string ns = "shoal";
  static bool matches(const std::string& url);  // starts with etcd://
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

class EtcdStore : public Store {
 public:
  // `requestTimeout` bounds each request (connect, send, reply), and the retries of add.
  EtcdStore(EtcdAddress address, Duration requestTimeout, EtcdCredentials credentials = {});

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
  std::mutex tokenMutex_;
  std::string token_;  // under tokenMutex_; empty: none yet
};

}  // namespace shoal::store
