#include "run/launcher.h"

#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <filesystem>
#include <memory>
#include <set>
#include <utility>
#include <vector>

#include "comm/native/abort_record.h"
#include "common/error.h"
#include "common/socket.h"
#include "run/elastic_supervisor.h"
#include "run/failure_blame.h"
#include "run/job_flight.h"
#include "run/job_trace.h"
#include "run/output_forwarder.h"
#include "run/process_util.h"
#include "run/rank_environment.h"
#include "run/run_directory.h"
#include "run/server_loss.h"
#include "run/spawner.h"
#include "store/etcd_store.h"
#include "store/tcp_store.h"
#include "transport/auth.h"

namespace shoal::run {

namespace {

using Clock = std::chrono::steady_clock;

// "SIGSTOP" (strsignal's "Stopped (signal)" does not say which signal).
std::string signalName(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  return abbrev ? fmt::format("SIG{}", abbrev) : fmt::format("signal {}", sig);
}

double secondsBetween(std::chrono::steady_clock::time_point a,
                      std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

struct Rank : LaunchedRank {
  Clock::time_point failedAt;  // when its failing exit was seen
  // Non-zero while the rank is stopped (SIGSTOP, SIGTSTP, ...): a local rank only, since for a
  // remote one the launcher's child is ssh, whose status says nothing about the rank.
  int stopSignal = 0;
  Clock::time_point stoppedAt;
  // A parameter server that failed in a job with replicated shards: the job went on.
  bool tolerated = false;
  Fd out, err, in;  // in: ssh's stdin (the secret, then held open as a lifeline)
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> log{nullptr, &std::fclose};
  std::deque<std::string> tail;
  std::unique_ptr<OutputForwarder> outFwd, errFwd;
};

class Job {
 public:
  // `attempt`: how many times the whole job was restarted before (SHOAL_RESTART_COUNT);
  // `started`: when its first attempt started (the time limit covers every attempt).
  Job(const LaunchOptions& o, int attempt, Clock::time_point started)
      : o_(o), attempt_(attempt), started_(started) {}

  // After run(): whether starting the job again may help (it failed by itself: not interrupted,
  // not out of time).
  bool retryable() const { return !interrupted_ && !timedOut_; }
  int initialRanks() const { return initialRanks_; }

  int run() {
    validate();
    // Before the store's thread exists, which inherits the mask: a process-directed signal must
    // find every thread blocking it, or it goes to that thread instead of the signalfd.
    blockSignals();
    startStore();
    if (elastic_) elastic_->writeJoinFile(joinVariables(o_, environment()));
    for (size_t r = 0; r < places_.size(); ++r) start(static_cast<int>(r), static_cast<int>(r));
    if (o_.verbose) {
      say("{} rank{} started; store at {}", places_.size(), places_.size() == 1 ? "" : "s",
          storeAddr_);
    }
    loop();
    return finish();
  }

  ~Job() {
    // An exception on the way: nothing may outlive the launcher.
    for (auto& r : ranks_) {
      if (r.running) {
        ::kill(-r.pid, SIGKILL);
        ::waitpid(r.pid, nullptr, 0);
      }
    }
    if (signalsBlocked_) ::sigprocmask(SIG_SETMASK, &oldMask_, nullptr);
  }

 private:
  template <typename... Args>
  void say(fmt::format_string<Args...> f, Args&&... args) {
    std::string line = "shoal run: " + fmt::format(f, std::forward<Args>(args)...) + "\n";
    [[maybe_unused]] ssize_t w = ::write(2, line.data(), line.size());
  }

  void validate() {
    if (o_.command.empty())
      SHOAL_THROW(InvalidArgument, "no program given (shoal run -n N -- prog)");
    if (o_.servers < 0)
      SHOAL_THROW(InvalidArgument, "--servers {} must not be negative", o_.servers);
    std::vector<HostSlots> hosts = o_.hosts;
    int ranks = o_.ranks == 0 ? 0 : o_.ranks + o_.servers;
    if (o_.elastic) {
      elastic_ = std::make_unique<ElasticSupervisor>(
          o_, originalMask(), [this](const std::string& line) { say("{}", line); });
      elastic_->chooseLaunch(hosts, ranks);
    } else if (!o_.hostDiscoveryScript.empty()) {
      SHOAL_THROW(InvalidArgument,
                  "--host-discovery-script needs --elastic MIN:MAX (workers come and go)");
    }
    places_ = placeRanks(ranks, hosts);
    initialRanks_ = static_cast<int>(places_.size());
    if (static_cast<int>(places_.size()) <= o_.servers) {
      SHOAL_THROW(InvalidArgument, "--servers {} leaves no slot for a worker", o_.servers);
    }
    workers_ = static_cast<int>(places_.size()) - o_.servers;
    serverLoss_.emplace(workers_, o_.servers, o_.psReplicas, o_.psReplacements);
    if (o_.psReplicas != 1 && o_.psReplicas != 2) {
      SHOAL_THROW(InvalidArgument, "--ps-replicas {}: 1 or 2", o_.psReplicas);
    }
    if (o_.psReplicas == 2 && o_.servers < 2) {
      SHOAL_THROW(InvalidArgument, "--ps-replicas 2 needs --servers 2 or more (got {})",
                  o_.servers);
    }
    if (o_.maxRestarts < 0) {
      SHOAL_THROW(InvalidArgument, "--max-restarts {} must not be negative", o_.maxRestarts);
    }
    if (o_.psReplacements < 0) {
      SHOAL_THROW(InvalidArgument, "--ps-replacements {} must not be negative", o_.psReplacements);
    }
    if (o_.psReplacements > 0 && o_.psReplicas != 2) {
      SHOAL_THROW(InvalidArgument,
                  "--ps-replacements needs --ps-replicas 2 (a replacement takes its shards from "
                  "their second copies)");
    }
    if (elastic_) elastic_->checkLaunch(initialRanks_, o_.servers);
    if (!o_.joinFile.empty() && !elastic_) {
      SHOAL_THROW(InvalidArgument,
                  "--join-file needs --elastic MIN:MAX (only an elastic job admits new workers)");
    }
    bool anyLocal = false;
    for (auto& p : places_) anyLocal |= p.local;
    program_ = findProgram(o_.command[0]);
    if (anyLocal && program_.empty()) {
      SHOAL_THROW(InvalidArgument, "program '{}' not found or not executable", o_.command[0]);
    }
    if (program_.empty()) program_ = o_.command[0];
    ssh_ = splitWords(o_.sshCommand);
    if (ssh_.empty()) SHOAL_THROW(InvalidArgument, "--ssh must name a command");
    std::set<std::string> hostNames;
    for (auto& p : places_) {
      if (hostNames.insert(p.host).second && !p.local) checkRemoteProgram(p.host);
    }
    numHosts_ = static_cast<int>(hostNames.size());
    if (!o_.outputDir.empty()) {
      std::error_code ec;
      std::filesystem::create_directories(o_.outputDir, ec);
      if (ec) {
        SHOAL_THROW(InvalidArgument, "--output-dir '{}': {}", o_.outputDir, ec.message());
      }
    }
    for (auto& [k, v] : o_.env) {
      if (k.empty() || k.find_first_of("= '\"") != std::string::npos) {
        SHOAL_THROW(InvalidArgument, "-x: malformed variable name '{}'", k);
      }
    }
    if (!o_.tracePath.empty()) prepareTraceRanksDir(traceRanksDir(o_.tracePath));
  }

  // Before anything starts: can we reach the host, and is the program there?
  void checkRemoteProgram(const std::string& host) {
    std::vector<std::string> argv = ssh_;
    argv.push_back(host);
    argv.push_back(fmt::format("cd {} 2>/dev/null; command -v {} >/dev/null",
                               shellQuote(std::filesystem::current_path().string()),
                               shellQuote(program_)));
    pid_t pid = spawnPlain(argv);
    int status = 0;
    auto deadline = Clock::now() + std::chrono::seconds(30);
    while (::waitpid(pid, &status, WNOHANG) == 0) {
      if (Clock::now() > deadline) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, &status, 0);
        SHOAL_THROW(InvalidArgument, "host '{}': '{}' did not answer within 30 s", host,
                    o_.sshCommand);
      }
      ::usleep(10000);
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) == 255) {
      SHOAL_THROW(InvalidArgument, "host '{}' cannot be reached with '{}' ({})", host,
                  o_.sshCommand, describeStatus(status));
    }
    if (WEXITSTATUS(status) != 0) {
      SHOAL_THROW(InvalidArgument, "program '{}' not found or not executable on host '{}'",
                  o_.command[0], host);
    }
  }

