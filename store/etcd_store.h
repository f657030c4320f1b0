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
// - No TLS and no etcd authentication: keep etcd on a network only the job reaches. The job's
//   data connections are still authenticated by the job secret (transport/auth.h).
//
// Threads: every call is independent and thread-safe. Errors: an unreachable etcd, an HTTP
// error or a malformed reply is StoreError naming the address; get and wait throw TimeoutError
// naming the missing keys. Replies are size-checked before they are buffered (1 MiB at most).
#pragma once

#include <string>
#include <vector>

#include "common/deadline.h"
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

class EtcdStore : public Store {
 public:
  // `requestTimeout` bounds each request (connect, send, reply), and the retries of add.
  EtcdStore(EtcdAddress address, Duration requestTimeout);

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
  // POSTs `body` (JSON) to `path`; the reply's JSON text.
  std::string post(const std::string& path, const std::string& body);
  std::string full(const std::string& key) const { return address_.ns + "/" + key; }

  EtcdAddress address_;
  Duration requestTimeout_;
};

}  // namespace shoal::store
