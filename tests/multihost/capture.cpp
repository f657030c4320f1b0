// A packet capture for the encryption test, needing no package: every frame seen on one network
// interface (both directions) is appended, headers and all, to a file, from "ready" until
// SIGTERM or SIGINT. Then it drains what the socket still holds, prints a summary line (frames,
// bytes, drops) and exits 0; with any frame dropped by the kernel it exits 3, since an absent
// marker would then prove nothing. Needs CAP_NET_RAW (root).
//
// usage: shoal_capture IFACE OUTFILE
#include <arpa/inet.h>
#include <linux/if_packet.h>
#include <net/ethernet.h>
#include <net/if.h>
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: shoal_capture IFACE OUTFILE\n");
    return 2;
  }
  const unsigned ifindex = ::if_nametoindex(argv[1]);
  if (ifindex == 0) {
    std::fprintf(stderr, "shoal_capture: no interface %s\n", argv[1]);
    return 2;
  }
  const int sock = ::socket(AF_PACKET, SOCK_RAW | SOCK_CLOEXEC, htons(ETH_P_ALL));
  if (sock < 0) {
    std::fprintf(stderr, "shoal_capture: packet socket: %s\n", std::strerror(errno));
    return 2;
  }
  // Room for everything a short test sends, so that nothing is dropped while this process is
  // descheduled on a busy machine.
  int bytes = 256 << 20;
  if (::setsockopt(sock, SOL_SOCKET, SO_RCVBUFFORCE, &bytes, sizeof(bytes)) != 0) {
    ::setsockopt(sock, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof(bytes));
  }
  sockaddr_ll sll{};
  sll.sll_family = AF_PACKET;
  sll.sll_protocol = htons(ETH_P_ALL);
  sll.sll_ifindex = static_cast<int>(ifindex);
  if (::bind(sock, reinterpret_cast<sockaddr*>(&sll), sizeof(sll)) != 0) {
    std::fprintf(stderr, "shoal_capture: bind to %s: %s\n", argv[1], std::strerror(errno));
    return 2;
  }
  FILE* out = std::fopen(argv[2], "wb");
  if (out == nullptr) {
    std::fprintf(stderr, "shoal_capture: %s: %s\n", argv[2], std::strerror(errno));
    return 2;
  }
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  sigprocmask(SIG_BLOCK, &stop, nullptr);
  const int sigfd = ::signalfd(-1, &stop, SFD_CLOEXEC);

  std::printf("ready\n");
  std::fflush(stdout);
  std::vector<char> buf(1 << 18);  // a GSO frame on a veth can be 64 KiB and more
  unsigned long long frames = 0, total = 0;
  bool stopping = false;
  for (;;) {
    pollfd fds[2] = {{sock, POLLIN, 0}, {sigfd, POLLIN, 0}};
    // Once told to stop, take what is queued without waiting, then finish.
    const int ready = ::poll(fds, 2, stopping ? 0 : -1);
    if (ready < 0 && errno == EINTR) continue;
    if (fds[1].revents & POLLIN) stopping = true;
    if (!(fds[0].revents & POLLIN)) {
      if (stopping) break;
      continue;
    }
    for (;;) {
      const ssize_t n = ::recv(sock, buf.data(), buf.size(), MSG_DONTWAIT);
      if (n <= 0) break;
      std::fwrite(buf.data(), 1, static_cast<size_t>(n), out);
      ++frames;
      total += static_cast<unsigned long long>(n);
    }
  }
  std::fclose(out);
  tpacket_stats stats{};
  socklen_t len = sizeof(stats);
  ::getsockopt(sock, SOL_PACKET, PACKET_STATISTICS, &stats, &len);
  std::printf("captured %llu frames, %llu bytes on %s; %u dropped\n", frames, total, argv[1],
              stats.tp_drops);
  return stats.tp_drops == 0 ? 0 : 3;
}
