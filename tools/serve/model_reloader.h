// The model shoal-serve answers with, and its reload when the file changes (--watch).
//
// Reload protocol: a background thread looks at the file's identity (device, inode, size,
// modification time) every `interval`. When it differs from the last one seen, the thread loads
// the file into a new ServedModel — off the request path, while requests keep using the old
// one — and, if that succeeds, swaps it in: requests that already hold the old model finish with
// it (shared ownership), later ones get the new. A file that fails to load (truncated, wrong
// shapes, not a model) is logged and counted, the old model stays, and the same identity is not
// retried. Writers should write a temporary file and rename it into place (shoal-export and
// torch::save + mv do); a file rewritten in place may be seen half-written, fail, and be
// retried once its identity changes again.
//
// Threading: current() is thread-safe and never blocks on a load (a mutex held only to copy a
// shared_ptr). start()/stop() from one controlling thread; stop() wakes the thread at once and
// joins it (a load in progress finishes first). The destructor stops.
#pragma once

#include <sys/stat.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "tools/serve/serve_metrics.h"
#include "train/export/served_model.h"

namespace shoal::serve {

struct ModelReloaderOptions {
  std::string modelName = "fashion_cnn";
  std::string path;
  std::chrono::milliseconds interval{500};  // how often the watcher looks at the file
};

class ModelReloader {
 public:
  // Loads the model now; throws what ServedModel::load throws. `metrics` must outlive this.
  ModelReloader(ModelReloaderOptions options, ServeMetrics& metrics);
  ~ModelReloader();
  ModelReloader(const ModelReloader&) = delete;
  ModelReloader& operator=(const ModelReloader&) = delete;

  std::shared_ptr<const ServedModel> current() const;

  // Starts watching the file (idempotent).
  void start();
  void stop();

  // One look at the file: loads and swaps if its identity changed. Returns true if a new model
  // was swapped in. Never throws (failures are logged and counted).
  bool checkOnce();

 private:
  struct Identity {
    dev_t dev = 0;
    ino_t ino = 0;
    off_t size = -1;
    int64_t mtimeNs = 0;
    bool operator==(const Identity&) const = default;
  };
  static Identity identityOf(const std::string& path);
  void loop();

  const ModelReloaderOptions options_;
  ServeMetrics& metrics_;
  mutable std::mutex mutex_;  // guards model_, stopping_
  std::shared_ptr<const ServedModel> model_;
  Identity seen_;  // only the watcher thread (or checkOnce's caller) touches it
  uint64_t nextVersion_ = 2;
  bool stopping_ = false;
  std::condition_variable wake_;
  std::thread thread_;
};

}  // namespace shoal::serve