  pid_t spawnPlain(const std::vector<std::string>& argv) {
    SpawnOptions so;
    so.argv = argv;
    so.env = environmentWithout({});
    so.out = StreamMode::kNull;
    so.signalMask = originalMask();
    return spawn(so).pid;
  }

  void startStore() {
    if (!o_.storeUrl.empty()) {
      store::EtcdAddress::parse(o_.storeUrl);  // InvalidArgument before anything starts
      secret_ = transport::generateSecret();
      storeAddr_ = o_.storeUrl;
      return;
    }
    bool remote = false;
    for (auto& p : places_) remote |= !p.local;
    // The address every rank is told (SHOAL_STORE_ADDR).
    std::string host = "127.0.0.1";
    if (!o_.storeAddress.empty()) {
      host = o_.storeAddress;
    } else if (remote) {
      for (auto& p : places_) {
        if (p.local) continue;
        auto a = sourceAddressFor(p.host);
        if (!a) SHOAL_THROW(InvalidArgument, "no route to host '{}'", p.host);
        host = *a;
        break;
      }
    }
    secret_ = transport::generateSecret();  // ranks get it as SHOAL_SECRET (ssh: on stdin)
    store::TcpStoreServerOptions so;
    so.secret = secret_;
    so.encrypt = o_.encrypt;
    // The store listens where the ranks reach it, and nowhere else: that address when it is one
    // of this host's, else (a --store-addr that is not, e.g. a forwarded one) every interface.
    const std::optional<std::string> own = resolveIPv4(host);
    try {
      store_ = std::make_unique<store::TcpStoreServer>(own.value_or("0.0.0.0"), o_.port, so);
    } catch (const SystemError& e) {
      if (!own || isLoopback(*own)) {
        SHOAL_THROW(InvalidArgument, "--port {}: the port is busy or cannot be bound ({})", o_.port,
                    e.what());
      }
      try {
        store_ = std::make_unique<store::TcpStoreServer>("0.0.0.0", o_.port, so);
        say("the store listens on every interface: {} is not an address of this host ({})", *own,
            e.what());
      } catch (const SystemError& e2) {
        SHOAL_THROW(InvalidArgument, "--port {}: the port is busy or cannot be bound ({})", o_.port,
                    e2.what());
      }
    }
    storeHost_ = host;
    storeAddr_ = fmt::format("{}:{}", host, store_->port());
  }

