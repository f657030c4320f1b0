// tools/serve/model_reloader.h.
#include "tools/serve/model_reloader.h"

#include "common/error.h"
#include "common/log.h"

namespace shoal::serve {

ModelReloader::ModelReloader(ModelReloaderOptions options, ServeMetrics& metrics)
    : options_(std::move(options)), metrics_(metrics) {
  // The identity first: a file replaced while loading is then seen as changed at the next look.
  seen_ = identityOf(options_.path);
  model_ = ServedModel::load(options_.modelName, options_.path, 1);
}

ModelReloader::~ModelReloader() {
  stop();
}

std::shared_ptr<const ServedModel> ModelReloader::current() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return model_;
}

ModelReloader::Identity ModelReloader::identityOf(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return {};
  return {st.st_dev, st.st_ino, st.st_size,
          static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec};
}

bool ModelReloader::checkOnce() {
  const Identity now = identityOf(options_.path);
  if (now == seen_ || now.size < 0) return false;  // unchanged, or missing mid-rename
  seen_ = now;
  try {
    auto fresh = ServedModel::load(options_.modelName, options_.path, nextVersion_);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      model_ = std::move(fresh);
    }
    SHOAL_LOG_INFO("shoal-serve: reloaded {} (model version {})", options_.path, nextVersion_);
    ++nextVersion_;
    metrics_.countReload(true);
    return true;
  } catch (const std::exception& e) {
    const std::string what = e.what();
    SHOAL_LOG_WARN("shoal-serve: keeping model version {}: the new {} does not load: {}",
                   current()->version(), options_.path, what.substr(0, what.find('\n')));
    metrics_.countReload(false);
    return false;
  }
}

void ModelReloader::start() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (thread_.joinable()) return;
  stopping_ = false;
  thread_ = std::thread([this] { loop(); });
}

void ModelReloader::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void ModelReloader::loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!wake_.wait_for(lock, options_.interval, [this] { return stopping_; })) {
    lock.unlock();
    checkOnce();  // never throws
    lock.lock();
  }
}

}  // namespace shoal::serve
