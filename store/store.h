// Rendezvous key-value store: how ranks find each other before any connection exists.
//
// Contract for every implementation:
// - All calls are thread-safe and may be called from any thread.
// - Values are byte strings. Keys are non-empty strings.
// - Calls that wait (get, wait) take a timeout and throw TimeoutError naming the missing keys
//   when it passes; a store that cannot be reached throws StoreError naming its address.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/deadline.h"

namespace shoal::store {

class Store {
 public:
  virtual ~Store() = default;

  virtual void set(const std::string& key, const std::string& value) = 0;

  // Blocks until `key` exists, then returns its value.
  virtual std::string get(const std::string& key, Duration timeout) = 0;

  // Atomically adds `delta` to the integer stored at `key` (absent counts as 0); returns the sum.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;

  // Atomically: if the current value equals `expected` (an absent key equals ""), store
  // `desired`. Returns the value stored after the call, whether it changed or not.
  virtual std::string compareSet(const std::string& key, const std::string& expected,
                                 const std::string& desired) = 0;

  // Blocks until every key exists.
  virtual void wait(const std::vector<std::string>& keys, Duration timeout) = 0;

  // Returns whether the key existed.
  virtual bool deleteKey(const std::string& key) = 0;

  // Non-blocking: do all keys exist?
  virtual bool check(const std::vector<std::string>& keys) = 0;
};

// Formats "a, b, c" for error messages about missing keys.
std::string joinKeys(const std::vector<std::string>& keys);

}  // namespace shoal::store
