// The failure side of an Endpoint (transport/endpoint.h): the control frames a peer's socket
// carries (abort and goodbye frames, read while a rank waits on someone else, written by
// abort()), and the errors a departed peer or a deadline raises. The progress loop that calls
// them is in endpoint.cpp.
#include <sys/epoll.h>
#include <sys/socket.h>

#include <algorithm>
#include <vector>

#include "common/error.h"
#include "transport/endpoint.h"
#include "transport/mesh.h"

namespace shoal::transport {

namespace {
constexpr size_t kHeaderBytes = sizeof(FrameHeader);
}  // namespace

void Endpoint::sendControl(int peer, FrameHeader h, const std::string& text) noexcept {
  h.bytes = std::min<size_t>(text.size(), kMaxAbortText);
  iovec iov[2] = {{&h, kHeaderBytes}, {const_cast<char*>(text.data()), h.bytes}};
  links_[peer]->writeControl(iov, h.bytes ? 2 : 1);
}

void Endpoint::throwDeparted(int peer, const FrameHeader& expected) {
  PeerError e(fmt::format(
      "rank {} ← peer {}: peer {} left the group (destroyed it normally) while rank {} still "
      "expects {} from it",
      rank_, peer, peer, rank_, options_.describe(expected)));
  e.setOrigin(peer);
  throw e;
}

void Endpoint::readAbortFrame(int peer, const FrameHeader& h) {
  LinkContext ctx{rank_, peer};
  if (h.bytes > kMaxAbortText) {
    SHOAL_THROW(ProtocolError, "rank {} ← peer {}: abort frame of {} bytes (limit {})", rank_, peer,
                h.bytes, kMaxAbortText);
  }
  std::string text(h.bytes, '\0');
  try {
    links_[peer]->readControl(text.data(), text.size(), Deadline(std::chrono::seconds(1)),
                              fmt::format("rank {} ← peer {}: abort message", rank_, peer));
  } catch (const Error&) {
    text = "(peer aborted; its message was lost)";
  }
  receivedAbort_ = abortFailure(h, text);
  throwAbort(h, text, ctx);
}

void Endpoint::checkSocket(int peer) {
  FrameHeader h{};
  Link& link = *links_[peer];
  const int fd = link.socketFd();
  const long r = link.peekControl(&h, kHeaderBytes);
  if (r < 0 && departed_[peer]) return;
  if (r < 0) {
    throw ConnectionLost(
        fmt::format("rank {} ← peer {}: connection closed by peer {}", rank_, peer, peer), peer);
  }
  if (r == 0) return;
  const Deadline consume(std::chrono::seconds(1));
  const std::string what = fmt::format("rank {} ← peer {}: control frame", rank_, peer);
  bool isAbort = static_cast<size_t>(r) == kHeaderBytes && h.magic == kFrameMagic &&
                 h.kind == static_cast<uint8_t>(FrameKind::kAbort);
  if (isAbort) {
    link.readControl(&h, kHeaderBytes, consume, what);
    readAbortFrame(peer, h);
  }
  bool isGoodbye = static_cast<size_t>(r) == kHeaderBytes && h.magic == kFrameMagic &&
                   h.kind == static_cast<uint8_t>(FrameKind::kGoodbye);
  if (isGoodbye) {
    // Normal departure: stop watching the socket; a later transfer with this peer fails.
    link.readControl(&h, kHeaderBytes, consume, what);
    departed_[peer] = 1;
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, fd, nullptr);
    return;
  }
  if (links_[peer]->kind() == LinkKind::kShm && static_cast<size_t>(r) == kHeaderBytes) {
    SHOAL_THROW(ProtocolError, "rank {} ← peer {}: unexpected bytes on the control socket", rank_,
                peer);
  }
  // Otherwise: the beginning of a later operation's frame on a TCP link; read in its turn.
}

void Endpoint::throwTimeout(const Transfer* ts, size_t n, const Deadline& deadline) {
  std::string waiting;
  const FrameHeader* op = nullptr;
  std::vector<char> listed(2 * static_cast<size_t>(size_), 0);
  for (size_t i = 0; i < n; ++i) {
    const Transfer& t = ts[i];
    const bool isSend = t.kind == Transfer::Kind::kSend;
    const size_t total = isSend ? kHeaderBytes + t.header.bytes : t.header.bytes;
    // Name only the first transfer still pending per peer and direction.
    if (t.complete() || listed[2 * t.peer + isSend]) continue;
    listed[2 * t.peer + isSend] = 1;
    op = &t.header;
    if (!waiting.empty()) waiting += ", ";
    waiting += fmt::format("peer {} ({} step {}: {}/{} bytes)", t.peer, isSend ? "send" : "receive",
                           t.header.step, t.done, total);
  }
  TimeoutError e(fmt::format("rank {}: {} timed out after {:.1f} s; still waiting on {}", rank_,
                             op ? options_.describe(*op) : std::string("operation"),
                             deadline.timeoutSeconds(), waiting));
  // The one peer this rank waited on, if only one: the best guess at the cause when nothing
  // better is known (Group asks the store who was silent).
  int only = -1;
  for (int p = 0; p < size_ && only != -2; ++p) {
    if (listed[2 * p] || listed[2 * p + 1]) only = only == -1 ? p : -2;
  }
  e.setOrigin(only >= 0 ? only : -1);
  throw e;
}

void Endpoint::interrupt() noexcept {
  mesh_->interrupt();
  std::lock_guard<std::mutex> lock(installMutex_);
  for (auto& link : links_) {
    if (link) ::shutdown(link->socketFd(), SHUT_RDWR);
  }
}

void Endpoint::abort(const Failure& failure) noexcept {
  if (aborted_) return;
  aborted_ = true;
  // From now on a peer that dials hears "aborted"; the links the acceptor made are told too.
  mesh_->markAborted();
  try {
    adoptArrivals(false);
  } catch (...) {
  }
  const std::string& text = failure.text;
  try {
    abortReason_ = text;
  } catch (...) {
  }
  FrameHeader h;
  h.kind = static_cast<uint8_t>(FrameKind::kAbort);
  h.abortKind = static_cast<uint8_t>(failure.kind);
  h.root = failure.origin >= 0 ? static_cast<uint32_t>(failure.origin) + 1 : 0;
  for (int p = 0; p < size_; ++p) {
    if (!links_[p]) continue;
    // In the middle of a frame the abort frame would be read as payload: then only the
    // shutdown speaks (the peer sees the connection close).
    if (!(links_[p]->kind() != LinkKind::kShm && midFrame_[p])) sendControl(p, h, text);
    links_[p]->shutdown();
  }
}

}  // namespace shoal::transport
