// Delay and loss for the emulated network (tests/netem/with_network.sh) on kernels without
// sch_netem: an iptables rule hands a host's incoming packets to this program's netfilter queue
// (NFQUEUE), which holds each one for the delay and then lets it through, or drops it with the
// given probability, in arrival order. Run inside the host's network namespace (queues are per
// namespace), as root.
//
// usage: shoal_netem_queue --queue N [--delay-us D] [--loss-ppm P] [--seed S]
//
// Prints "ready" on stdout once bound (with_network.sh waits for it before it adds the rule that
// sends packets here, so none is queued with nobody to release it). On SIGTERM or SIGINT it
// releases what it holds (with no further delay), prints "netem_queue: N packets, D dropped" on
// stderr and exits 0. Errors: one line on stderr, exit 2.
//
// Only the packets' metadata cross into this process (NFQNL_COPY_META), and GSO packets arrive
// whole (NFQA_CFG_F_GSO), so a packet costs two small netlink messages however large it is.
// Accepted packets are released with batch verdicts (every queued id up to the newest due one):
// should the socket's buffer overflow and a packet's notice be lost, the next batch still lets
// it through instead of leaving it queued for ever.
#include <arpa/inet.h>
#include <linux/netfilter.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netfilter/nfnetlink_queue.h>
#include <linux/netlink.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "netem_queue: %s\n", what.c_str());
  std::exit(2);
}

volatile sig_atomic_t stopping = 0;
void onSignal(int) {
  stopping = 1;
}

// One netlink message of the queue subsystem, built attribute by attribute.
class Message {
 public:
  Message(uint16_t type, uint16_t queue, uint16_t flags) {
    nlmsghdr h{};
    h.nlmsg_type = static_cast<uint16_t>((NFNL_SUBSYS_QUEUE << 8) | type);
    h.nlmsg_flags = static_cast<uint16_t>(NLM_F_REQUEST | flags);
    append(&h, sizeof h);
    nfgenmsg g{};
    g.nfgen_family = AF_UNSPEC;
    g.version = NFNETLINK_V0;
    g.res_id = htons(queue);
    append(&g, sizeof g);
  }
  void attribute(uint16_t type, const void* data, size_t size) {
    nlattr a{};
    a.nla_len = static_cast<uint16_t>(NLA_HDRLEN + size);
    a.nla_type = type;
    append(&a, sizeof a);
    append(data, size);
  }
  // Sets the length; the bytes to send.
  std::string_view finish() {
    const auto length = static_cast<uint32_t>(size_);
    std::memcpy(bytes_ + offsetof(nlmsghdr, nlmsg_len), &length, sizeof length);
    return {bytes_, size_};
  }

 private:
  void append(const void* data, size_t size) {
    if (size_ + NLMSG_ALIGN(size) > sizeof bytes_) die("internal: a netlink message too long");
    std::memcpy(bytes_ + size_, data, size);
    size_ += NLMSG_ALIGN(size);
  }
  // The messages sent are a header and at most four small attributes.
  alignas(nlmsghdr) char bytes_[256] = {};
  size_t size_ = 0;
};

void sendAll(int fd, std::string_view bytes, const char* what) {
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  if (::sendto(fd, bytes.data(), bytes.size(), 0, reinterpret_cast<sockaddr*>(&kernel),
               sizeof kernel) != static_cast<ssize_t>(bytes.size())) {
    die(std::string(what) + ": " + std::strerror(errno));
  }
}

// Sends a configuration message and waits for the kernel's acknowledgement.
void configure(int fd, Message m, const char* what) {
  sendAll(fd, m.finish(), what);
  std::vector<char> buf(8192);
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 5000) <= 0) die(std::string(what) + ": no answer from the kernel in 5 s");
    ssize_t n = ::recv(fd, buf.data(), buf.size(), 0);
    if (n < 0) die(std::string(what) + ": " + std::strerror(errno));
    for (auto* h = reinterpret_cast<nlmsghdr*>(buf.data()); NLMSG_OK(h, n); h = NLMSG_NEXT(h, n)) {
      if (h->nlmsg_type != NLMSG_ERROR) continue;
      if (h->nlmsg_len < NLMSG_LENGTH(sizeof(nlmsgerr))) die(std::string(what) + ": short ack");
      const int err = static_cast<const nlmsgerr*>(NLMSG_DATA(h))->error;
      if (err != 0) {
        die(std::string(what) + ": " + std::strerror(-err) +
            (err == -EBUSY ? " (another program holds this queue)" : ""));
      }
      return;
    }
  }
}

