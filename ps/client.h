// A worker's side of parameter-server training.
//
// Construction connects to every server (a two-rank group each, on shared memory or TCP) and
// sends the model's keys and the training settings; all workers must pass the same ones. On a
// fresh start worker 0 then calls initialize() with the initial values; on a resumed job
// startStep() says where training continues.
//
// Calls return a comm::Work handle: wait(timeout), test(), or onDone(callback). Buffers belong
// to the call until its Work finishes. Calls to one server run in issue order; different servers
// work in parallel. Timeouts: each exchange is bounded by the world group's timeout plus a
// margin (the servers bound their own waits by the timeout and say whom they waited for).
// Errors: InvalidArgument when a server refuses a request (the client stays usable);
// PeerError / TimeoutError naming the server otherwise (that server's connection is done).
//
// Threading: one thread issues calls at a time; Work callbacks run on internal threads.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "comm/group.h"
#include "comm/work.h"
#include "ps/config.h"
#include "ps/partition.h"

namespace shoal::ps {

class Client {
 public:
  Client(comm::Group& world, int worker, int numWorkers, int numServers, std::vector<KeySpec> keys,
         const TrainingConfig& config);
  // Says goodbye to the servers if finish() was not called (errors are swallowed here; call
  // finish() to see them).
  ~Client();

  const Partition& partition() const { return partition_; }
  int worker() const { return worker_; }
  // The step training starts at (0, or the step of the servers' checkpoint).
  int64_t startStep() const { return startStep_; }
  // True on worker 0 of a fresh job: it must call initialize() before anyone can pull.
  bool mustInitialize() const { return mustInitialize_; }
  // Blocking. `flat` holds every key's initial values end to end (partition order).
  void initialize(const float* flat);

  // Whole-model calls on flat buffers (every key end to end; gradients for parameter keys,
  // current values for state keys). pushPull pushes `step` and pulls the values for step + 1.
  std::shared_ptr<comm::Work> push(const float* flat, int64_t step);
  std::shared_ptr<comm::Work> pull(float* flat, int64_t step);
  std::shared_ptr<comm::Work> pushPull(const float* grads, float* values, int64_t step);

  // One key. The dtype and shape are the caller's: a server refuses ones that do not match the
  // key (InvalidArgument).
  std::shared_ptr<comm::Work> pushKey(const std::string& key, const void* data, DataType dtype,
                                      const std::vector<int64_t>& shape, int64_t step);
  std::shared_ptr<comm::Work> pullKey(const std::string& key, void* data, DataType dtype,
                                      const std::vector<int64_t>& shape, int64_t step);

  // Blocking goodbye to every server.
  void finish();

  // For each completed pull: how many steps this worker was ahead of the slowest worker when the
  // servers released it (the largest over the servers). SSP bounds it by the staleness.
  std::vector<int64_t> leads() const;

  // The connection to server s (diagnostics and protocol tests).
  comm::Group& link(int server) { return *links_.at(server); }

 private:
  std::shared_ptr<comm::Work> whole(int kind, const float* payload, float* into, int64_t step);
  std::shared_ptr<comm::Work> keyed(int kind, const std::string& key, const void* payload,
                                    void* into, DataType dtype, const std::vector<int64_t>& shape,
                                    int64_t step);

  comm::Group& world_;
  int worker_;
  int numServers_;
  Partition partition_;
  std::chrono::nanoseconds timeout_;
  std::vector<std::shared_ptr<comm::Group>> links_;
  int64_t startStep_ = 0;
  bool mustInitialize_ = false;
  bool finished_ = false;
  struct Leads;
  std::shared_ptr<Leads> leads_;
};

}  // namespace shoal::ps
