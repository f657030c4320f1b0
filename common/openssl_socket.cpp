#include "common/openssl_socket.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdint>

namespace shoal::tls {

namespace {

int fdOf(BIO* b) {
  return static_cast<int>(reinterpret_cast<intptr_t>(BIO_get_data(b)));
}

int bioWrite(BIO* b, const char* buf, int len) {
  BIO_clear_retry_flags(b);
  for (;;) {
    const ssize_t w = ::send(fdOf(b), buf, static_cast<size_t>(len), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w >= 0) return static_cast<int>(w);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) BIO_set_retry_write(b);
    return -1;
  }
}

int bioRead(BIO* b, char* buf, int len) {
  BIO_clear_retry_flags(b);
  for (;;) {
    const ssize_t r = ::recv(fdOf(b), buf, static_cast<size_t>(len), MSG_DONTWAIT);
    if (r >= 0) return static_cast<int>(r);  // 0: end of stream
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) BIO_set_retry_read(b);
    return -1;
  }
}

long bioCtrl(BIO*, int cmd, long, void*) {
  return cmd == BIO_CTRL_FLUSH ? 1 : 0;  // nothing is buffered here
}

int bioCreate(BIO* b) {
  BIO_set_init(b, 1);
  return 1;
}

// Kept for the process's life (reachable from here, so never a leak to a leak checker).
BIO_METHOD* socketMethod() {
  static BIO_METHOD* const method = [] {
    BIO_METHOD* m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "shoal socket");
    if (m != nullptr && (!BIO_meth_set_write(m, bioWrite) || !BIO_meth_set_read(m, bioRead) ||
                         !BIO_meth_set_ctrl(m, bioCtrl) || !BIO_meth_set_create(m, bioCreate))) {
      BIO_meth_free(m);
      m = nullptr;
    }
    return m;
  }();
  return method;
}

}  // namespace

BIO* newSocketBio(int fd) {
  BIO_METHOD* method = socketMethod();
  if (method == nullptr) return nullptr;
  BIO* bio = BIO_new(method);
  if (bio != nullptr) BIO_set_data(bio, reinterpret_cast<void*>(static_cast<intptr_t>(fd)));
  return bio;
}

std::string sslReason() {
  const unsigned long e = ERR_peek_last_error();
  ERR_clear_error();
  if (e == 0) return "unknown TLS error";
  if (const char* r = ERR_reason_error_string(e)) return r;
  char buf[256];
  ERR_error_string_n(e, buf, sizeof(buf));
  return buf;
}

}  // namespace shoal::tls
