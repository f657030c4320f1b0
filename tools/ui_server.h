// `shoal ui`: a local web dashboard over the runs in one folder (README "Dashboard").
//
// RUNS_DIR is a folder whose subfolders are run directories (run/run_directory.h: each holds
// run.json and, once a rank has logged, metrics.db). UiServer serves, over HTTP (Debian's
// cpp-httplib):
//   GET /                                      the dashboard page (tools/ui_page.h), self-contained
//   GET /api/runs                              every run's record and metric names
//   GET /api/runs/NAME/series?metric=M&after=ID[&rank=R][&limit=N][&from_step=A][&to_step=B]
//                                              M's points with row id > ID (oldest first, at most
//                                              N, default and cap kMaxSeriesPoints); "more" says
//                                              whether more are waiting, "last_id" where to go on;
//                                              only steps A..B (inclusive) when given (a page
//                                              may then hold fewer than N points, even none,
//                                              with "more" still true)
//   GET /api/runs/NAME/latest?metric=M         each rank's newest point of M
// Every answer is JSON; an error is {"error": "one line"} with 400 (bad parameter), 401 (no or
// wrong token), 403 (foreign Host header), 404 (no such run or route) or 500 (unreadable file).
//
// NAME is untrusted: it must be one path component (no '/', '\', NUL, not "." or ".."), name a
// subfolder of RUNS_DIR that holds run.json and resolves (symbolic links followed) inside
// RUNS_DIR; anything else is 404 and no file outside RUNS_DIR is ever opened. Files are read
// only: metrics stores are opened read-only, one connection per request.
//
// Security: by default the server listens on 127.0.0.1 only. Binding any other address
// requires a token (the constructor throws InvalidArgument without one); when a token is set,
// every request must carry it, as `?token=T` or `Authorization: Bearer T` (compared in constant
// time), else 401. Without a token, requests whose Host header is not a loopback name are
// refused (403), so a web page the user visits cannot reach the dashboard by DNS rebinding.
//
// Threading: start() and stop() may be called from any thread, concurrently with each other;
// requests are answered by the server's own pool of threads. Blocking: start() waits for the
// listening thread at most kStartTimeout; stop() waits for requests in flight, each bounded by
// the read/write timeouts below; every request's SQLite read waits at most kStoreBusyTimeout.
// The destructor stops the server and never throws.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace shoal::tools {

struct UiOptions {
  std::string runsDir = "runs";
  // The address to listen on: 127.0.0.1 (default), another loopback address, or any other
  // address (e.g. 0.0.0.0) together with a token.
  std::string host = "127.0.0.1";
  int port = 0;  // 0: the system picks a free port (see UiServer::port())
  // Required unless host is loopback; when set, required of every request.
  std::string token;
};

// The most points one series request returns.
inline constexpr size_t kMaxSeriesPoints = 20000;
inline constexpr std::chrono::seconds kStartTimeout{10};
// How long the server waits for a request's bytes, for its answer to be taken, and for the next
// request on an idle keep-alive connection.
inline constexpr std::chrono::seconds kIoTimeout{5};
inline constexpr std::chrono::milliseconds kStoreBusyTimeout{2000};

class UiServer {
 public:
  // Checks the options: InvalidArgument for a port outside 0..65535, a non-loopback host
  // without a token, or a token with characters outside [A-Za-z0-9._~-] (so it travels in a
  // URL unescaped). RUNS_DIR need not exist yet (the list is then empty).
  explicit UiServer(UiOptions options);
  ~UiServer();
  UiServer(const UiServer&) = delete;
  UiServer& operator=(const UiServer&) = delete;

  // Binds and starts serving on a background thread; returns once requests are being accepted.
  // SystemError if the address cannot be bound; TimeoutError if the server thread did not start
  // listening within kStartTimeout. A second call while running does nothing.
  void start();
  // Stops accepting, finishes the requests in flight and joins the server's threads. Idempotent.
  void stop();

  // The port bound by start() (the chosen one when options.port was 0); 0 before start().
  int port() const;
  // http://HOST:PORT/ (with ?token=T when there is a token); empty before start().
  std::string url() const;

  const UiOptions& options() const { return options_; }

 private:
  struct Impl;

  const UiOptions options_;
  std::mutex mutex_;  // serializes start() and stop()
  std::unique_ptr<Impl> impl_;
  std::thread thread_;
  std::atomic<int> port_{0};
};

// Whether `host` is a loopback address or name: 127.0.0.0/8, ::1, localhost.
bool isLoopbackHost(const std::string& host);

// Whether `name` may name a run: one path component, not "." or "..", no '/', '\' or control
// characters, at most 255 bytes.
bool isValidRunName(const std::string& name);

}  // namespace shoal::tools
