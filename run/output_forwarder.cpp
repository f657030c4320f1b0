#include "run/output_forwarder.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>

namespace shoal::run {

namespace {
// A whole line in one write(2), so lines of different ranks never interleave mid-line.
void writeLine(int fd, const std::string& s) {
  size_t done = 0;
  while (done < s.size()) {
    ssize_t w = ::write(fd, s.data() + done, s.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;  // the terminal or pipe went away: the job still runs to its end
    done += static_cast<size_t>(w);
  }
}
}  // namespace

OutputForwarder::OutputForwarder(int rank, int outFd, std::FILE* log, std::deque<std::string>* tail)
    : rank_(rank), outFd_(outFd), log_(log), tail_(tail) {}

void OutputForwarder::feed(const char* data, size_t n) {
  partial_.append(data, n);
  size_t start = 0;
  for (size_t nl; (nl = partial_.find('\n', start)) != std::string::npos; start = nl + 1) {
    emit(partial_.substr(start, nl - start));
  }
  partial_.erase(0, start);
  // A rank that prints megabytes without a newline still gets forwarded, in pieces.
  if (partial_.size() > (64u << 10)) {
    emit(partial_);
    partial_.clear();
  }
}

void OutputForwarder::finish() {
  if (!partial_.empty()) emit(partial_);
  partial_.clear();
}

void OutputForwarder::emit(const std::string& line) {
  writeLine(outFd_, fmt::format("[{}] {}\n", rank_, line));
  if (log_) {
    std::fwrite(line.data(), 1, line.size(), log_);
    std::fputc('\n', log_);
    std::fflush(log_);
  }
  tail_->push_back(line);
  if (tail_->size() > kTailLines) tail_->pop_front();
}

}  // namespace shoal::run
