#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <list>
#include <map>

#include "common/error.h"
#include "common/log.h"
#include "store/memory_store.h"
#include "store/tcp_store.h"
#include "store/tcp_store_protocol.h"

namespace shoal::store {

namespace {

struct Client {
  Fd fd;
  std::string in;
  std::string out;
  // A parked get/wait: answered when all keys exist. Requests on one connection are served
  // in order, so while one is parked the client's later requests wait in `in`.
  std::optional<wire::Message> parked;
};

class Server {
 public:
  // Handles one request; returns false if it must park until keys appear.
  bool handle(Client& c, const wire::Message& m) {
    auto reply = [&](uint8_t status, std::vector<std::string> fields) {
      c.out += wire::encode(status, fields);
    };
    auto need = [&](size_t n) {
      if (m.fields.size() != n) {
        SHOAL_THROW(ProtocolError, "store command {} with {} fields, expected {}", m.code,
                    m.fields.size(), n);
      }
    };
    switch (m.code) {
      case wire::kSet:
        need(2);
        data_[m.fields[0]] = m.fields[1];
        reply(wire::kOk, {});
        return true;
      case wire::kGet: {
        need(1);
        auto it = data_.find(m.fields[0]);
        if (it == data_.end()) return false;
        reply(wire::kOk, {it->second});
        return true;
      }
      case wire::kAdd: {
        need(2);
        try {
          auto it = data_.find(m.fields[0]);
          int64_t v = (it == data_.end() ? 0 : parseCounter(m.fields[0], it->second)) +
                      parseCounter("delta", m.fields[1]);
          data_[m.fields[0]] = std::to_string(v);
          reply(wire::kOk, {std::to_string(v)});
        } catch (const StoreError& e) {
          reply(wire::kFailed, {e.what()});
        }
        return true;
      }
      case wire::kCompareSet: {
        need(3);
        auto it = data_.find(m.fields[0]);
        std::string current = it == data_.end() ? std::string() : it->second;
        if (current == m.fields[1]) {
          data_[m.fields[0]] = m.fields[2];
          current = m.fields[2];
        }
        reply(wire::kOk, {current});
        return true;
      }
      case wire::kWait:
      case wire::kCheck: {
        bool all = true;
        for (const auto& k : m.fields) all = all && data_.count(k) > 0;
        if (m.code == wire::kCheck) {
          reply(wire::kOk, {all ? "1" : "0"});
          return true;
        }
        if (!all) return false;
        reply(wire::kOk, {});
        return true;
      }
      case wire::kDelete:
        need(1);
        reply(wire::kOk, {data_.erase(m.fields[0]) ? "1" : "0"});
        return true;
    }
    SHOAL_THROW(ProtocolError, "unknown store command {}", m.code);
  }

  // Serves as many queued requests of a client as possible.
  void drain(Client& c) {
    if (c.parked) {
      if (!handle(c, *c.parked)) return;
      c.parked.reset();
    }
    while (auto m = wire::tryDecode(c.in)) {
      if (!handle(c, *m)) {
        c.parked = std::move(m);
        return;
      }
    }
  }

 private:
  std::map<std::string, std::string> data_;
};

}  // namespace

TcpStoreServer::TcpStoreServer(const std::string& host, int port) {
  listen_ = listenTcp(host, port, &port_);
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) < 0) throwSystemError("pipe", errno);
  wakeRead_ = Fd(fds[0]);
  wakeWrite_ = Fd(fds[1]);
  thread_ = std::thread([this] { serve(); });
}

TcpStoreServer::~TcpStoreServer() {
  char b = 1;
  ssize_t ignored = ::write(wakeWrite_.get(), &b, 1);
  (void)ignored;
  thread_.join();
}

void TcpStoreServer::serve() {
  Server server;
  std::list<Client> clients;
  std::vector<pollfd> fds;
  std::vector<Client*> owners;
  char buf[64 * 1024];
  for (;;) {
    fds.clear();
    owners.clear();
    fds.push_back({wakeRead_.get(), POLLIN, 0});
    fds.push_back({listen_.get(), POLLIN, 0});
    for (auto& c : clients) {
      fds.push_back({c.fd.get(), static_cast<short>(POLLIN | (c.out.empty() ? 0 : POLLOUT)), 0});
      owners.push_back(&c);
    }
    if (::poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      SHOAL_LOG_WARN("store server: poll failed: {}", std::strerror(errno));
      return;
    }
    if (fds[0].revents) return;
    if (fds[1].revents & POLLIN) {
      for (;;) {
        int fd = ::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) break;
        setNoDelay(fd);
        clients.push_back(Client{Fd(fd), {}, {}, {}});
      }
    }
    bool mutated = false;
    for (size_t i = 0; i < owners.size(); ++i) {
      Client& c = *owners[i];
      short re = fds[i + 2].revents;
      bool dead = false;
      if (re & (POLLIN | POLLHUP | POLLERR)) {
        for (;;) {
          ssize_t r = ::recv(c.fd.get(), buf, sizeof(buf), 0);
          if (r > 0) {
            c.in.append(buf, static_cast<size_t>(r));
            continue;
          }
          if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) dead = true;
          break;
        }
        try {
          size_t before = c.out.size();
          server.drain(c);
          mutated = mutated || c.out.size() != before;
        } catch (const Error& e) {
          SHOAL_LOG_WARN("store server: dropping a client: {}", e.what());
          dead = true;
        }
      }
      if (!dead && !c.out.empty()) {
        ssize_t w = ::send(c.fd.get(), c.out.data(), c.out.size(), MSG_NOSIGNAL);
        if (w > 0) {
          c.out.erase(0, static_cast<size_t>(w));
        } else if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
          dead = true;
        }
      }
      if (dead) c.fd.reset();
    }
    clients.remove_if([](const Client& c) { return !c.fd.valid(); });
    // Any answered request may have been a write that a parked get/wait was waiting for.
    if (mutated) {
      for (auto& c : clients) {
        if (!c.parked) continue;
        try {
          server.drain(c);
        } catch (const Error& e) {
          SHOAL_LOG_WARN("store server: dropping a client: {}", e.what());
          c.fd.reset();
        }
      }
      clients.remove_if([](const Client& c) { return !c.fd.valid(); });
    }
  }
}

}  // namespace shoal::store
