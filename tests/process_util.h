// Small helpers shared by the multi-process tests.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <set>
#include <string>

namespace shoal::test {

// A fresh directory under /tmp, removed with everything in it at scope exit.
struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/shoal-test-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

// What /dev/shm holds now: a test compares before and after to catch a leaked segment.
inline std::set<std::string> shmEntries() {
  std::set<std::string> out;
  for (auto& e : std::filesystem::directory_iterator("/dev/shm")) out.insert(e.path().string());
  return out;
}

}  // namespace shoal::test
