// Store in a directory on a filesystem every rank can see (a shared filesystem across hosts).
//
// One file per key (the key hex-encoded as its name), written to a temporary file and renamed so
// readers never see half a value. add and compareSet hold an flock on "<dir>/.lock". Waiting
// polls the directory with a growing pause (1 ms up to 20 ms): no spinning, no inotify (which
// does not see changes made on other NFS clients).
#pragma once

#include "store/store.h"

namespace shoal::store {

class FileStore : public Store {
 public:
  // Creates the directory if missing; throws StoreError if it cannot.
  explicit FileStore(std::string directory);

  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, Duration timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::string compareSet(const std::string& key, const std::string& expected,
                         const std::string& desired) override;
  void wait(const std::vector<std::string>& keys, Duration timeout) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;

 private:
  std::string pathOf(const std::string& key) const;
  std::optional<std::string> read(const std::string& key) const;
  void write(const std::string& key, const std::string& value);

  std::string dir_;
};

}  // namespace shoal::store
