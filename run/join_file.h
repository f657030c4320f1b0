// A running elastic job's join file: what a worker started by hand needs to join it.
//
//   shoal run --elastic 2:4 -n 2 --join-file /shared/job.join -- prog args     # the job
//   shoal join /shared/job.join -- prog args                                  # one more worker
//
// `shoal run` writes the file once its store is up and removes it when the job ends. It holds
// the job's store address, its secret, the elastic range, the launch's size, the timeout and the
// job's -x variables: so it is written owner-only (0600), and read only when nobody else can
// read it (as ssh treats private keys). The joiner arrives at the next view like any worker the
// launcher starts (comm/membership.h), and gets the running state from a peer; the launcher
// does not supervise it (it is not counted for the job's exit status, and not stopped or
// restarted by it).
//
// Member ids: the launcher gives out ids below kFirstOutsideMember; a joiner takes its id from
// the job's store (SHOAL_ELASTIC_MEMBER=auto), counting from there, so no two workers of the job
// ever share one.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace shoal::run {

using Variables = std::vector<std::pair<std::string, std::string>>;

constexpr int kFirstOutsideMember = 1 << 20;

// Writes `vars` (names [A-Z_][A-Z0-9_]*, values without line breaks) to `path` through a
// temporary owner-only file renamed over it. InvalidArgument for a bad name or value (a bug);
// SystemError naming the file when it cannot be written.
void writeJoinFile(const std::string& path, const Variables& vars);

// Reads a join file: at most 64 KiB, owner-only, the header line, then NAME=VALUE lines, with
// SHOAL_STORE_ADDR, SHOAL_SECRET, SHOAL_ELASTIC and SHOAL_WORLD_SIZE. InvalidArgument, one line
// naming the file (and the line), otherwise.
Variables readJoinFile(const std::string& path);

// The environment a joiner adds to its own: the file's variables, then its slot: SHOAL_RANK =
// SHOAL_WORLD_SIZE (a slot past the launch: its rank comes from the view it joins), local rank 0
// of 1, SHOAL_ROLE=worker and SHOAL_ELASTIC_MEMBER=auto.
Variables joinerVariables(const Variables& file);

// `shoal join FILE -- PROGRAM ARGS`: replaces this process with PROGRAM (looked up on PATH) in
// the joiner's environment; returns only by throwing (InvalidArgument for a bad file, an empty
// command or a program that cannot be started).
[[noreturn]] void execJoiner(const std::string& path, const std::vector<std::string>& command);

}  // namespace shoal::run
