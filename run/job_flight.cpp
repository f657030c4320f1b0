#include "run/job_flight.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "common/error.h"
#include "run/flight_report.h"
#include "run/hosts.h"

namespace shoal::run {

namespace {

bool allLocal(const LaunchOptions& o) {
  if (!o.hostDiscoveryScript.empty()) return false;
  for (const auto& h : o.hosts) {
    if (!isLocalHost(h.host)) return false;
  }
  return true;
}

void say(const std::string& text) {
  [[maybe_unused]] ssize_t w = ::write(2, text.data(), text.size());
}

}  // namespace

JobFlight::JobFlight(const LaunchOptions& o) : events_(o.flightEvents) {
  if (o.flightEvents == 0) return;
  if (!o.flightDir.empty()) {
    dir_ = std::filesystem::absolute(o.flightDir).string();
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
    if (ec) SHOAL_THROW(InvalidArgument, "--flight-dir '{}': {}", o.flightDir, ec.message());
    return;
  }
  if (!allLocal(o)) return;
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = fmt::format("{}/shoal-flight.XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (::mkdtemp(pattern.data()) == nullptr) {
    SHOAL_THROW(InvalidArgument, "flight recorder: cannot make a folder like {}: {}", pattern,
                std::strerror(errno));
  }
  dir_ = pattern;
  temporary_ = true;
}

JobFlight::~JobFlight() {
  if (!temporary_ || keep_) return;
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

std::vector<std::pair<std::string, std::string>> JobFlight::variables() const {
  std::vector<std::pair<std::string, std::string>> v;
  if (!enabled()) return v;
  v.emplace_back("SHOAL_FLIGHT_DIR", dir_);
  if (events_ > 0) v.emplace_back("SHOAL_FLIGHT_EVENTS", std::to_string(events_));
  return v;
}

void JobFlight::prepare() const {
  if (!enabled()) return;
  std::error_code ec;
  for (const auto& file : flightFiles(dir_)) std::filesystem::remove(file, ec);
}

void JobFlight::report(int ranks) {
  // A program that never called shoal::init(), or failed before its first operation, left
  // nothing to say.
  if (!enabled() || flightFiles(dir_).empty()) return;
  std::string text;
  try {
    const FlightDiagnosis d = diagnoseFlightDir(dir_, ranks);
    if (std::all_of(d.files.begin(), d.files.end(), [](auto& f) { return f.begun == 0; })) return;
    text = describe(d);
  } catch (const std::exception& e) {
    text = fmt::format("{}\n", e.what());
  }
  keep_ = true;
  say(fmt::format("shoal run: flight recorder ({}; `shoal flight {}` shows it again):\n{}", dir_,
                  dir_, text));
}

}  // namespace shoal::run