  // The launcher's mask before it blocked the signals it reads through the signalfd: what the
  // programs it starts inherit.
  sigset_t originalMask() const {
    sigset_t m;
    if (signalsBlocked_) return oldMask_;
    ::sigprocmask(SIG_BLOCK, nullptr, &m);
    return m;
  }

  void blockSignals() {
    sigset_t set;
    sigemptyset(&set);
    for (int s : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) sigaddset(&set, s);
    ::sigprocmask(SIG_BLOCK, &set, &oldMask_);
    signalsBlocked_ = true;
    signalFd_ = Fd(::signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK));
    if (!signalFd_.valid()) throwSystemError("signalfd", errno);
    ::signal(SIGPIPE, SIG_IGN);  // a rank's pipe closing must not kill the launcher
  }

  JobEnvironment environment() const {
    return {.worldSize = initialRanks_,
            .numHosts = numHosts_,
            .workers = workers_,
            .storeAddress = storeAddr_,
            .storeHost = storeHost_,  // set only for a store hosted here
            .storePort = store_ ? std::to_string(store_->port()) : std::string(),
            .secret = secret_,
            .attempt = attempt_};
  }

  void start(int r, int member) {
    Rank& rk = ranks_.emplace_back();
    rk.rank = r;
    rk.member = member;
    rk.where = places_[static_cast<size_t>(r)];
    if (elastic_) elastic_->started(rk);
    if (!o_.outputDir.empty()) {
      std::string path = fmt::format("{}/rank{}.log", o_.outputDir, r);
      // A restarted worker continues its slot's log.
      // So does every rank of a restarted job.
      rk.log.reset(std::fopen(path.c_str(), logged_.insert(r).second && attempt_ == 0 ? "w" : "a"));
      if (!rk.log) throwSystemError("open " + path, errno);
    }
    rk.outFwd = std::make_unique<OutputForwarder>(r, 1, rk.log.get(), &rk.tail);
    rk.errFwd = std::make_unique<OutputForwarder>(r, 2, rk.log.get(), &rk.tail);

    auto vars = rankVariables(o_, environment(), rk.where, r, member);
    if (const int replacement = serverLoss_->replacementOf(r); replacement > 0) {
      vars.emplace_back("SHOAL_PS_REPLACEMENT", std::to_string(replacement));
    }
    SpawnOptions so;
    if (rk.where.local) {
      so.argv = o_.command;
      so.argv[0] = program_;
      so.env = environmentWithout(namesOf(vars, {"SHOAL_SECRET"}));
      for (auto& [k, v] : vars) so.env.push_back(k + "=" + v);
      so.env.push_back("SHOAL_SECRET=" + secret_);
    } else {
      so.argv = ssh_;
      so.argv.push_back(rk.where.host);
      so.argv.push_back(remoteRankCommand(o_, program_, vars));
      so.env = environmentWithout({});
      so.stdinPipe = true;  // the secret, then held open as the rank's lifeline
    }
    so.out = so.err = StreamMode::kPipe;
    so.signalMask = originalMask();
    SpawnedProcess child = spawn(so);
    rk.out = std::move(child.out);
    rk.err = std::move(child.err);
    if (child.in.valid()) {
      rk.in = std::move(child.in);
      std::string line = secret_ + "\n";
      [[maybe_unused]] ssize_t w = ::write(rk.in.get(), line.data(), line.size());
    }
    rk.pid = child.pid;
    rk.running = true;
  }

  void loop() {
    while (true) {
      bool anyRunning = false, anyOpen = false;
      for (auto& r : ranks_) {
        anyRunning |= r.running;
        anyOpen |= r.out.valid() || r.err.valid();
      }
      if (!anyRunning) {
        // Output still held open by something the rank left behind: its process group was
        // killed when it exited, so the pipes close momentarily; do not wait for ever.
        if (!anyOpen) return;
        if (!drainUntil) drainUntil = Clock::now() + std::chrono::seconds(2);
        if (Clock::now() > *drainUntil) return;
      }
      std::vector<pollfd> fds{{signalFd_.get(), POLLIN, 0}};
      std::vector<std::pair<Rank*, bool>> owners{{nullptr, false}};
      for (auto& r : ranks_) {
        if (r.out.valid()) {
          fds.push_back({r.out.get(), POLLIN, 0});
          owners.emplace_back(&r, false);
        }
        if (r.err.valid()) {
          fds.push_back({r.err.get(), POLLIN, 0});
          owners.emplace_back(&r, true);
        }
      }
      if (elastic_ && elastic_->discoveryFd() >= 0) {
        fds.push_back({elastic_->discoveryFd(), POLLIN, 0});
        owners.emplace_back(nullptr, false);
      }
      int waitMs = settleAt_ ? 20 : 200;
      if (killAt_) {
        waitMs = std::clamp<int>(
            static_cast<int>(
                std::chrono::duration_cast<std::chrono::milliseconds>(*killAt_ - Clock::now())
                    .count()),
            0, waitMs);
      }
      int n = ::poll(fds.data(), fds.size(), waitMs);
      if (n < 0 && errno != EINTR) throwSystemError("poll", errno);
      if (fds[0].revents) handleSignals();
      reap();  // cheap, and robust to a SIGCHLD that went elsewhere
      // Outside reap(): starting a rank adds to ranks_, which reap() walks.
      for (int rank : std::exchange(pendingReplacements_, {})) {
        if (stopping_) continue;
        start(rank, rank);
        serverLoss_->replacementStarted(rank);
      }
      if (elastic_) {
        elastic_->supervise(places_, stopping_, [this](int r, int member) { start(r, member); });
      }
      settle();
      for (size_t i = 1; i < fds.size(); ++i) {
        if (fds[i].revents && owners[i].first) readFrom(*owners[i].first, owners[i].second);
      }
      if (o_.timeLimitSeconds && !stopping_ &&
          Clock::now() - started_ > std::chrono::duration<double>(*o_.timeLimitSeconds)) {
        timedOut_ = true;
        say("time limit of {} s reached", *o_.timeLimitSeconds);
        stopAll(SIGTERM);
      }
      if (killAt_ && Clock::now() >= *killAt_) {
        killAt_.reset();
        int left = 0;
        for (auto& r : ranks_) left += r.running;
        if (left > 0) {
          say("{} rank{} still running after {} s: SIGKILL", left, left == 1 ? "" : "s",
              o_.graceSeconds);
          for (auto& r : ranks_) {
            if (r.running) ::kill(-r.pid, SIGKILL);
          }
        }
      }
    }
  }

  void readFrom(Rank& r, bool isErr) {
    Fd& fd = isErr ? r.err : r.out;
    char buf[16384];
    ssize_t got = ::read(fd.get(), buf, sizeof(buf));
    if (got > 0) {
      (isErr ? r.errFwd : r.outFwd)->feed(buf, static_cast<size_t>(got));
    } else if (got == 0 || (errno != EINTR && errno != EAGAIN)) {
      (isErr ? r.errFwd : r.outFwd)->finish();
      fd.reset();
    }
  }

  void handleSignals() {
    signalfd_siginfo info;
    while (::read(signalFd_.get(), &info, sizeof(info)) == sizeof(info)) {
      const int sig = static_cast<int>(info.ssi_signo);
      if (sig == SIGCHLD) {
        reap();
        continue;
      }
      if (interrupted_) {
        say("second {}: killing every rank now", strsignal(sig));
        for (auto& r : ranks_) {
          if (r.running) ::kill(-r.pid, SIGKILL);
        }
        continue;
      }
      interrupted_ = sig;
      int left = 0;
      for (auto& r : ranks_) left += r.running;
      say("interrupted ({}): stopping {} rank{}", strsignal(sig), left, left == 1 ? "" : "s");
      stopAll(SIGTERM);
    }
  }

  // Failures are collected for a settling window of 1 s before one is blamed
  // (run/failure_blame.h). The window also lets the survivors report why they fail (each names
  // the rank where the failure started) before they are stopped, even on a loaded machine.
  void reap() {
    // By pid, not waitpid(-1): the host discovery program is reaped by its own code.
    for (auto& r : ranks_) {
      while (r.running) {
        int status = 0;
        // WUNTRACED / WCONTINUED: the signalfd gets SIGCHLD for stops too (the launcher has no
        // SA_NOCLDSTOP handler), and a stopped rank is what its peers will time out on.
        const pid_t pid = ::waitpid(r.pid, &status, WNOHANG | WUNTRACED | WCONTINUED);
        if (pid <= 0) break;
        onStatus(r, status);
      }
    }
  }

  void onStatus(Rank& r, int status) {
    if (WIFSTOPPED(status)) {
      if (r.stopSignal == 0) {
        r.stopSignal = WSTOPSIG(status);
        r.stoppedAt = Clock::now();
        if (!stopping_) {
          say("rank {} ({}, pid {}) was stopped ({}); its peers will time out unless it "
              "continues",
              r.rank, r.where.host, r.pid, signalName(r.stopSignal));
        }
      }
      return;
    }
    if (WIFCONTINUED(status)) {
      if (r.stopSignal != 0 && !stopping_) say("rank {} continued", r.rank);
      r.stopSignal = 0;
      return;
    }
    r.running = false;
    r.status = status;
    r.in.reset();
    // Whatever the rank started goes with it.
    ::kill(-r.pid, SIGKILL);
    const bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    if (elastic_ && elastic_->ended(r, failed, stopping_)) return;
    if (failed && !stopping_) {
      // run/server_loss.h: a server of a replicated job may be lost (and replaced).
      if (auto verdict = serverLoss_->failed(r.rank)) {
        r.tolerated = verdict->tolerated;
        if (verdict->replacement > 0) pendingReplacements_.push_back(r.rank);
        say("parameter server {} (rank {}) {}; {}", r.rank - workers_, r.rank,
            describeRankStatus(status, r.where.local), verdict->message);
        return;
      }
    }
    if (failed && !stopping_) {
      r.failedAt = Clock::now();
      candidates_.push_back(&r);
      if (!settleAt_) settleAt_ = Clock::now() + std::chrono::milliseconds(1000);
    }
  }

  // The settling window is over: blame a rank (run/failure_blame.h) and stop the others.
  void settle() {
    if (!settleAt_ || Clock::now() < *settleAt_) return;
    settleAt_.reset();
    if (stopping_ || candidates_.empty()) return;
    std::vector<RankFailure> failures;
    for (const Rank* c : candidates_) {
      failures.push_back({c->rank, c->status, c->where.local, c->failedAt, abortCause(c->rank)});
    }
    std::vector<RankStop> stops;
    std::vector<Rank*> stoppedRanks;
    for (auto& r : ranks_) {
      if (r.running && r.stopSignal != 0) {
        stops.push_back({r.rank, r.stoppedAt});
        stoppedRanks.push_back(&r);
      }
    }
    const Blame blame = blameFailure(failures, stops);
    firstFailed_ = candidates_[blame.firstFailed];
    failed_ = firstFailed_;
    if (blame.stopped) stopped_ = stoppedRanks[*blame.stopped];
    int left = 0;
    for (auto& o : ranks_) left += o.running;
    if (stopped_) {
      failed_ = stopped_;
      say("rank {} ({}) was stopped ({}) and its peers timed out waiting for it (rank {} {}, "
          "{:.1f} s after the stop); stopping the {} rank{} still running",
          stopped_->rank, stopped_->where.host, signalName(stopped_->stopSignal),
          firstFailed_->rank, describeRankStatus(firstFailed_->status, firstFailed_->where.local),
          secondsBetween(stopped_->stoppedAt, firstFailed_->failedAt), left, left == 1 ? "" : "s");
    } else {
      say("rank {} ({}) {}; stopping the other {} rank{}", failed_->rank, failed_->where.host,
          describeRankStatus(failed_->status, failed_->where.local), left, left == 1 ? "" : "s");
    }
    stopAll(SIGTERM);
  }

  // The rank that `rank`'s abort record in the job's store names as where its world group's
  // failure started (comm/native/abort_record.h), or -1: no record, or no store hosted here
  // (etcd's or an elastic job's views are not read). The world is the rank's first one
  // (generation 0). A short, bounded lookup; errors mean no record.
  int abortCause(int rank) {
    if (!store_ || elastic_) return -1;
    try {
      if (!recordReader_) {
        recordReader_ =
            std::make_unique<store::TcpStore>(HostPort{"127.0.0.1", store_->port()},
                                              std::chrono::milliseconds(500), secret_, o_.encrypt);
      }
      const std::string key = comm::worldPrefix(0) + "/" + comm::abortRecordKey(rank);
      if (!recordReader_->check({key})) return -1;
      const auto record = comm::decodeAbortRecord(
          recordReader_->get(key, std::chrono::milliseconds(500)), static_cast<int>(ranks_.size()));
      return record ? record->origin : -1;
    } catch (const Error&) {
      return -1;
    }
  }

  void stopAll(int sig) {
    stopping_ = true;
    for (auto& r : ranks_) {
      if (!r.running) continue;
      r.in.reset();  // a remote rank's lifeline
      ::kill(-r.pid, sig);
      // A stopped rank acts on the signal only once continued (harmless for the others).
      ::kill(-r.pid, SIGCONT);
    }
    killAt_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                 std::chrono::duration<double>(o_.graceSeconds));
  }

  int finish() {
    if (settleAt_) {
      settleAt_ = Clock::now();  // every rank ended inside the settling window
      settle();
    }
    for (auto& r : ranks_) {
      r.outFwd->finish();
      r.errFwd->finish();
    }
    if (failed_) {
      std::string lines;
      for (auto& l : failed_->tail) lines += "\n    " + l;
      const std::string last =
          failed_->tail.empty() ? " It printed nothing." : fmt::format(" Its last lines:{}", lines);
      if (stopped_) {
        say("job failed: rank {} (host {}, pid {}) was stopped ({}) and never continued; the "
            "other ranks timed out waiting for it (the first to fail: rank {}, {}).{}",
            stopped_->rank, stopped_->where.host, stopped_->pid, signalName(stopped_->stopSignal),
            firstFailed_->rank, describeRankStatus(firstFailed_->status, firstFailed_->where.local),
            last);
        return 128 + stopped_->stopSignal;
      }
      say("job failed: rank {} (host {}, pid {}) failed first: {}.{}", failed_->rank,
          failed_->where.host, failed_->pid,
          describeRankStatus(failed_->status, failed_->where.local), last);
      return exitCodeOf(failed_->status);
    }
    if (interrupted_) return 128 + interrupted_;
    if (timedOut_) return 124;
    if (elastic_) return elastic_->finish();
    // A rank that failed while the job was already stopping is still a failure.
    for (auto& r : ranks_) {
      if (!r.tolerated && !(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0)) {
        return exitCodeOf(r.status);
      }
    }
    if (o_.verbose) {
      size_t tolerated = 0;
      for (const auto& r : ranks_) tolerated += r.tolerated ? 1 : 0;
      if (tolerated == 0) {
        say("all {} ranks exited 0", ranks_.size());
      } else {
        say("the job ended: {} of {} processes exited 0, and the job went on without the {} "
            "parameter server process{} it lost (replicated shards)",
            ranks_.size() - tolerated, ranks_.size(), tolerated, tolerated == 1 ? "" : "es");
      }
    }
    return 0;
  }

  const LaunchOptions& o_;
  const int attempt_;
  const Clock::time_point started_;
  std::vector<Placement> places_;
  std::string program_;
  std::vector<std::string> ssh_;
  std::unique_ptr<store::TcpStoreServer> store_;
  std::unique_ptr<store::TcpStore> recordReader_;  // abortCause()'s client of store_
  std::string storeHost_, storeAddr_, secret_;
  int numHosts_ = 1;
  int workers_ = 0;
  std::deque<Rank> ranks_;  // stable addresses
  // Replicated parameter servers: which losses the job survives, which to replace
  // (run/server_loss.h); the replacements to start once reap() is done.
  std::optional<ServerLossPolicy> serverLoss_;
  std::vector<int> pendingReplacements_;
  Fd signalFd_;
  sigset_t oldMask_{};
  bool signalsBlocked_ = false;
  bool stopping_ = false;
  bool timedOut_ = false;
  int interrupted_ = 0;
  Rank* failed_ = nullptr;       // the rank the summary blames
  Rank* firstFailed_ = nullptr;  // the first rank seen failing
  Rank* stopped_ = nullptr;      // set when a stopped rank is blamed (run/failure_blame.h)
  std::optional<Clock::time_point> killAt_;
  std::optional<Clock::time_point> settleAt_;
  std::vector<Rank*> candidates_;
  std::optional<Clock::time_point> drainUntil;
  int initialRanks_ = 0;  // started at launch: SHOAL_WORLD_SIZE, membership's first view
  std::set<int> logged_;  // slots whose log file was started
  // Elastic jobs only. Last: destroyed first, so the join file goes before the store does.
  std::unique_ptr<ElasticSupervisor> elastic_;
};

}  // namespace

