// What the two TLS users (common/tls.h, PSK for the job's links; common/tls_client.h,
// certificates for outside servers) share with OpenSSL: a BIO over a socket, and OpenSSL's
// error reason in one line. Internal to common/: it includes no OpenSSL header, so callers
// declare nothing more than they use.
//
// Why a BIO of our own: OpenSSL's socket BIO writes with write(2), which raises SIGPIPE on a
// connection the peer closed; this one sends with MSG_NOSIGNAL, so no process-wide signal
// setting is needed. It never blocks (MSG_DONTWAIT) and buffers nothing: the caller waits for
// the readiness OpenSSL asks for.
#pragma once

#include <string>

typedef struct bio_st BIO;

namespace shoal::tls {

// A new BIO reading and writing `fd`, which it does not own (its owner closes it after the BIO
// is freed). The BIO's method is made once per process, on first use (thread-safe). Returns
// nullptr if OpenSSL fails (its error queue says why).
BIO* newSocketBio(int fd);

// OpenSSL's most specific reason for the last error of this thread, one line ("tlsv1 alert
// decrypt error"); clears the thread's error queue.
std::string sslReason();

}  // namespace shoal::tls
