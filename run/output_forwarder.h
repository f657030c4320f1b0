// Forwards one stream of one rank line by line: each complete line goes to the launcher's
// stream with a "[rank] " prefix, to the rank's log file if there is one, and into a short tail
// kept for the failure summary. A last line without a newline is flushed at end of stream.
#pragma once

#include <cstdio>
#include <deque>
#include <string>

namespace shoal::run {

class OutputForwarder {
 public:
  // `outFd`: where prefixed lines go (1 or 2). `log` (may be null) is shared by a rank's two
  // streams and not owned. `tail` is shared by them too.
  OutputForwarder(int rank, int outFd, std::FILE* log, std::deque<std::string>* tail);

  void feed(const char* data, size_t n);
  void finish();  // end of stream

  static constexpr size_t kTailLines = 10;

 private:
  void emit(const std::string& line);

  int rank_;
  int outFd_;
  std::FILE* log_;
  std::deque<std::string>* tail_;
  std::string partial_;
};

}  // namespace shoal::run
