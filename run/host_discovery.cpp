#include "run/host_discovery.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>

#include "common/error.h"
#include "run/process_util.h"
#include "run/spawner.h"

namespace shoal::run {

namespace {

constexpr size_t kMaxOutput = 64 * 1024;

}  // namespace

HostDiscovery::HostDiscovery(HostDiscoveryOptions options) : options_(std::move(options)) {}

HostDiscovery::~HostDiscovery() {
  if (pid_ > 0) {
    ::kill(-pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
}

void HostDiscovery::start() {
  SpawnOptions so;
  so.argv = {options_.program};
  so.env = environmentWithout({"SHOAL_SECRET"});
  so.out = StreamMode::kPipe;
  so.err = StreamMode::kInherit;  // its complaints reach the user as they are
  so.signalMask = options_.signalMask;
  SpawnedProcess p = spawn(so);
  pid_ = p.pid;
  out_ = std::move(p.out);
  ::fcntl(out_.get(), F_SETFL, ::fcntl(out_.get(), F_GETFL) | O_NONBLOCK);
  output_.clear();
  tooLong_ = false;
  startedAt_ = Clock::now();
}

std::optional<DiscoveryResult> HostDiscovery::poll() {
  if (pid_ < 0) {
    if (Clock::now() < nextAt_) return std::nullopt;
    try {
      start();
    } catch (const Error& e) {
      nextAt_ = Clock::now() + options_.interval;
      return DiscoveryResult{{},
                             fmt::format("host discovery '{}': {}", options_.program, e.what())};
    }
  }
  return finishIfExited();
}

// Reads what is there, then: the result if the program has exited (or overran and was killed).
std::optional<DiscoveryResult> HostDiscovery::finishIfExited() {
  char buf[4096];
  while (out_.valid()) {
    const ssize_t got = ::read(out_.get(), buf, sizeof(buf));
    if (got > 0) {
      // Past the bound the rest is drained and dropped, so the program does not block on a
      // full pipe before it exits.
      if (output_.size() + static_cast<size_t>(got) > kMaxOutput) tooLong_ = true;
      if (!tooLong_) output_.append(buf, static_cast<size_t>(got));
      continue;
    }
    if (got < 0 && errno == EINTR) continue;
    if (got < 0 && errno == EAGAIN) break;
    out_.reset();  // end of output (or an error reading it)
  }
  int status = 0;
  pid_t done = ::waitpid(pid_, &status, WNOHANG);
  std::optional<std::string> overran;
  if (done == 0 && Clock::now() - startedAt_ > options_.timeout) {
    ::kill(-pid_, SIGKILL);
    done = ::waitpid(pid_, &status, 0);
    overran =
        fmt::format("host discovery '{}' did not finish within {:.0f} s; killed", options_.program,
                    std::chrono::duration<double>(options_.timeout).count());
  }
  if (done == 0) return std::nullopt;
  // Its process group goes with it: nothing it started outlives the run.
  ::kill(-pid_, SIGKILL);
  pid_ = -1;
  out_.reset();
  nextAt_ = Clock::now() + options_.interval;
  if (overran) return DiscoveryResult{{}, overran};
  return parse(status);
}

DiscoveryResult HostDiscovery::parse(int status) const {
  const std::string who = fmt::format("host discovery '{}'", options_.program);
  if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
    return {{}, fmt::format("{} {}", who, describeStatus(status))};
  }
  if (tooLong_) return {{}, fmt::format("{} printed more than {} bytes", who, kMaxOutput)};
  std::vector<HostSlots> listed;
  try {
    listed = parseHostLines(output_, who);
  } catch (const InvalidArgument& e) {
    return {{}, e.what()};
  }
  if (listed.empty()) return {{}, fmt::format("{} listed no hosts", who)};
  // A host listed twice has the sum of its slots (each host's local ranks count from 0).
  std::vector<HostSlots> hosts;
  for (auto& h : listed) {
    auto same = std::find_if(hosts.begin(), hosts.end(),
                             [&](const HostSlots& o) { return o.host == h.host; });
    if (same != hosts.end()) {
      same->slots += h.slots;
    } else if (!isLocalHost(h.host) && !resolveIPv4(h.host)) {
      return {{}, fmt::format("{}: unknown host '{}' (it does not resolve)", who, h.host)};
    } else {
      hosts.push_back(h);
    }
  }
  return {hosts, std::nullopt};
}

std::vector<HostSlots> HostDiscovery::runNow() {
  start();
  Fd exited = openPidFd(pid_);
  while (true) {
    if (auto r = finishIfExited()) {
      if (r->error) SHOAL_THROW(InvalidArgument, "{}", *r->error);
      return r->hosts;
    }
    // Woken by output, by the exit, or at the deadline (checked above on the next turn).
    const auto left = options_.timeout - (Clock::now() - startedAt_);
    const int ms = static_cast<int>(std::clamp<int64_t>(
        std::chrono::duration_cast<std::chrono::milliseconds>(left).count() + 1, 0, 1000));
    pollfd fds[2] = {{exited.get(), POLLIN, 0}, {out_.valid() ? out_.get() : -1, POLLIN, 0}};
    ::poll(fds, 2, ms);
  }
}

}  // namespace shoal::run
