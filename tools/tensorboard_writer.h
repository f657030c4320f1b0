// TensorBoard event files written without TensorFlow (Debian ships no TensorBoard to link):
// scalars only, which is all a run's metrics store (track/metrics_store.h) holds.
//
// File format: a TFRecord file, each record
//   uint64 length (little endian) | uint32 masked CRC-32C of those 8 bytes |
//   data (length bytes)           | uint32 masked CRC-32C of data
// where masked(c) = ((c >> 15) | (c << 17)) + 0xa282ead8 (common/crc32c.h). Each record's data
// is one tensorflow.Event protobuf (tensorflow/core/util/event.proto, summary.proto), encoded
// here by hand with only the fields TensorBoard's scalar dashboard reads:
//   Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
//   Summary { repeated Value value = 1; }
//   Value   { string tag = 1; float simple_value = 2; }
// The first record is the file_version event "brain.Event:2"; every other is one scalar. The
// file is named events.out.tfevents.<seconds>.<host>, as TensorFlow's writer names it:
// TensorBoard reads files with "tfevents" in their name, oldest name first.
//
// Threading: an EventFileWriter is used by one thread at a time; the free functions are pure
// and thread-safe. Blocking: file system only.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace shoal::tools {

inline constexpr std::string_view kEventFileVersion = "brain.Event:2";

// CRC-32C of `bytes`, masked as TFRecord stores it (a CRC of data holding CRCs is weak).
uint32_t maskedCrc32c(std::string_view bytes);

// `data` framed as one TFRecord record.
std::string tfRecord(std::string_view data);

// The Event protobuf that opens a file.
std::string fileVersionEvent(double wallTime);
// The Event protobuf of one scalar. `tag` must be valid UTF-8 (proto3 strings; a reader drops
// an event that is not): see utf8Tag.
std::string scalarEvent(double wallTime, int64_t step, std::string_view tag, float value);

// `name` with every byte that is not part of a well-formed UTF-8 sequence made '?'.
std::string utf8Tag(std::string_view name);

// "events.out.tfevents.<seconds, 10 digits at least>.<host>", with any '/' in host made '_'.
std::string eventFileName(int64_t seconds, std::string_view host);

// One event file, written whole or not at all: records go to a hidden temporary in `dir`
// (".shoal-tensorboard.<pid>.tmp", a name TensorBoard ignores), which finish() renames to
// dir/eventFileName(fileSeconds, host). Destroying the writer before finish() removes the
// temporary. SystemError naming the file for any failed open, write or rename.
class EventFileWriter {
 public:
  // Creates the temporary and writes the file_version record with `wallTime`. `dir` must exist.
  EventFileWriter(const std::string& dir, int64_t fileSeconds, std::string_view host,
                  double wallTime);
  ~EventFileWriter();
  EventFileWriter(const EventFileWriter&) = delete;
  EventFileWriter& operator=(const EventFileWriter&) = delete;

  // Appends one scalar event (tag made valid by utf8Tag).
  void addScalar(std::string_view tag, int64_t step, float value, double wallTime);
  // Flushes, closes and renames the file into place; returns its path. Call once.
  std::string finish();

  const std::string& path() const { return path_; }  // where finish() puts the file
  size_t records() const { return records_; }        // written so far, file_version included

 private:
  void write(std::string_view data);

  std::string path_;
  std::string temporary_;
  std::FILE* file_ = nullptr;
  size_t records_ = 0;
};

}  // namespace shoal::tools
