// Helpers for starting programs: finding them, quoting for sh, inheriting the environment, and
// describing how they ended. Shared by the launcher (run/launcher.h) and LocalJob.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace shoal::run {

// 'text' for POSIX sh, with embedded quotes escaped.
std::string shellQuote(const std::string& s);

// Whitespace-separated words (for a command given as one string, e.g. --ssh).
std::vector<std::string> splitWords(const std::string& s);

// The program as this machine finds it: a path with a slash as given (made absolute), else the
// first match on PATH. Empty if not found or not executable.
std::string findProgram(const std::string& name);

// This process's environment ("NAME=value" entries) without the variables named in `drop`.
std::vector<std::string> environmentWithout(const std::vector<std::string>& drop);

// "exited with code N" / "killed by signal N (Name)" for a waitpid status.
std::string describeStatus(int status);

// describeStatus for a rank the launcher started; a remote rank's status is ssh's, which passes on
// the remote shell's (128 + N for signal N), so that is said too: "exited with code 137 (on its
// host: killed by signal 9 (Killed))".
std::string describeRankStatus(int status, bool local);

// The shell's convention: the exit code, or 128 + the signal.
int exitCodeOf(int status);

// A POSIX sh script for the remote side of ssh: it reads SHOAL_SECRET from its stdin (never on
// a command line, where `ps` would show it), runs `command` in `cwd` with `assignments`
// ("NAME=value", set through env), and kills it (SIGTERM, SIGKILL after `graceSeconds`) when
// its stdin closes, which happens when the launcher stops the rank or the connection dies.
// Exits with the program's status.
std::string remoteRankScript(const std::string& cwd, const std::vector<std::string>& assignments,
                             const std::vector<std::string>& command, double graceSeconds);

}  // namespace shoal::run
