#include "common/flight_recorder.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>

#include "common/error.h"
#include "common/socket.h"
#include "common/wall_clock.h"

namespace shoal {

namespace {

constexpr char kMagic[8] = {'S', 'H', 'O', 'A', 'L', 'F', 'R', '1'};

// Copies `text` into a fixed field, shortened to leave room for the NUL. What follows the NUL
// is left as it was: readers stop there, and clearing it would double the cost of noting.
template <size_t N>
void putText(char (&field)[N], std::string_view text) {
  const size_t n = std::min(text.size(), N - 1);
  // An empty view may have no data at all: memcpy from null is undefined even for 0 bytes.
  if (n > 0) std::memcpy(field, text.data(), n);
  field[n] = '\0';
}

// Copies the field's text into `out`; false if it holds no NUL (a torn or foreign slot).
template <size_t N>
bool getText(const char (&field)[N], std::string& out) {
  const void* nul = std::memchr(field, 0, N);
  if (nul == nullptr) return false;
  out.assign(field, static_cast<const char*>(nul) - field);
  return true;
}

}  // namespace

std::string_view toString(FlightState state) {
  switch (state) {
    case FlightState::kRunning:
      return "running";
    case FlightState::kCompleted:
      return "completed";
    case FlightState::kFailed:
      return "failed";
  }
  return "unknown";
}

std::string flightFileName(int rank) {
  return "flight.rank" + std::to_string(rank);
}

FlightRecorder::FlightRecorder(const std::string& path, size_t capacity, int rank,
                               std::string_view host)
    : path_(path), capacity_(capacity) {
  if (capacity < 1 || capacity > kMaxFlightEvents) {
    SHOAL_THROW(InvalidArgument, "flight recorder: {} entries is outside [1, {}]", capacity,
                kMaxFlightEvents);
  }
  mappedBytes_ = sizeof(FlightHeader) + capacity * sizeof(FlightEntry);
  // O_TRUNC first: a file left by an earlier attempt is emptied, not overlaid.
  Fd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (fd.get() < 0) throwSystemError("flight recorder: cannot create " + path, errno);
  // Space is reserved now, so a full disk fails here and not as SIGBUS in the middle of an
  // operation.
  if (const int err = ::posix_fallocate(fd.get(), 0, static_cast<off_t>(mappedBytes_)); err != 0) {
    throwSystemError("flight recorder: cannot size " + path, err);
  }
  mapping_ = ::mmap(nullptr, mappedBytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (mapping_ == MAP_FAILED) {
    mapping_ = nullptr;
    throwSystemError("flight recorder: cannot map " + path, errno);
  }
  header_ = static_cast<FlightHeader*>(mapping_);
  entries_ = reinterpret_cast<FlightEntry*>(static_cast<char*>(mapping_) + sizeof(FlightHeader));
  // The file is all zeros (fallocate): empty slots read as id 0. The magic goes last, so a
  // reader never takes a half-written header for a valid one.
  header_->version = kFlightVersion;
  header_->entryBytes = sizeof(FlightEntry);
  header_->capacity = capacity;
  header_->rank = rank;
  header_->pid = static_cast<int32_t>(::getpid());
  header_->openedNs = wallClockNs();
  putText(header_->host, host);
  std::memcpy(header_->magic, kMagic, sizeof(kMagic));
}

FlightRecorder::~FlightRecorder() {
  if (mapping_ == nullptr) return;
  {
    std::lock_guard lock(mutex_);
    header_->closedNs = wallClockNs();
  }
  ::munmap(mapping_, mappedBytes_);
}

uint64_t FlightRecorder::begin(const FlightOp& op) noexcept {
  const int64_t now = wallClockNs();
  std::lock_guard lock(mutex_);
  const uint64_t id = header_->begun + 1;
  FlightEntry& e = entries_[(id - 1) % capacity_];
  // id 0 while the slot is rewritten: a process killed in between leaves an empty slot, not
  // a mix of two entries under the newer id.
  e.id = 0;
  e.seq = op.seq;
  e.bytes = op.bytes;
  e.generation = op.generation;
  e.startNs = now;
  e.endNs = 0;
  e.state = static_cast<uint32_t>(FlightState::kRunning);
  e.groupRank = op.groupRank;
  e.groupSize = op.groupSize;
  e.peer = op.peer;
  putText(e.group, op.group);
  putText(e.op, op.op);
  putText(e.detail, op.detail);
  e.id = id;
  header_->begun = id;
  return id;
}

void FlightRecorder::end(uint64_t id, std::string_view error) noexcept {
  const int64_t now = wallClockNs();
  std::lock_guard lock(mutex_);
  if (id == 0 || id > header_->begun || header_->begun - id >= capacity_) return;
  FlightEntry& e = entries_[(id - 1) % capacity_];
  if (e.id != id) return;
  e.endNs = now;
  if (!error.empty()) putText(e.detail, error);
  e.state = static_cast<uint32_t>(error.empty() ? FlightState::kCompleted : FlightState::kFailed);
}

FlightFile readFlightFile(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) {
    SHOAL_THROW(InvalidArgument, "flight recorder file {}: cannot open: {}", path,
                std::strerror(errno));
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
    SHOAL_THROW(InvalidArgument, "flight recorder file {}: not a regular file", path);
  }
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size < sizeof(FlightHeader)) {
    SHOAL_THROW(InvalidArgument, "flight recorder file {}: {} bytes, shorter than its header", path,
                size);
  }
  FlightHeader h{};
  if (::pread(fd.get(), &h, sizeof(h), 0) != static_cast<ssize_t>(sizeof(h))) {
    SHOAL_THROW(InvalidArgument, "flight recorder file {}: cannot read its header", path);
  }
  if (std::memcmp(h.magic, kMagic, sizeof(kMagic)) != 0) {
    SHOAL_THROW(InvalidArgument, "flight recorder file {}: not a flight recorder file", path);
  }
  if (h.version != kFlightVersion || h.entryBytes != sizeof(FlightEntry)) {
    SHOAL_THROW(InvalidArgument,
                "flight recorder file {}: version {} with {}-byte entries; this build reads "
                "version {} with {}-byte entries",
                path, h.version, h.entryBytes, kFlightVersion, sizeof(FlightEntry));
  }
  if (h.capacity < 1 || h.capacity > kMaxFlightEvents) {
    SHOAL_THROW(InvalidArgument, "flight recorder file {}: capacity {} is outside [1, {}]", path,
                h.capacity, kMaxFlightEvents);
  }
  const uint64_t expected = sizeof(FlightHeader) + h.capacity * sizeof(FlightEntry);
  if (size != expected) {
    SHOAL_THROW(InvalidArgument,
                "flight recorder file {}: {} bytes, but a capacity of {} needs {} (truncated?)",
                path, size, h.capacity, expected);
  }
  FlightFile f;
  f.path = path;
  f.rank = h.rank;
  f.pid = h.pid;
  if (!getText(h.host, f.host)) f.host.assign(1, '?');
  f.openedNs = h.openedNs;
  f.closedNs = h.closedNs;
  f.capacity = h.capacity;
  f.begun = h.begun;
  std::vector<FlightEntry> slots(h.capacity);
  const size_t slotBytes = slots.size() * sizeof(FlightEntry);
  if (::pread(fd.get(), slots.data(), slotBytes, sizeof(FlightHeader)) !=
      static_cast<ssize_t>(slotBytes)) {
    SHOAL_THROW(InvalidArgument, "flight recorder file {}: cannot read its entries", path);
  }
  for (size_t i = 0; i < slots.size(); ++i) {
    const FlightEntry& e = slots[i];
    if (e.id == 0) continue;
    FlightRecord r;
    const bool consistent = e.id <= h.begun && (e.id - 1) % h.capacity == i &&
                            e.state >= static_cast<uint32_t>(FlightState::kRunning) &&
                            e.state <= static_cast<uint32_t>(FlightState::kFailed) &&
                            getText(e.group, r.group) && getText(e.op, r.op) &&
                            getText(e.detail, r.detail);
    if (!consistent) {
      ++f.torn;
      continue;
    }
    r.id = e.id;
    r.seq = e.seq;
    r.bytes = e.bytes;
    r.generation = e.generation;
    r.startNs = e.startNs;
    r.endNs = e.endNs;
    r.state = static_cast<FlightState>(e.state);
    r.groupRank = e.groupRank;
    r.groupSize = e.groupSize;
    r.peer = e.peer;
    f.entries.push_back(std::move(r));
  }
  std::sort(f.entries.begin(), f.entries.end(),
            [](const FlightRecord& a, const FlightRecord& b) { return a.id < b.id; });
  return f;
}

}  // namespace shoal
