#include "tests/thread_ranks.h"

#include <thread>

namespace shoal::test {

std::vector<std::string> runThreadRanks(int n, const comm::GroupOptions& options,
                                        const std::function<void(comm::Group&)>& body,
                                        std::shared_ptr<store::Store> store) {
  return runThreadRanks(
      n, [&](int) { return options; }, body, std::move(store));
}

std::vector<std::string> runThreadRanks(
    int n, const std::function<comm::GroupOptions(int rank)>& optionsOf,
    const std::function<void(comm::Group&)>& body, std::shared_ptr<store::Store> store) {
  if (!store) store = std::make_shared<store::MemoryStore>();
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto g = comm::Group::create(store, r, n, optionsOf(r));
        body(*g);
      } catch (const std::exception& e) {
        errors[r] = e.what();
        if (errors[r].empty()) errors[r] = "exception without a message";
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

}  // namespace shoal::test
