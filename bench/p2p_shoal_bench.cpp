// Shoal's point-to-point (comm::send / comm::recv) between two local ranks over one transport
// (--encrypt on: TCP links in TLS, checked, labelled "tcp+tls"):
// ping-pong latency, one-way bandwidth, both ways at once. Started plainly it launches itself
// as 2 local processes; each rank runs the shared loop (bench/bench_common.h: calibrated
// repetitions, every message checked). Exits non-zero if any message arrived wrong.
#include <CLI/CLI.hpp>
#include <cstdlib>
#include <sstream>

#include "bench/bench_common.h"
#include "bench/shoal_links.h"
#include "comm/collectives.h"
#include "run/init.h"
#include "run/local_job.h"

// Note [Both ways at once]
// Both ranks post a non-blocking comm::isend and comm::irecv and wait for both (each (peer, tag)
// has its own channel, so the two directions move together). Before isend/irecv existed,
// sendAsync / recvAsync ran one at a time on the group's executor, and two ranks that both
// posted their send first could deadlock once a message outgrew what the link buffers. The
// --exchange choices keep the older forms for comparison:
//   isend     isend + irecv on both ranks, then wait for both (the default);
//   serial    sendAsync / recvAsync ordered by rank (rank 0 sends first): the directions take
//             turns, so this measures a round trip, not concurrency;
//   async     sendAsync then recvAsync on both ranks.
// SHOAL_BENCH_HAVE_ISEND=0 builds without isend (for a tree that predates it).
#ifndef SHOAL_BENCH_HAVE_ISEND
#define SHOAL_BENCH_HAVE_ISEND 0
#endif

using namespace shoal;

