#include "common/sealed_file.h"

#include <fcntl.h>
#include <openssl/sha.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/error.h"

namespace shoal {

namespace fs = std::filesystem;

namespace {

constexpr char kMagic[8] = {'S', 'H', 'O', 'A', 'L', 'C', 'K', '1'};
constexpr size_t kFraming = 8 + 8 + SHA256_DIGEST_LENGTH;

void writeAll(int fd, const std::string& path, const char* data, size_t n) {
  size_t done = 0;
  while (done < n) {
    ssize_t w = ::write(fd, data + done, n - done);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) throwSystemError("write " + path, errno);
    done += static_cast<size_t>(w);
  }
}

}  // namespace

void writeSealedFile(const std::string& path, std::string_view payload) {
  const uint64_t len = payload.size();
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(payload.data()), payload.size(), digest);
  // Its own temporary per writer: several processes may write the same state to one path (the
  // survivors of an elastic job do), and each rename must bring a whole file.
  static std::atomic<uint64_t> writes{0};
  const std::string tmp = fmt::format("{}.tmp.{}.{}", path, ::getpid(), writes.fetch_add(1));
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throwSystemError("open " + tmp, errno);
  try {
    writeAll(fd, tmp, kMagic, 8);
    writeAll(fd, tmp, reinterpret_cast<const char*>(&len), 8);
    writeAll(fd, tmp, payload.data(), payload.size());
    writeAll(fd, tmp, reinterpret_cast<const char*>(digest), SHA256_DIGEST_LENGTH);
    if (::fsync(fd) != 0) throwSystemError("fsync " + tmp, errno);
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) throwSystemError("rename " + tmp, errno);
  // The rename itself is durable only once the folder is.
  int dfd = ::open(fs::path(path).parent_path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

bool looksSealed(std::string_view head) {
  const size_t n = std::min(head.size(), sizeof(kMagic));
  return n > 0 && std::memcmp(head.data(), kMagic, n) == 0;
}

std::string readSealedFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    SHOAL_THROW(InvalidArgument, "checkpoint {}: cannot be read ({})", path, std::strerror(errno));
  }
  // Only a regular file has a size to check lengths against: a FIFO or /dev/zero passed as a
  // checkpoint would otherwise be read without end.
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    SHOAL_THROW(InvalidArgument, "checkpoint {}: not a regular file", path);
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  unsigned char head[16];
  auto readExactly = [&](void* into, size_t n, uint64_t at) {
    size_t done = 0;
    while (done < n) {
      ssize_t r =
          ::pread(fd, static_cast<char*>(into) + done, n - done, static_cast<off_t>(at + done));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) {
        const int err = r < 0 ? errno : 0;
        ::close(fd);
        SHOAL_THROW(InvalidArgument, "checkpoint {}: read failed after {} bytes ({})", path,
                    at + done, err ? std::strerror(err) : "the file shrank while being read");
      }
      done += static_cast<size_t>(r);
    }
  };
  if (size < kFraming) {
    ::close(fd);
    SHOAL_THROW(InvalidArgument, "checkpoint {}: not a Shoal checkpoint ({} bytes, bad header)",
                path, size);
  }
  readExactly(head, sizeof(head), 0);
  if (std::memcmp(head, kMagic, 8) != 0) {
    ::close(fd);
    SHOAL_THROW(InvalidArgument, "checkpoint {}: not a Shoal checkpoint ({} bytes, bad header)",
                path, size);
  }
  // The length is checked against the file's real size before it sizes anything.
  uint64_t len = 0;
  std::memcpy(&len, head + 8, 8);
  if (len != size - kFraming) {
    ::close(fd);
    SHOAL_THROW(InvalidArgument,
                "checkpoint {}: truncated or padded: header says {} bytes of "
                "payload, the file holds {}",
                path, len, size - kFraming);
  }
  std::string payload(len, '\0');
  unsigned char stored[SHA256_DIGEST_LENGTH];
  readExactly(payload.data(), len, 16);
  readExactly(stored, sizeof(stored), 16 + len);
  ::close(fd);
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(payload.data()), len, digest);
  if (std::memcmp(digest, stored, SHA256_DIGEST_LENGTH) != 0) {
    SHOAL_THROW(InvalidArgument, "checkpoint {}: checksum mismatch (the file is corrupt)", path);
  }
  return payload;
}

SealedSeries::SealedSeries(std::string dir, std::string stem, std::string suffix, int keep)
    : dir_(std::move(dir)), stem_(std::move(stem)), suffix_(std::move(suffix)), keep_(keep) {
  SHOAL_CHECK(keep >= 1, "checkpoints to keep: {} must be at least 1", keep);
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) SHOAL_THROW(InvalidArgument, "checkpoint folder {}: {}", dir_, ec.message());
}

std::string SealedSeries::pathFor(int64_t number) const {
  return fmt::format("{}/{}{:08d}{}", dir_, stem_, number, suffix_);
}

std::string SealedSeries::write(int64_t number, std::string_view payload) {
  const std::string path = pathFor(number);
  writeSealedFile(path, payload);
  auto existing = list();
  for (size_t i = 0; i + static_cast<size_t>(keep_) < existing.size(); ++i) {
    fs::remove(existing[i].second);
  }
  return path;
}

std::vector<std::pair<int64_t, std::string>> SealedSeries::list() const {
  std::vector<std::pair<int64_t, std::string>> found;
  for (auto& e : fs::directory_iterator(dir_)) {
    const std::string name = e.path().filename().string();
    if (name.size() <= stem_.size() + suffix_.size() || name.rfind(stem_, 0) != 0 ||
        name.compare(name.size() - suffix_.size(), suffix_.size(), suffix_) != 0) {
      continue;
    }
    const std::string digits =
        name.substr(stem_.size(), name.size() - stem_.size() - suffix_.size());
    if (digits.empty() || !std::all_of(digits.begin(), digits.end(), ::isdigit)) continue;
    found.emplace_back(std::stoll(digits), e.path().string());
  }
  std::sort(found.begin(), found.end());
  return found;
}

std::optional<std::string> SealedSeries::latest() const {
  auto all = list();
  if (all.empty()) return std::nullopt;
  try {
    readSealedFile(all.back().second);
  } catch (const InvalidArgument& e) {
    std::string offer = "no older checkpoint is intact";
    for (size_t i = all.size() - 1; i-- > 0;) {
      try {
        readSealedFile(all[i].second);
        offer = "the newest intact one is " + all[i].second + " (resume from it explicitly)";
        break;
      } catch (const InvalidArgument&) {
      }
    }
    SHOAL_THROW(InvalidArgument, "{}; {}", e.what(), offer);
  }
  return all.back().second;
}

}  // namespace shoal
