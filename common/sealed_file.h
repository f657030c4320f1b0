// Files that are never half-written and never read corrupt: the framing behind every Shoal
// checkpoint (data-parallel checkpoints in train/, parameter-server shards in ps/).
//
// Format: "SHOALCK1", u64 payload length (little endian), the payload, the SHA-256 of the
// payload. Written to <name>.tmp.<pid>.<n> (one per writer, so concurrent writers of one name
// never mix their bytes), fsync'ed, renamed over <name>, and the folder fsync'ed: a crash at any
// point leaves either the old file or the new one (and perhaps a stray temporary). Reading checks
// length and checksum before returning a byte; a truncated or corrupt file is an InvalidArgument
// naming the file and what is wrong.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace shoal {

void writeSealedFile(const std::string& path, std::string_view payload);
std::string readSealedFile(const std::string& path);

// Whether `head`, a file's first bytes (possibly fewer than the magic: a file cut short), starts
// as a sealed file does: for readers of several formats that must tell this one apart.
bool looksSealed(std::string_view head);

// A folder of numbered sealed files "<stem><number, 8 digits><suffix>", keeping the newest
// `keep`. Not thread-safe; one writer per folder and stem.
class SealedSeries {
 public:
  // Creates the folder if missing (InvalidArgument if it cannot).
  SealedSeries(std::string dir, std::string stem, std::string suffix, int keep);

  std::string pathFor(int64_t number) const;
  // Writes file `number` and removes all but the newest `keep`. Returns its path.
  std::string write(int64_t number, std::string_view payload);
  // The numbers and paths present, oldest first.
  std::vector<std::pair<int64_t, std::string>> list() const;
  // The newest file, or nothing. Throws InvalidArgument when the newest is truncated or corrupt,
  // naming it and offering the newest intact one: never falls back silently.
  std::optional<std::string> latest() const;
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  std::string stem_;
  std::string suffix_;
  int keep_;
};

}  // namespace shoal