uint32_t be32(uint32_t v) {
  return htonl(v);
}

struct Held {
  uint32_t id;
  Clock::time_point due;
  bool drop;
};

long long number(const char* flag, const char* text, long long lo, long long hi) {
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || v < lo || v > hi) {
    die(std::string(flag) + ": a whole number from " + std::to_string(lo) + " to " +
        std::to_string(hi) + ", not '" + text + "'");
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  long long queue = -1, delayUs = 0, lossPpm = 0, seed = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) die(flag + ": needs a value");
    const char* value = argv[++i];
    if (flag == "--queue") {
      queue = number("--queue", value, 0, 65535);
    } else if (flag == "--delay-us") {
      delayUs = number("--delay-us", value, 0, 10'000'000);
    } else if (flag == "--loss-ppm") {
      lossPpm = number("--loss-ppm", value, 0, 1'000'000);
    } else if (flag == "--seed") {
      seed = number("--seed", value, 0, 1LL << 62);
    } else {
      die("unknown option '" + flag + "'");
    }
  }
  if (queue < 0) die("--queue N is required");
  const auto q = static_cast<uint16_t>(queue);

  // Sub-millisecond delays need the timer to fire when asked, not up to 50 us later.
  ::prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
  struct sigaction sa {};
  sa.sa_handler = onSignal;
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGINT, &sa, nullptr);

  const int fd = ::socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_NETFILTER);
  if (fd < 0) die(std::string("netlink socket: ") + std::strerror(errno));
  // Room for a burst of notices: 64 MiB (root may exceed rmem_max).
  const int rcv = 64 << 20;
  if (::setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &rcv, sizeof rcv) != 0) {
    ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcv, sizeof rcv);
  }
  sockaddr_nl self{};
  self.nl_family = AF_NETLINK;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&self), sizeof self) != 0) {
    die(std::string("netlink bind: ") + std::strerror(errno));
  }

  {
    Message m(NFQNL_MSG_CONFIG, q, NLM_F_ACK);
    nfqnl_msg_config_cmd cmd{};
    cmd.command = NFQNL_CFG_CMD_BIND;
    m.attribute(NFQA_CFG_CMD, &cmd, sizeof cmd);
    configure(fd, std::move(m), "binding the queue");
  }
  {
    Message m(NFQNL_MSG_CONFIG, q, NLM_F_ACK);
    nfqnl_msg_config_params params{};
    params.copy_range = 0;
    params.copy_mode = NFQNL_COPY_META;
    m.attribute(NFQA_CFG_PARAMS, &params, sizeof params);
    const uint32_t maxlen = be32(1 << 20);
    m.attribute(NFQA_CFG_QUEUE_MAXLEN, &maxlen, sizeof maxlen);
    const uint32_t flags = be32(NFQA_CFG_F_GSO), mask = be32(NFQA_CFG_F_GSO);
    m.attribute(NFQA_CFG_FLAGS, &flags, sizeof flags);
    m.attribute(NFQA_CFG_MASK, &mask, sizeof mask);
    configure(fd, std::move(m), "configuring the queue");
  }
  std::printf("ready\n");
  std::fflush(stdout);

  std::mt19937_64 random(static_cast<uint64_t>(seed));
  std::uniform_int_distribution<long long> ppm(0, 999'999);
  const auto delay = std::chrono::microseconds(delayUs);
  std::deque<Held> held;
  uint64_t seen = 0, dropped = 0, overflows = 0;
  std::vector<char> buf(1 << 20);

  // One verdict message: `type` NFQNL_MSG_VERDICT (packet `id`) or NFQNL_MSG_VERDICT_BATCH
  // (every queued packet up to `id`).
  const auto verdict = [&](uint16_t type, uint32_t code, uint32_t id) {
    Message m(type, q, 0);
    const nfqnl_msg_verdict_hdr v{be32(code), be32(id)};
    m.attribute(NFQA_VERDICT_HDR, &v, sizeof v);
    sendAll(fd, m.finish(), "verdict");
  };
  // Lets through (or drops) every held packet due by `now`.
  const auto release = [&](Clock::time_point now) {
    std::optional<uint32_t> accepted;  // the newest accepted id not yet sent in a batch
    while (!held.empty() && held.front().due <= now) {
      const Held h = held.front();
      held.pop_front();
      if (!h.drop) {
        accepted = h.id;
        continue;
      }
      // The batch before it first: it would otherwise accept this one too.
      if (accepted) verdict(NFQNL_MSG_VERDICT_BATCH, NF_ACCEPT, *std::exchange(accepted, {}));
      verdict(NFQNL_MSG_VERDICT, NF_DROP, h.id);
    }
    if (accepted) verdict(NFQNL_MSG_VERDICT_BATCH, NF_ACCEPT, *accepted);
  };

  while (!stopping) {
    // Sleep until a packet arrives or the oldest held one is due: no polling.
    timespec wait{};
    timespec* timeout = nullptr;
    if (!held.empty()) {
      const auto left = std::max(Clock::duration::zero(), held.front().due - Clock::now());
      const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
      wait.tv_sec = static_cast<time_t>(ns / 1'000'000'000);
      wait.tv_nsec = static_cast<long>(ns % 1'000'000'000);
      timeout = &wait;
    }
    pollfd p{fd, POLLIN, 0};
    const int ready = ::ppoll(&p, 1, timeout, nullptr);
    if (ready < 0 && errno != EINTR) die(std::string("poll: ") + std::strerror(errno));
    if (ready > 0) {
      for (;;) {
        ssize_t n = ::recv(fd, buf.data(), buf.size(), MSG_DONTWAIT);
        if (n < 0) {
          if (errno == EAGAIN || errno == EINTR) break;
          if (errno == ENOBUFS) {  // notices lost: the next batch verdict covers their packets
            ++overflows;
            continue;
          }
          die(std::string("receive: ") + std::strerror(errno));
        }
        const auto arrived = Clock::now();
        for (auto* h = reinterpret_cast<nlmsghdr*>(buf.data()); NLMSG_OK(h, n);
             h = NLMSG_NEXT(h, n)) {
          if ((h->nlmsg_type & 0xff) != NFQNL_MSG_PACKET ||
              h->nlmsg_len < NLMSG_LENGTH(sizeof(nfgenmsg))) {
            continue;
          }
          // The attributes after the nfgenmsg; the packet header carries the id.
          auto* a = reinterpret_cast<nlattr*>(static_cast<char*>(NLMSG_DATA(h)) +
                                              NLMSG_ALIGN(sizeof(nfgenmsg)));
          size_t left = h->nlmsg_len - NLMSG_LENGTH(NLMSG_ALIGN(sizeof(nfgenmsg)));
          while (left >= sizeof(nlattr) && a->nla_len >= sizeof(nlattr) && a->nla_len <= left) {
            if ((a->nla_type & NLA_TYPE_MASK) == NFQA_PACKET_HDR &&
                a->nla_len >= NLA_HDRLEN + sizeof(nfqnl_msg_packet_hdr)) {
              nfqnl_msg_packet_hdr ph;
              std::memcpy(&ph, reinterpret_cast<char*>(a) + NLA_HDRLEN, sizeof ph);
              const bool drop = lossPpm > 0 && ppm(random) < lossPpm;
              held.push_back({ntohl(ph.packet_id), arrived + delay, drop});
              ++seen;
              dropped += drop;
              break;
            }
            const size_t step = NLA_ALIGN(a->nla_len);
            if (step >= left) break;
            left -= step;
            a = reinterpret_cast<nlattr*>(reinterpret_cast<char*>(a) + step);
          }
        }
      }
    }
    release(Clock::now());
  }
  // Whatever is still held goes now (dropped ones stay dropped).
  release(Clock::time_point::max());
  std::fprintf(stderr, "netem_queue: %llu packets, %llu dropped%s\n",
               static_cast<unsigned long long>(seen), static_cast<unsigned long long>(dropped),
               overflows ? (", " + std::to_string(overflows) + " notice overflows").c_str() : "");
  return 0;
}
