#include "store/prefix_store.h"

#include "common/error.h"

namespace shoal::store {

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> inner)
    : prefix_(std::move(prefix)), inner_(std::move(inner)) {
  SHOAL_CHECK(inner_ != nullptr, "PrefixStore needs a store");
  SHOAL_CHECK(!prefix_.empty(), "PrefixStore needs a non-empty prefix");
}

std::vector<std::string> PrefixStore::scoped(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const auto& k : keys) out.push_back(scoped(k));
  return out;
}

void PrefixStore::set(const std::string& key, const std::string& value) {
  inner_->set(scoped(key), value);
}
std::string PrefixStore::get(const std::string& key, Duration timeout) {
  return inner_->get(scoped(key), timeout);
}
int64_t PrefixStore::add(const std::string& key, int64_t delta) {
  return inner_->add(scoped(key), delta);
}
std::string PrefixStore::compareSet(const std::string& key, const std::string& expected,
                                    const std::string& desired) {
  return inner_->compareSet(scoped(key), expected, desired);
}
void PrefixStore::wait(const std::vector<std::string>& keys, Duration timeout) {
  inner_->wait(scoped(keys), timeout);
}
bool PrefixStore::deleteKey(const std::string& key) {
  return inner_->deleteKey(scoped(key));
}
bool PrefixStore::check(const std::vector<std::string>& keys) {
  return inner_->check(scoped(keys));
}

}  // namespace shoal::store
