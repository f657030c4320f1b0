// Scopes every key under "prefix/" so that groups (and jobs) sharing one store never collide.
// Holds a shared reference to the underlying store; thread-safety is the underlying store's.
#pragma once

#include "store/store.h"

namespace shoal::store {

class PrefixStore : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> inner);

  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, Duration timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::string compareSet(const std::string& key, const std::string& expected,
                         const std::string& desired) override;
  void wait(const std::vector<std::string>& keys, Duration timeout) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;

  const std::shared_ptr<Store>& inner() const { return inner_; }
  const std::string& prefix() const { return prefix_; }

 private:
  std::string scoped(const std::string& key) const { return prefix_ + "/" + key; }
  std::vector<std::string> scoped(const std::vector<std::string>& keys) const;

  std::string prefix_;
  std::shared_ptr<Store> inner_;
};

}  // namespace shoal::store
