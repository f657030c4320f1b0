// A job secret generated for the ranks of one host that share nothing else before the store is
// up: Slurm tasks on one node started without SHOAL_SECRET (README "Security").
//
// Why: the store must authenticate its clients before it reads a request, so every rank needs
// the secret before it reaches the store. shoal run and mpirun hand it over themselves; srun
// starts the tasks with nothing but the environment the batch script exported. Ranks on one
// node do share a file system and a user, so the rank that hosts the store writes a fresh
// secret into a directory only that user can enter, and the others read it there.
//
// Where: DIR/<key>.secret, DIR being $XDG_RUNTIME_DIR/shoal when that is set, else
// /tmp/shoal-<uid>. The directory is created with mode 0700 if missing and refused (one line
// naming it) unless it is a real directory (not a link) owned by this user and closed to group
// and others; the file must be a regular file owned by this user with mode 0600, 64 hex digits.
// A file that fails those checks is never read: a reader waits for one that passes.
//
// Lifetime: the file exists from publishNodeSecret() until its NodeSecret is destroyed; the
// caller keeps it until every rank has joined the world (each rank reads the secret before it
// reaches the store, and the world is complete only once all have reached it).
//
// Threading: free functions, no shared state; safe from any thread.
#pragma once

#include <memory>
#include <string>

#include "common/deadline.h"

namespace shoal::run {

struct NodeSecret {
  std::string secret;  // 64 hex digits
  // Removes the file when the last copy goes.
  std::shared_ptr<void> file;
};

// "slurm-<SLURM_JOB_ID>.<SLURM_STEP_ID>": names one job step's secret. InvalidArgument if the
// job id is missing (the step id defaults to 0).
std::string slurmSecretKey(const std::string& jobId, const std::string& stepId);

// The private directory, created if missing (InvalidArgument naming it if it cannot be made or
// is not private). `base` empty: the default above; tests pass their own.
std::string nodeSecretDirectory(const std::string& base = {});

// Generates a secret and publishes it under `key` (replacing a stale file of the same key).
// InvalidArgument or SystemError (naming the path) if it cannot.
NodeSecret publishNodeSecret(const std::string& key, const std::string& base = {});

// Waits until the secret under `key` is published and returns it. Event-driven (inotify on the
// directory), at most `timeout`: TimeoutError naming the path and `rank` otherwise.
std::string awaitNodeSecret(const std::string& key, int rank, Duration timeout,
                            const std::string& base = {});

}  // namespace shoal::run
