#include "transport/acceptor.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <list>
#include <vector>

#include "common/error.h"
#include "common/log.h"
#include "transport/auth.h"

namespace shoal::transport {

namespace {
// Incoming connections in their handshake at once; beyond it the rest wait in the backlog.
constexpr size_t kMaxPendingHandshakes = 256;
// Authenticated hellos waiting for their group to be registered here.
constexpr size_t kMaxParked = 256;
// Ids of groups gone here, remembered to answer "departed" (a job makes few groups).
constexpr size_t kMaxDeparted = 4096;
}  // namespace

struct Acceptor::Conn {
  Fd fd;
  auth::Greeting greeting;
  std::string in;  // the hello as it arrives
  auth::Hello hello{};
  Clock::time_point deadline;
};

Acceptor::Acceptor(AcceptorOptions options)
    : options_(std::move(options)), wakeFd_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
  if (!wakeFd_.valid()) throwSystemError("eventfd", errno);
  int port = 0;
  listener_ = listenTcp(options_.listenAddress, 0, &port);
  address_ = {options_.listenAddress, port};
  thread_ = std::thread([this] { loop(); });
}

Acceptor::~Acceptor() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  uint64_t one = 1;
  [[maybe_unused]] ssize_t w = ::write(wakeFd_.get(), &one, sizeof(one));
  thread_.join();
}

void Acceptor::add(std::shared_ptr<Mesh> mesh) {
  const uint32_t id = mesh->plan().groupId;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (groups_.count(id) || departed_.count(id)) {
      SHOAL_THROW(InvalidArgument, "group {:08x} is registered with this rank's acceptor already",
                  id);
    }
    groups_.emplace(id, std::move(mesh));
  }
  uint64_t one = 1;  // parked hellos may be for it
  [[maybe_unused]] ssize_t w = ::write(wakeFd_.get(), &one, sizeof(one));
}

void Acceptor::remove(uint32_t groupId, bool aborted) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    groups_.erase(groupId);
    if (departed_.emplace(groupId, aborted).second) {
      departedOrder_.push_back(groupId);
      if (departedOrder_.size() > kMaxDeparted) {
        departed_.erase(departedOrder_.front());
        departedOrder_.pop_front();
      }
    }
  }
  uint64_t one = 1;
  [[maybe_unused]] ssize_t w = ::write(wakeFd_.get(), &one, sizeof(one));
}

size_t Acceptor::parked() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return parkedCount_;
}

bool Acceptor::waitParked(size_t n, const Deadline& deadline) const {
  std::unique_lock<std::mutex> lock(mutex_);
  return parkedChanged_.wait_until(lock, deadline.end(), [&] { return parkedCount_ >= n; });
}

void Acceptor::reply(Conn& c, const auth::Verdict& v) {
  // 40 bytes into an idle socket's buffer: does not block in practice, bounded anyway.
  writeAll(c.fd.get(), &v, sizeof(v), Deadline(options_.handshakeTimeout),
           fmt::format("acceptor {}: handshake with an incoming connection", address_.str()));
}

bool Acceptor::route(Conn& c) {
  const auth::Hello& h = c.hello;
  std::shared_ptr<Mesh> mesh;
  bool departed = false, aborted = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = groups_.find(h.group);
    if (it != groups_.end()) mesh = it->second;
    auto gone = departed_.find(h.group);
    departed = gone != departed_.end();
    aborted = departed && gone->second;
  }
  if (!mesh && !departed) return false;
  if (!mesh) {
    reply(c, auth::answer(options_.secret, c.greeting, h,
                          aborted ? auth::VerdictCode::kAborted : auth::VerdictCode::kDeparted));
    return true;
  }
  const LinkPlan& plan = mesh->plan();
  if (auto wrong = misaddressed(h, plan.groupId, plan.rank, plan.size)) {
    // Proved the secret, so a confused rank of this job, not an attacker: say so loudly.
    SHOAL_LOG_WARN("rank {}: rejected a connection: {}", plan.rank, *wrong);
    reply(c, auth::refuse(auth::VerdictCode::kWrongPeer));
    return true;
  }
  const int from = h.from;
  const auth::VerdictCode code = mesh->admit(from);
  reply(c, auth::answer(options_.secret, c.greeting, h, code));
  if (code != auth::VerdictCode::kAccepted) {
    SHOAL_LOG_DEBUG("rank {} ← peer {}: refused a connection (verdict {})", plan.rank, from,
                    static_cast<int>(code));
    return true;
  }
  // The peer proved the secret and dials right now: its half of the set-up runs as we run ours,
  // so waiting for it here is bounded (by the group's timeout at worst).
  try {
    mesh->deliver(from, acceptedLink(plan, from, std::move(c.fd), Deadline(plan.timeout)));
  } catch (const std::exception& e) {
    SHOAL_LOG_WARN("rank {} ← peer {}: connection set-up failed: {}", plan.rank, from, e.what());
    mesh->failed(from, std::current_exception());
  }
  return true;
}

void Acceptor::onHello(Conn& c) {
  std::memcpy(&c.hello, c.in.data(), sizeof(c.hello));
  std::string why;
  auth::Verdict v =
      auth::checkHello(options_.secret, c.greeting, c.hello, auth::Channel::kData, &why);
  if (v.code != static_cast<uint32_t>(auth::VerdictCode::kAccepted)) {
    SHOAL_LOG_WARN("acceptor {}: rejected a connection: {}", address_.str(), why);
    reply(c, v);
    c.fd.reset();
    return;
  }
  // From here on the connector proved the secret: it is a rank of this job.
  if (route(c)) {
    c.fd.reset();
  } else if (parkedNow_ >= kMaxParked) {
    SHOAL_LOG_WARN("acceptor {}: refused a hello for group {:08x} from rank {}: {} parked already",
                   address_.str(), c.hello.group, c.hello.from, kMaxParked);
    reply(c, auth::refuse(auth::VerdictCode::kWrongPeer));
    c.fd.reset();
  } else {
    c.deadline = Clock::now() + options_.parkTimeout;  // parked
  }
}

