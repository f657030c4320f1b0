#include "store/file_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "common/error.h"
#include "common/socket.h"
#include "store/memory_store.h"

namespace shoal::store {

namespace {

// Holds the directory's lock file for the scope of one read-modify-write.
class DirLock {
 public:
  explicit DirLock(const std::string& dir)
      : fd_(::open((dir + "/.lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600)) {
    if (!fd_.valid()) throwSystemError("file store: open lock in " + dir, errno);
    while (::flock(fd_.get(), LOCK_EX) < 0) {
      if (errno != EINTR) throwSystemError("file store: flock in " + dir, errno);
    }
  }
  ~DirLock() { ::flock(fd_.get(), LOCK_UN); }

 private:
  Fd fd_;
};

}  // namespace

FileStore::FileStore(std::string directory) : dir_(std::move(directory)) {
  if (::mkdir(dir_.c_str(), 0700) < 0 && errno != EEXIST) {
    int err = errno;
    SHOAL_THROW(StoreError, "file store: cannot create directory {}: {}", dir_, std::strerror(err));
  }
}

std::string FileStore::pathOf(const std::string& key) const {
  static const char* kHex = "0123456789abcdef";
  std::string name = "k";
  for (unsigned char c : key) {
    name += kHex[c >> 4];
    name += kHex[c & 15];
  }
  return dir_ + "/" + name;
}

std::optional<std::string> FileStore::read(const std::string& key) const {
  std::ifstream in(pathOf(key), std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void FileStore::write(const std::string& key, const std::string& value) {
  static std::atomic<uint64_t> counter{0};
  std::string tmp = fmt::format("{}/.tmp.{}.{}", dir_, ::getpid(), counter.fetch_add(1));
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(value.data(), static_cast<std::streamsize>(value.size()));
    if (!out) SHOAL_THROW(StoreError, "file store: cannot write {}", tmp);
  }
  if (::rename(tmp.c_str(), pathOf(key).c_str()) < 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    SHOAL_THROW(StoreError, "file store: rename into {} failed: {}", dir_, std::strerror(err));
  }
}

void FileStore::set(const std::string& key, const std::string& value) {
  write(key, value);
}

std::string FileStore::get(const std::string& key, Duration timeout) {
  wait({key}, timeout);
  auto v = read(key);
  if (!v) SHOAL_THROW(StoreError, "file store: key '{}' vanished while being read", key);
  return *v;
}

int64_t FileStore::add(const std::string& key, int64_t delta) {
  DirLock lock(dir_);
  int64_t v = parseCounter(key, read(key).value_or("")) + delta;
  write(key, std::to_string(v));
  return v;
}

std::string FileStore::compareSet(const std::string& key, const std::string& expected,
                                  const std::string& desired) {
  DirLock lock(dir_);
  std::string current = read(key).value_or("");
  if (current != expected) return current;
  write(key, desired);
  return desired;
}

bool FileStore::check(const std::vector<std::string>& keys) {
  for (const auto& k : keys) {
    if (::access(pathOf(k).c_str(), F_OK) != 0) return false;
  }
  return true;
}

void FileStore::wait(const std::vector<std::string>& keys, Duration timeout) {
  Deadline deadline(timeout);
  auto pause = std::chrono::milliseconds(1);
  while (!check(keys)) {
    if (deadline.expired()) {
      SHOAL_THROW(TimeoutError, "file store {}: keys [{}] did not appear within {:.1f} s", dir_,
                  joinKeys(keys), deadline.timeoutSeconds());
    }
    std::this_thread::sleep_for(std::min<Duration>(pause, deadline.remaining()));
    pause = std::min(pause * 2, std::chrono::milliseconds(20));
  }
}

bool FileStore::deleteKey(const std::string& key) {
  return ::unlink(pathOf(key).c_str()) == 0;
}

}  // namespace shoal::store
