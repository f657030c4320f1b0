#include "store/memory_store.h"

#include "common/error.h"

namespace shoal::store {

int64_t parseCounter(const std::string& key, const std::string& value) {
  if (value.empty()) return 0;
  char* end = nullptr;
  long long v = std::strtoll(value.c_str(), &end, 10);
  if (*end != '\0') SHOAL_THROW(StoreError, "store key '{}' holds '{}', not a counter", key, value);
  return v;
}

void MemoryStore::set(const std::string& key, const std::string& value) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    data_[key] = value;
  }
  changed_.notify_all();
}

std::string MemoryStore::get(const std::string& key, Duration timeout) {
  wait({key}, timeout);
  std::lock_guard<std::mutex> lock(mutex_);
  return data_.at(key);
}

int64_t MemoryStore::add(const std::string& key, int64_t delta) {
  int64_t v;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = data_.find(key);
    v = (it == data_.end() ? 0 : parseCounter(key, it->second)) + delta;
    data_[key] = std::to_string(v);
  }
  changed_.notify_all();
  return v;
}

std::string MemoryStore::compareSet(const std::string& key, const std::string& expected,
                                    const std::string& desired) {
  std::string result;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = data_.find(key);
    std::string current = it == data_.end() ? std::string() : it->second;
    if (current == expected) {
      data_[key] = desired;
      result = desired;
    } else {
      result = current;
    }
  }
  changed_.notify_all();
  return result;
}

bool MemoryStore::hasAllLocked(const std::vector<std::string>& keys) const {
  for (const auto& k : keys) {
    if (data_.find(k) == data_.end()) return false;
  }
  return true;
}

void MemoryStore::wait(const std::vector<std::string>& keys, Duration timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!changed_.wait_for(lock, timeout, [&] { return hasAllLocked(keys); })) {
    SHOAL_THROW(TimeoutError, "memory store: keys [{}] did not appear within {:.1f} s",
                joinKeys(keys), std::chrono::duration<double>(timeout).count());
  }
}

bool MemoryStore::deleteKey(const std::string& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  return data_.erase(key) > 0;
}

bool MemoryStore::check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lock(mutex_);
  return hasAllLocked(keys);
}

}  // namespace shoal::store
