// Store calls made only to explain a failure or a slow operation, each within a small fixed
// budget.
//
// Why: the store may be hosted by a rank that is itself stopped or dead. A timeout report that
// waits on such a store for its own (long) bound would make every survivor overrun its deadline
// (Note [Bounded diagnostics]). So each call here runs on a short-lived helper thread and the
// caller waits at most `budget`; a call that does not finish in time goes on in the background
// (it owns what it uses) and its result is dropped.
//
// Threading: thread-safe. Never throws: a failed or late call reports false / nothing.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "common/deadline.h"
#include "store/store.h"

namespace shoal::comm {

class BoundedStore {
 public:
  explicit BoundedStore(std::shared_ptr<store::Store> store) : store_(std::move(store)) {}

  // Runs `call` against the store; true if it returned within `budget` without throwing.
  bool run(Duration budget, std::function<void(store::Store&)> call) const;

  // set(); true if it was stored within the budget.
  bool set(Duration budget, const std::string& key, const std::string& value) const;
  // The value of `key` if it exists and the store answered within the budget.
  std::optional<std::string> lookup(Duration budget, const std::string& key) const;

 private:
  std::shared_ptr<store::Store> store_;
};

}  // namespace shoal::comm