void Acceptor::loop() {
  std::list<Conn> pending;  // waiting for their hello
  std::list<Conn> parked;   // authenticated, waiting for their group
  std::vector<pollfd> fds;
  std::vector<Conn*> owners;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stop_) return;
    }
    fds.clear();
    owners.clear();
    const bool accepting = pending.size() < kMaxPendingHandshakes;
    fds.push_back({wakeFd_.get(), POLLIN, 0});
    fds.push_back({listener_.get(), static_cast<short>(accepting ? POLLIN : 0), 0});
    auto wake = Clock::now() + std::chrono::hours(1);
    for (auto* list : {&pending, &parked}) {
      for (auto& c : *list) {
        // A parked dialer sends nothing more: readable means it closed (it gave up).
        fds.push_back({c.fd.get(), POLLIN, 0});
        owners.push_back(&c);
        wake = std::min(wake, c.deadline);
      }
    }
    const auto waitMs = std::chrono::ceil<std::chrono::milliseconds>(wake - Clock::now()).count();
    if (::poll(fds.data(), fds.size(),
               static_cast<int>(std::clamp<long long>(waitMs, 0, 1 << 30))) < 0) {
      if (errno == EINTR) continue;
      SHOAL_LOG_WARN("acceptor {}: poll failed: {}", address_.str(), std::strerror(errno));
      return;
    }
    if (fds[0].revents) {
      uint64_t drained;
      while (::read(wakeFd_.get(), &drained, sizeof(drained)) > 0) {
      }
    }
    const auto now = Clock::now();
    const size_t firstParked = pending.size();
    for (size_t i = 0; i < owners.size(); ++i) {
      Conn& c = *owners[i];
      const short revents = fds[i + 2].revents;
      try {
        if (i >= firstParked) {
          if (revents != 0) {
            SHOAL_LOG_DEBUG("acceptor {}: a parked dialer (group {:08x}, rank {}) gave up",
                            address_.str(), c.hello.group, c.hello.from);
            c.fd.reset();
          } else if (route(c)) {
            c.fd.reset();
          } else if (now >= c.deadline) {
            SHOAL_LOG_WARN(
                "acceptor {}: rank {} dialed group {:08x}, which was not created here "
                "within {:.1f} s",
                address_.str(), c.hello.from, c.hello.group,
                std::chrono::duration<double>(options_.parkTimeout).count());
            reply(c, auth::refuse(auth::VerdictCode::kWrongPeer));
            c.fd.reset();
          }
          continue;
        }
        if (revents == 0) {
          if (now >= c.deadline) {
            SHOAL_LOG_WARN(
                "acceptor {}: closed a connection that sent no handshake within {:.1f} s",
                address_.str(), std::chrono::duration<double>(options_.handshakeTimeout).count());
            c.fd.reset();
          }
          continue;
        }
        char buf[sizeof(auth::Hello)];
        ssize_t r = ::recv(c.fd.get(), buf, sizeof(auth::Hello) - c.in.size(), 0);
        if (r <= 0) {
          if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
          SHOAL_LOG_DEBUG("acceptor {}: an incoming connection closed before its handshake",
                          address_.str());
          c.fd.reset();
          continue;
        }
        c.in.append(buf, static_cast<size_t>(r));
        if (c.in.size() < sizeof(auth::Hello)) continue;
        parkedNow_ = parked.size();
        onHello(c);
        if (c.fd.valid()) {
          // Parked: moved to the other list (std::list keeps the element where it is in memory).
          auto it =
              std::find_if(pending.begin(), pending.end(), [&](const Conn& x) { return &x == &c; });
          parked.splice(parked.end(), pending, it);
        }
      } catch (const std::exception& e) {
        SHOAL_LOG_WARN("acceptor {}: dropped a connection: {}", address_.str(), e.what());
        c.fd.reset();
      }
    }
    pending.remove_if([](const Conn& c) { return !c.fd.valid(); });
    parked.remove_if([](const Conn& c) { return !c.fd.valid(); });
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (parkedCount_ != parked.size()) {
        parkedCount_ = parked.size();
        parkedChanged_.notify_all();
      }
    }
    if (fds[1].revents & POLLIN) {
      while (pending.size() < kMaxPendingHandshakes) {
        int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) {
          if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED) {
            SHOAL_LOG_WARN("acceptor {}: accept: {}", address_.str(), std::strerror(errno));
          }
          break;
        }
        Conn c{Fd(fd),
               auth::makeGreeting(auth::GreetingStatus::kChallenge),
               {},
               {},
               Clock::now() + options_.handshakeTimeout};
        setNoDelay(c.fd.get());
        // The greeting fits any fresh socket's send buffer; a peer that resets is just closed.
        if (::send(c.fd.get(), &c.greeting, sizeof(c.greeting), MSG_NOSIGNAL) !=
            static_cast<ssize_t>(sizeof(c.greeting))) {
          continue;
        }
        pending.push_back(std::move(c));
      }
    }
  }
}

}  // namespace shoal::transport