int main(int argc, char** argv) {
  CLI::App app{"Shoal point-to-point benchmark"};
  bench::MeasureOptions m;
  std::string transport = "shm", modes = "pingpong,oneway,bothways";
  std::string exchange = SHOAL_BENCH_HAVE_ISEND ? "isend" : "serial";
  size_t latencyMax = 4096, bandwidthMin = 64u << 10, bandwidthMax = 64u << 20;
  double timeoutSeconds = 60;
  std::string encrypt = "off";
  app.add_option("--transport", transport)->check(CLI::IsMember({"shm", "tcp"}));
  app.add_option("--encrypt", encrypt, "TLS on the TCP links (SHOAL_ENCRYPT; needs tcp)")
      ->check(CLI::IsMember({"off", "on"}));
  app.add_option("--modes", modes, "comma-separated: pingpong, oneway, bothways");
  app.add_option("--exchange", exchange,
                 "how bothways posts its transfers (Note [Both ways at once])")
      ->check(CLI::IsMember({"isend", "serial", "async"}));
  app.add_option("--reps", m.reps, "measurements per size")->check(CLI::Range(1, 1000));
  app.add_option("--corrupt-rank", m.corruptRank, "test hook: damage this rank's results")
      ->check(CLI::Range(-1, 63));
  app.add_option("--min-seconds", m.minSeconds, "lower bound on one measurement")
      ->check(CLI::Range(0.0, 60.0));
  app.add_option("--latency-max-bytes", latencyMax, "ping-pong sizes 8 B x 8 up to this")
      ->check(CLI::Range(size_t{8}, size_t{1} << 20));
  app.add_option("--bandwidth-min-bytes", bandwidthMin)
      ->check(CLI::Range(size_t{8}, size_t{1} << 32));
  app.add_option("--bandwidth-max-bytes", bandwidthMax, "bandwidth sizes x 4 up to this")
      ->check(CLI::Range(size_t{8}, size_t{1} << 32));
  app.add_option("--timeout", timeoutSeconds, "seconds, per operation")
      ->check(CLI::Range(1.0, 3600.0));
  CLI11_PARSE(app, argc, argv);
  if (encrypt == "on" && transport != "tcp") {
    std::fprintf(stderr,
                 "--encrypt on: needs --transport tcp (shared memory is never encrypted)\n");
    return 2;
  }
  if (exchange == "isend" && !SHOAL_BENCH_HAVE_ISEND) {
    std::fprintf(
        stderr,
        "--exchange isend: built with SHOAL_BENCH_HAVE_ISEND=0 (Note [Both ways at once])\n");
    return 2;
  }

  if (!std::getenv("SHOAL_RANK")) {
    return run::runSelfLocally(2,
                               {"--transport",
                                transport,
                                "--encrypt",
                                encrypt,
                                "--modes",
                                modes,
                                "--exchange",
                                exchange,
                                "--reps",
                                std::to_string(m.reps),
                                "--min-seconds",
                                std::to_string(m.minSeconds),
                                "--corrupt-rank",
                                std::to_string(m.corruptRank),
                                "--latency-max-bytes",
                                std::to_string(latencyMax),
                                "--bandwidth-min-bytes",
                                std::to_string(bandwidthMin),
                                "--bandwidth-max-bytes",
                                std::to_string(bandwidthMax),
                                "--timeout",
                                std::to_string(timeoutSeconds)},
                               {{"SHOAL_TRANSPORT", transport}, {"SHOAL_ENCRYPT", encrypt}},
                               std::chrono::minutes(30));
  }

  World session = init();  // kept: with SHOAL_TRACE it writes the rank's trace when it goes
  auto world = session.group;
  comm::Group& g = *world;
  if (!bench::linksAre(g, encrypt == "on"      ? transport::LinkKind::kTls
                          : transport == "tcp" ? transport::LinkKind::kTcp
                                               : transport::LinkKind::kShm)) {
    return 1;
  }
  const int peer = 1 - g.rank();
  const comm::CallOptions call{.timeout = std::chrono::duration_cast<Duration>(
                                   std::chrono::duration<double>(timeoutSeconds))};
  bench::PointToPoint p;
  p.send = [&](const void* d, size_t bytes) {
    comm::send(g, d, bytes, DataType::kUInt8, peer, call);
  };
  p.recv = [&](void* d, size_t bytes) { comm::recv(g, d, bytes, DataType::kUInt8, peer, call); };
  p.exchange = [&](const void* out, void* in, size_t bytes) {
#if SHOAL_BENCH_HAVE_ISEND
    if (exchange == "isend") {
      auto s = comm::isend(g, out, bytes, DataType::kUInt8, peer, /*tag=*/0, call);
      auto r = comm::irecv(g, in, bytes, DataType::kUInt8, peer, /*tag=*/0, call);
      s->wait();
      r->wait();
      return;
    }
#endif
    std::shared_ptr<comm::Work> first, second;
    if (exchange == "async" || g.rank() == 0) {
      first = comm::sendAsync(g, out, bytes, DataType::kUInt8, peer, call);
      second = comm::recvAsync(g, in, bytes, DataType::kUInt8, peer, call);
    } else {
      first = comm::recvAsync(g, in, bytes, DataType::kUInt8, peer, call);
      second = comm::sendAsync(g, out, bytes, DataType::kUInt8, peer, call);
    }
    first->wait();
    second->wait();
  };
  p.timing.maxOverRanks = [&](double v) {
    comm::allreduce(g, &v, 1, DataType::kFloat64, ReduceOp::kMax);
    return v;
  };
  p.timing.barrier = [&] { comm::barrier(g); };

  std::stringstream list(modes);
  std::string name;
  while (std::getline(list, name, ',')) {
    bench::P2pMode mode;
    std::vector<size_t> sizes;
    std::string variant = transport + (encrypt == "on" ? "+tls" : "");
    if (name == "pingpong") {
      mode = bench::P2pMode::kPingPong;
      for (size_t b = 8; b <= latencyMax; b *= 8) sizes.push_back(b);
    } else if (name == "oneway" || name == "bothways") {
      mode = name == "oneway" ? bench::P2pMode::kOneWay : bench::P2pMode::kBothWays;
      sizes = bench::powersOf4(bandwidthMin, bandwidthMax);
      if (name == "bothways") variant += "/" + exchange;
    } else {
      std::fprintf(stderr, "--modes: unknown mode '%s'\n", name.c_str());
      return 2;
    }
    if (!bench::runP2p("shoal", variant, g.rank(), g.size(), p, mode, sizes, m)) return 1;
  }
  return 0;
}
