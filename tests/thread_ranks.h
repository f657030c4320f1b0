// Ranks as threads of the test process over an in-memory store: the fast way to run a real
// group (real sockets and shared memory, one address space).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/group.h"
#include "store/memory_store.h"

namespace shoal::test {

inline comm::GroupOptions testOptions(TransportKind transport, double timeoutSeconds = 120) {
  comm::GroupOptions o;
  o.transport = transport;
  o.timeout = seconds(timeoutSeconds);
  o.secret = "thread-test-secret";
  return o;
}

// Runs body(group) on n threads, each its own rank. Returns each rank's error text ("" = ok).
std::vector<std::string> runThreadRanks(int n, const comm::GroupOptions& options,
                                        const std::function<void(comm::Group&)>& body,
                                        std::shared_ptr<store::Store> store = nullptr);
// The same with each rank's own options (e.g. GroupOptions::hostLabel: emulated hosts).
std::vector<std::string> runThreadRanks(
    int n, const std::function<comm::GroupOptions(int rank)>& optionsOf,
    const std::function<void(comm::Group&)>& body, std::shared_ptr<store::Store> store = nullptr);

}  // namespace shoal::test
