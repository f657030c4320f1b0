// A flight recorder: the last operations of one rank, in a file that outlives the process
// (README "Flight recorder").
//
// What: every operation a group runs in issue order (collectives, splits, and point-to-point
// where the engine has no channels) is noted when it starts and again when it ends: the
// group's label, the sequence number, the operation, its bytes, its state (running, completed,
// failed), start and end on the wall clock, and for a failure the error's first line. A ring
// of `capacity` entries: the oldest is overwritten, so the newest (those around a failure) are
// kept.
//
// Why a file: the entries live in a shared mapping of the file, so what the rank noted is in
// the page cache, and so in the file, however the process ends: an exception, a timeout, a
// launcher's SIGKILL or the OOM killer. Nothing has to run at the moment of the failure.
// run/flight_report.h reads every rank's file and says who was where (`shoal flight DIR`).
//
// File format: a FlightHeader, then `capacity` FlightEntry slots, in this machine's byte order
// and layout (read back on the same architecture; the version field, read in another byte
// order, does not match). Entry ids count from 1; entry `id` lives in slot (id - 1) % capacity;
// a slot whose id is 0 was never used. The header's closedNs is set when the recorder is
// destroyed: 0 means the process died (or still runs).
//
// How it is passed: by std::shared_ptr in comm::GroupOptions::flight; no process-wide recorder.
//
// Threading: begin() and end() are thread-safe (one short mutex) and never throw: noting an
// operation never fails it. Blocking: no system call after construction (the page cache does
// the writing).
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace shoal {

inline constexpr size_t kMaxFlightEvents = size_t{1} << 20;
inline constexpr uint32_t kFlightVersion = 1;

enum class FlightState : uint32_t { kRunning = 1, kCompleted = 2, kFailed = 3 };
std::string_view toString(FlightState state);

struct FlightHeader {
  char magic[8];        // "SHOALFR1"
  uint32_t version;     // kFlightVersion
  uint32_t entryBytes;  // sizeof(FlightEntry)
  uint64_t capacity;    // slots after the header
  uint64_t begun;       // entries begun so far: the newest entry's id
  int32_t rank;         // the launch rank (SHOAL_RANK) of the process
  int32_t pid;
  int64_t openedNs;  // wall clock (CLOCK_REALTIME), nanoseconds
  int64_t closedNs;  // 0 until the recorder was destroyed
  char host[64];     // NUL-terminated
  char reserved[136];
};
static_assert(sizeof(FlightHeader) == 256);

struct FlightEntry {
  uint64_t id;  // 0: never used
  uint64_t seq;
  uint64_t bytes;
  uint64_t generation;
  int64_t startNs;  // wall clock
  int64_t endNs;    // 0 while running
  uint32_t state;   // FlightState
  int32_t groupRank;
  int32_t groupSize;
  int32_t peer;      // point-to-point's peer, else -1
  char group[64];    // NUL-terminated, like the two below
  char op[24];       // "all_reduce", "barrier", "send", ...
  char detail[104];  // the algorithm at start; the error's first line after a failure
};
static_assert(sizeof(FlightEntry) == 256);

// What begin() notes about an operation. Texts longer than their field are shortened; views
// must stay valid until begin() returns.
struct FlightOp {
  std::string_view group;
  std::string op;  // short: inside std::string, no allocation
  uint64_t seq = 0;
  uint64_t bytes = 0;
  uint64_t generation = 0;
  int groupRank = 0;
  int groupSize = 1;
  int peer = -1;
  std::string_view detail;
};

class FlightRecorder {
 public:
  // Creates (or truncates) `path`, sized for `capacity` entries, and maps it. InvalidArgument
  // if capacity is outside [1, kMaxFlightEvents]; SystemError naming the path if the file
  // cannot be made or mapped.
  FlightRecorder(const std::string& path, size_t capacity, int rank, std::string_view host);
  // Marks the file closed (a clean end) and unmaps it.
  ~FlightRecorder();
  FlightRecorder(const FlightRecorder&) = delete;
  FlightRecorder& operator=(const FlightRecorder&) = delete;

  // Notes that `op` started; returns its entry id for end().
  uint64_t begin(const FlightOp& op) noexcept;
  // Notes that entry `id` ended; `error` (its first line) marks it failed. Nothing if the entry
  // was overwritten meanwhile.
  void end(uint64_t id, std::string_view error = {}) noexcept;

  const std::string& path() const { return path_; }
  size_t capacity() const { return capacity_; }

 private:
  std::string path_;
  size_t capacity_;
  size_t mappedBytes_ = 0;
  void* mapping_ = nullptr;
  FlightHeader* header_ = nullptr;
  FlightEntry* entries_ = nullptr;
  std::mutex mutex_;
};

// "flight.rank<R>": the file each rank's recorder has in the folder.
std::string flightFileName(int rank);

// One entry as read back, texts copied out.
struct FlightRecord {
  uint64_t id = 0;
  uint64_t seq = 0;
  uint64_t bytes = 0;
  uint64_t generation = 0;
  int64_t startNs = 0;
  int64_t endNs = 0;
  FlightState state = FlightState::kRunning;
  int groupRank = 0;
  int groupSize = 1;
  int peer = -1;
  std::string group;
  std::string op;
  std::string detail;
};

struct FlightFile {
  std::string path;
  int rank = 0;
  int pid = 0;
  std::string host;
  int64_t openedNs = 0;
  int64_t closedNs = 0;  // 0: the process did not end cleanly (or still runs)
  uint64_t capacity = 0;
  uint64_t begun = 0;  // entries noted in all; those beyond capacity were overwritten
  std::vector<FlightRecord> entries;  // oldest first
  uint64_t torn = 0;  // slots skipped as half-written (a process killed while noting them)
};

// Reads one recorder's file. The file is untrusted (a crash, a truncation, another program's
// file): it must be a regular file whose size is exactly a header and `capacity` entries of
// this version, capacity at most kMaxFlightEvents; anything else is an InvalidArgument, one
// line naming the file and what is wrong. A slot that is not self-consistent (its id in the
// wrong slot or beyond `begun`, a text without its NUL, an unknown state) is skipped and
// counted as torn.
FlightFile readFlightFile(const std::string& path);

}  // namespace shoal