int launch(const LaunchOptions& given) {
  const auto started = Clock::now();
  RunDirectory runDir(given);
  LaunchOptions options = given;
  if (runDir.enabled() && options.flightDir.empty()) options.flightDir = runDir.dir() + "/flight";
  JobFlight flight(options);
  for (auto& kv : flight.variables()) options.env.push_back(std::move(kv));
  for (auto& kv : runDir.variables()) options.env.push_back(std::move(kv));
  for (int attempt = 0;; ++attempt) {
    int code = 0, ranks = 0;
    bool retry = false;
    try {
      flight.prepare();
      runDir.attemptStarted();
      Job job(options, attempt, started);
      code = job.run();
      ranks = job.initialRanks();
      retry = code != 0 && !options.elastic && attempt < options.maxRestarts && job.retryable();
    } catch (const InvalidArgument&) {
      runDir.finish(2);  // what `shoal run` exits with for a configuration error
      throw;
    } catch (...) {
      runDir.finish(1);
      throw;
    }
    if (code != 0) flight.report(ranks);
    if (!retry) {
      if (!options.tracePath.empty()) {
        mergeJobTrace(options.tracePath, options.elastic ? 0 : ranks);
      }
      runDir.finish(code, ranks);
      return code;
    }
    const std::string line = fmt::format(
        "shoal run: the job failed (exit code {}); starting every rank again (restart {} of "
        "{}, SHOAL_RESTART_COUNT={}): they resume from their last checkpoint\n",
        code, attempt + 1, options.maxRestarts, attempt + 1);
    [[maybe_unused]] ssize_t w = ::write(2, line.data(), line.size());
  }
}

}  // namespace shoal::run
