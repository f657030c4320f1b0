#include "run/rank_environment.h"

#include <fmt/format.h>

#include <filesystem>

#include "run/job_trace.h"
#include "run/process_util.h"

namespace shoal::run {

std::vector<std::string> namesOf(const Variables& vars, std::vector<std::string> more) {
  for (const auto& [k, _] : vars) more.push_back(k);
  return more;
}

Variables rankVariables(const LaunchOptions& o, const JobEnvironment& job, const Placement& where,
                        int rank, int member) {
  // The last `servers` launch slots serve. An elastic job has no servers (checked at start): its
  // slots past the launch size (discovery's growth) are workers too.
  const bool worker = rank < job.workers || o.elastic.has_value();
  Variables v = {
      {"SHOAL_RANK", std::to_string(rank)},
      {"SHOAL_WORLD_SIZE", std::to_string(job.worldSize)},
      {"SHOAL_LOCAL_RANK", std::to_string(where.localRank)},
      {"SHOAL_LOCAL_WORLD_SIZE", std::to_string(where.localSize)},
      {"SHOAL_NUM_HOSTS", std::to_string(job.numHosts)},
      {"SHOAL_STORE_ADDR", job.storeAddress},
      {"RANK", std::to_string(rank)},
      {"WORLD_SIZE", std::to_string(job.worldSize)},
      {"LOCAL_RANK", std::to_string(where.localRank)},
      {"LOCAL_WORLD_SIZE", std::to_string(where.localSize)},

      {"SHOAL_NUM_SERVERS", std::to_string(o.servers)},
      {"SHOAL_PS_REPLICAS", std::to_string(o.psReplicas)},
      {"SHOAL_ROLE", worker ? "worker" : "server"},
      {"SHOAL_ROLE_RANK", std::to_string(worker ? rank : rank - job.workers)},
      {"SHOAL_RESTART_COUNT", std::to_string(job.attempt)},
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(job.attempt)},
  };
  if (!job.storeHost.empty()) {
    v.emplace_back("MASTER_ADDR", job.storeHost);
    v.emplace_back("MASTER_PORT", job.storePort);
  }
  if (o.opTimeoutSeconds) v.emplace_back("SHOAL_TIMEOUT", fmt::format("{}", *o.opTimeoutSeconds));
  if (!o.tracePath.empty()) {
    v.emplace_back("SHOAL_TRACE", traceRanksDir(o.tracePath));
    if (o.traceEvents > 0) v.emplace_back("SHOAL_TRACE_EVENTS", std::to_string(o.traceEvents));
  }
  if (o.elastic) {
    v.emplace_back("SHOAL_ELASTIC", *o.elastic);
    v.emplace_back("SHOAL_ELASTIC_MEMBER", std::to_string(member));
  }
  for (const auto& kv : o.env) v.push_back(kv);
  return v;
}

Variables joinVariables(const LaunchOptions& o, const JobEnvironment& job) {
  Variables v = {
      {"SHOAL_WORLD_SIZE", std::to_string(job.worldSize)},
      {"SHOAL_NUM_HOSTS", std::to_string(job.numHosts)},
      {"SHOAL_STORE_ADDR", job.storeAddress},
      {"SHOAL_SECRET", job.secret},
      {"SHOAL_ELASTIC", o.elastic.value_or("")},
  };
  if (o.encrypt != EncryptMode::kAuto) {
    v.emplace_back("SHOAL_ENCRYPT", std::string(toString(o.encrypt)));
  }
  if (o.opTimeoutSeconds) v.emplace_back("SHOAL_TIMEOUT", fmt::format("{}", *o.opTimeoutSeconds));
  for (const auto& kv : o.env) v.push_back(kv);
  return v;
}

std::string remoteRankCommand(const LaunchOptions& o, const std::string& program,
                              const Variables& vars) {
  std::vector<std::string> assignments;
  for (auto& kv : environmentWithout(namesOf(vars, {"SHOAL_SECRET"}))) {
    if (kv.rfind("SHOAL_", 0) == 0) assignments.push_back(kv);
  }
  for (const auto& [k, v] : vars) assignments.push_back(k + "=" + v);
  std::vector<std::string> command = o.command;
  command[0] = program;
  return remoteRankScript(std::filesystem::current_path().string(), assignments, command,
                          o.graceSeconds);
}

}  // namespace shoal::run
