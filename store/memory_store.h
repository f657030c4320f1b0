// In-process store for ranks that are threads of one process (tests, single-process jobs).
#pragma once

#include <condition_variable>
#include <map>
#include <mutex>

#include "store/store.h"

namespace shoal::store {

class MemoryStore : public Store {
 public:
  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, Duration timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::string compareSet(const std::string& key, const std::string& expected,
                         const std::string& desired) override;
  void wait(const std::vector<std::string>& keys, Duration timeout) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;

 private:
  bool hasAllLocked(const std::vector<std::string>& keys) const;

  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, std::string> data_;
};

// Integer values are stored as decimal text in every store, so `add` and `get` interoperate.
int64_t parseCounter(const std::string& key, const std::string& value);

}  // namespace shoal::store
