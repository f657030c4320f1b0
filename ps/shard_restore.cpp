#include "ps/shard_restore.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string_view>
#include <utility>

#include "comm/collectives.h"
#include "common/error.h"
#include "common/sealed_file.h"

namespace shoal::ps {

namespace {

constexpr std::string_view kServersTag = "#servers ";
constexpr int64_t kMaxServers = 1 << 16;

// The header of a snapshot: settings, then "#servers s N" (absent in older files), then keys.
struct Header {
  std::string configText;
  int server = -1, servers = 0;  // 0: not recorded
  std::string keysText;
};

Header parseHeader(const std::string& payload, const std::string& path) {
  const std::string header = Shard::snapshotHeader(payload, path);
  Header h;
  const auto nl = header.find('\n');
  if (nl == std::string::npos) {
    SHOAL_THROW(InvalidArgument, "{} is corrupt: its header holds no keys", path);
  }
  h.configText = header.substr(0, nl);
  std::string_view rest = std::string_view(header).substr(nl + 1);
  if (rest.starts_with(kServersTag)) {
    const auto end = rest.find('\n');
    const std::string line(rest.substr(0, end));
    long long s = -1, n = 0;
    char extra = 0;
    if (end == std::string_view::npos ||
        std::sscanf(line.c_str() + kServersTag.size(), "%lld %lld%c", &s, &n, &extra) != 2 ||
        n < 1 || n > kMaxServers || s < 0 || s >= n) {
      SHOAL_THROW(InvalidArgument, "{} is corrupt: its header line '{}' is malformed", path, line);
    }
    h.server = static_cast<int>(s);
    h.servers = static_cast<int>(n);
    rest = rest.substr(end + 1);
  }
  h.keysText = std::string(rest);
  return h;
}

SealedSeries seriesOf(const std::string& dir, int server, int keep) {
  return SealedSeries(shardCheckpointFolder(dir, server), "shard-", ".bin", keep);
}

// The newest step in server s's folder, or -1 (the files are not read; a missing folder is not
// created).
int64_t newestOf(const std::string& dir, int server, int keep) {
  if (!std::filesystem::is_directory(shardCheckpointFolder(dir, server))) return -1;
  const auto files = seriesOf(dir, server, keep).list();
  return files.empty() ? -1 : files.back().first;
}

}  // namespace

std::string shardCheckpointFolder(const std::string& dir, int server) {
  return fmt::format("{}/server-{}", dir, server);
}

std::string shardCheckpointHeader(const std::string& configText, int server, int servers,
                                  const std::string& keysText) {
  return fmt::format("{}\n{}{} {}\n{}", configText, kServersTag, server, servers, keysText);
}

// Note [Resharding checkpoints]: server s writes its shard of step T to
// <dir>/server-<s>/shard-<T>.bin; the header records "#servers s N" (after the settings line,
// before the keys), the writer and the server count of its job. On resume:
//  1. Server 0's newest checkpoint says how many servers wrote the checkpoints to resume from
//     (N). A file without the line (written before it existed) counts the server-<s> folders
//     holding checkpoints from server-0 on, at least this job's count if every server has one.
//  2. The step is the newest one every one of those N servers has: running servers s < N vote
//     with their own folder; folders of old servers this job does not run (s >= this job's
//     count) are listed by every server (resharding needs a folder every server can read).
//     Folders of servers s >= N are stale, left by an older job with more servers: ignored,
//     never removed (the next resume reads N from server 0 again).
//  3. Same count: each server restores its own file. Another count: each server builds its
//     shard under this job's partition and, for every old server whose range of the flat space
//     overlaps its own, restores that file into a shard of the old partition (Partition(keys,
//     N)) and copies the shared elements (Shard::copyOverlap): values, optimizer state,
//     versions. The worker clocks are the step's (every checkpoint saves the clocks as its
//     step, so every worker resumes there, in every mode).
// Each file read is checked: its seal, its size against the partition before anything is sized
// from it, its "#servers" line against the folder and N, its settings and keys against the
// other files.
std::optional<RestoredShard> restoreShard(comm::Group& servers, int workers, const std::string& dir,
                                          int keep) {
  const int id = servers.rank(), count = servers.size();
  const auto own = seriesOf(dir, id, keep).list();
  // {newest own step, the server count server 0's newest records (0: not recorded; -1:
  // unreadable), the server-<s> folders with checkpoints (server 0 only)}
  int64_t vote[3] = {own.empty() ? -1 : own.back().first, 0, 0};
  std::string newestPayload, error;
  if (id == 0 && !own.empty()) {
    try {
      newestPayload = readSealedFile(own.back().second);
      vote[1] = parseHeader(newestPayload, own.back().second).servers;
      while (vote[2] < kMaxServers && newestOf(dir, static_cast<int>(vote[2]), keep) >= 0) {
        ++vote[2];
      }
    } catch (const std::exception& e) {
      error = e.what();
      vote[1] = -1;
    }
  }
  std::vector<int64_t> all(3 * static_cast<size_t>(count));
  comm::allgather(servers, vote, all.data(), 3, DataType::kInt64);
  if (all[1] < 0) {
    if (id == 0) SHOAL_THROW(InvalidArgument, "parameter server 0: cannot resume: {}", error);
    SHOAL_THROW(InvalidArgument,
                "parameter server {}: cannot resume: server 0 cannot read its newest checkpoint",
                id);
  }
  auto noCheckpoint = [&](int64_t without, int64_t with, int64_t step) {
    SHOAL_THROW(InvalidArgument,
                "parameter server {}: cannot resume: server {} has no checkpoint in {} while "
                "server {} has step {}",
                id, without, dir, with, step);
  };
  if (all[0] < 0) {
    for (int s = 1; s < count; ++s) {
      if (all[3 * s] >= 0) noCheckpoint(0, s, all[3 * s]);
    }
    return std::nullopt;  // a fresh job
  }
  int old = static_cast<int>(all[1]);
  if (old == 0) {
    bool everyone = true;
    for (int s = 0; s < count; ++s) everyone = everyone && all[3 * s] >= 0;
    old = static_cast<int>(everyone ? std::max<int64_t>(all[2], count) : all[2]);
  }
  std::vector<int64_t> steps(static_cast<size_t>(old));
  for (int o = 0; o < old; ++o) steps[o] = o < count ? all[3 * o] : newestOf(dir, o, keep);
  const auto [lo, hi] = std::minmax_element(steps.begin(), steps.end());
  if (*lo < 0) noCheckpoint(lo - steps.begin(), hi - steps.begin(), *hi);
  const int64_t step = *lo;

  // Old server o's file of `step`, its seal and "#servers" line checked.
  std::string reference;  // the settings and keys of the first file read
  auto readOld = [&](int o) {
    const std::string path = seriesOf(dir, o, keep).pathFor(step);
    std::string payload;
    try {
      if (o == 0 && id == 0 && step == own.back().first) {
        payload = std::move(newestPayload);
      } else {
        payload = readSealedFile(path);
      }
    } catch (const InvalidArgument& e) {
      SHOAL_THROW(InvalidArgument,
                  "parameter server {}: the checkpoint of step {} written by server {} of {} "
                  "cannot be restored: {}",
                  id, step, o, old, e.what());
    }
    const Header h = parseHeader(payload, path);
    if (h.servers != 0 && (h.servers != old || h.server != o)) {
      SHOAL_THROW(InvalidArgument,
                  "parameter server {}: {} was written by server {} of {}, but the checkpoint of "
                  "step {} is that of {} servers",
                  id, path, h.server, h.servers, step, old);
    }
    if (reference.empty()) {
      reference = h.configText + "\n" + h.keysText;
    } else if (reference != h.configText + "\n" + h.keysText) {
      SHOAL_THROW(InvalidArgument,
                  "parameter server {}: {} (server {}) holds other settings or keys than the "
                  "other servers' checkpoints of step {}",
                  id, path, o, step);
    }
    return std::make_pair(path, std::move(payload));
  };
  RestoredShard r;
  auto configure = [&](const std::string& payload, const std::string& path) {
    const Header h = parseHeader(payload, path);
    r.configText = h.configText;
    r.config = TrainingConfig::parse(r.configText);
    r.partition = std::make_unique<Partition>(Partition::parseKeys(h.keysText), count);
  };

  r.clocks.assign(static_cast<size_t>(workers), 0);
  if (old == count) {
    auto [path, payload] = readOld(id);
    configure(payload, path);
    Shard::checkSnapshotFits(*r.partition, id, r.config, payload.size(), path);
    r.shard = std::make_unique<Shard>(*r.partition, id, workers, r.config);
    r.shard->restore(payload, r.round, r.clocks, path);
    r.from = path;
    return r;
  }
  // The settings and keys come from the old server most likely to overlap this one.
  const int guess = static_cast<int>(std::min<int64_t>(old - 1, int64_t{id} * old / count));
  std::map<int, std::pair<std::string, std::string>> read;
  read.emplace(guess, readOld(guess));
  configure(read[guess].second, read[guess].first);
  const Partition before(r.partition->keys(), old);
  r.shard = std::make_unique<Shard>(*r.partition, id, workers, r.config);
  r.round = static_cast<uint64_t>(step);
  r.clocks.assign(static_cast<size_t>(workers), r.round);
  size_t copied = 0;
  for (int o = 0; o < old; ++o) {
    if (std::max(before.begin(o), r.partition->begin(id)) >=
        std::min(before.end(o), r.partition->end(id))) {
      continue;
    }
    if (!read.count(o)) read.emplace(o, readOld(o));
    const auto [path, payload] = std::move(read[o]);
    read.erase(o);
    Shard::checkSnapshotFits(before, o, r.config, payload.size(), path);
    Shard part(before, o, workers, r.config);
    uint64_t round = 0;
    part.restore(payload, round, r.clocks, path);
    if (round != r.round) {
      SHOAL_THROW(InvalidArgument, "parameter server {}: {} (server {}) holds step {}, not {}", id,
                  path, o, round, r.round);
    }
    copied += r.shard->copyOverlap(part);
  }
  SHOAL_CHECK(copied == r.shard->elements(), "parameter server {}: {} of {} elements restored", id,
              copied, r.shard->elements());
  r.from = fmt::format("the checkpoints of {} servers in {}, resharded", old, dir);
  return r;
}

RestoredShard restoreSnapshot(const std::string& payload, int server, int servers, int workers,
                              const std::string& source) {
  const Header h = parseHeader(payload, source);
  if (h.servers != servers || h.server != server) {
    SHOAL_THROW(InvalidArgument, "{} holds shard {} of {}, not shard {} of {}", source, h.server,
                h.servers, server, servers);
  }
  RestoredShard r;
  r.configText = h.configText;
  r.config = TrainingConfig::parse(r.configText);
  r.partition = std::make_unique<Partition>(Partition::parseKeys(h.keysText), servers);
  Shard::checkSnapshotFits(*r.partition, server, r.config, payload.size(), source);
  r.shard = std::make_unique<Shard>(*r.partition, server, workers, r.config);
  r.clocks.assign(static_cast<size_t>(workers), 0);
  r.shard->restore(payload, r.round, r.clocks, source);
  if (r.clocks.size() != static_cast<size_t>(workers)) {
    SHOAL_THROW(InvalidArgument, "{} holds the clocks of {} workers; the job has {}", source,
                r.clocks.size(), workers);
  }
  r.from = source;
  return r;
}

}  // namespace shoal::ps
