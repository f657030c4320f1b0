#include "comm/native/diagnostics.h"

#include <condition_variable>
#include <mutex>
#include <thread>

namespace shoal::comm {

namespace {

struct Outcome {
  std::mutex mutex;
  std::condition_variable done;
  bool finished = false;
  bool ok = false;
};

}  // namespace

bool BoundedStore::run(Duration budget, std::function<void(store::Store&)> call) const {
  auto outcome = std::make_shared<Outcome>();
  try {
    std::thread([store = store_, outcome, call = std::move(call)] {
      bool ok = false;
      try {
        call(*store);
        ok = true;
      } catch (...) {
        // Diagnostics only: an unreachable store means there is nothing to add.
      }
      std::lock_guard<std::mutex> lock(outcome->mutex);
      outcome->finished = true;
      outcome->ok = ok;
      outcome->done.notify_all();
    }).detach();
  } catch (...) {
    return false;  // no thread to spare: skip the diagnostics
  }
  std::unique_lock<std::mutex> lock(outcome->mutex);
  outcome->done.wait_for(lock, budget, [&] { return outcome->finished; });
  return outcome->finished && outcome->ok;
}

bool BoundedStore::set(Duration budget, const std::string& key, const std::string& value) const {
  return run(budget, [key, value](store::Store& s) { s.set(key, value); });
}

std::optional<std::string> BoundedStore::lookup(Duration budget, const std::string& key) const {
  auto value = std::make_shared<std::optional<std::string>>();
  bool ok = run(budget, [key, value](store::Store& s) {
    if (s.check({key})) *value = s.get(key, std::chrono::milliseconds(100));
  });
  // Read only when the call finished: a late helper thread still owns `value`.
  if (!ok) return std::nullopt;
  return *value;
}

}  // namespace shoal::comm
