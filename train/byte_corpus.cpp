#include "train/byte_corpus.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string_view>

#include "common/error.h"
#include "common/splitmix.h"

namespace shoal::train {
namespace {

namespace fs = std::filesystem;

std::string readAll(const std::string& path) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "rb"), std::fclose);
  if (f == nullptr) throwSystemError(fmt::format("byte corpus: open {}", path), errno);
  std::string out;
  char buf[1 << 16];
  while (size_t n = std::fread(buf, 1, sizeof(buf), f.get())) out.append(buf, n);
  if (std::ferror(f.get())) throwSystemError(fmt::format("byte corpus: read {}", path), errno);
  return out;
}

bool blank(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
  });
}

// The entries of one fortune file, in order (see the header for what an entry is).
template <typename Fn>
void forEachEntry(std::string_view content, Fn&& fn) {
  std::string entry;
  auto flush = [&] {
    if (!blank(entry)) fn(entry);
    entry.clear();
  };
  size_t at = 0;
  while (at < content.size()) {
    size_t end = content.find('\n', at);
    if (end == std::string_view::npos) end = content.size();
    std::string_view line = content.substr(at, end - at);
    if (line == "%") {
      flush();
    } else {
      entry.append(line);
      entry.push_back('\n');
    }
    at = end + 1;
  }
  flush();
}

}  // namespace

ByteCorpus::ByteCorpus(ByteCorpusOptions options) : options_(std::move(options)) {
  const std::string& dir = options_.directory;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    SHOAL_THROW(InvalidArgument,
                "byte corpus: {}: no such directory; install Debian's fortunes package", dir);
  }
  if (options_.validationEvery < 2) {
    SHOAL_THROW(InvalidArgument,
                "byte corpus: validationEvery {} (every n-th entry is for validation) must be at "
                "least 2",
                options_.validationEvery);
  }
  for (const auto& e : fs::directory_iterator(dir)) {
    const fs::path& p = e.path();
    const std::string name = p.filename().string();
    // symlink_status: a link is skipped even when it points at a regular file.
    if (!fs::is_regular_file(e.symlink_status()) || p.has_extension() || name.empty() ||
        name[0] == '.') {
      continue;
    }
    files_.push_back(p.string());
  }
  std::sort(files_.begin(), files_.end());
  if (files_.empty()) {
    SHOAL_THROW(InvalidArgument,
                "byte corpus: {}: no text file (fortune files have no extension; .dat and .u8 "
                "are skipped); install Debian's fortunes package",
                dir);
  }
  int64_t index = 0;
  for (const auto& file : files_) {
    forEachEntry(readAll(file), [&](const std::string& entry) {
      const int s = index % options_.validationEvery == options_.validationEvery - 1
                        ? static_cast<int>(Split::kValidation)
                        : static_cast<int>(Split::kTrain);
      if (entries_[s] > 0) text_[s].push_back('\n');
      text_[s].append(entry);
      ++entries_[s];
      ++index;
    });
  }
  if (index == 0) {
    SHOAL_THROW(InvalidArgument,
                "byte corpus: {}: no entries in {} text file{} (entries are separated by lines "
                "holding only \"%\")",
                dir, files_.size(), files_.size() == 1 ? "" : "s");
  }
}

const std::string& ByteCorpus::text(Split split) const {
  return text_[static_cast<int>(split)];
}

int64_t ByteCorpus::entries(Split split) const {
  return entries_[static_cast<int>(split)];
}

const char* ByteCorpus::name(Split split) {
  return split == Split::kTrain ? "training" : "validation";
}

torch::Tensor ByteCorpus::batch(int64_t batchSize, int64_t seqLen, uint64_t step,
                                Split split) const {
  const std::string& t = text(split);
  const int64_t length = static_cast<int64_t>(t.size());
  if (batchSize < 1 || seqLen < 1) {
    SHOAL_THROW(InvalidArgument,
                "byte corpus: batch size {} and sequence length {} must be at least 1", batchSize,
                seqLen);
  }
  if (seqLen >= length) {
    SHOAL_THROW(InvalidArgument,
                "byte corpus: sequence length {} needs windows of {} bytes, but the {} split of "
                "{} has {} bytes ({} entries)",
                seqLen, seqLen + 1, name(split), options_.directory, length, entries(split));
  }
  const auto starts = static_cast<uint64_t>(length - seqLen);  // windows that fit
  auto out = torch::empty({batchSize, seqLen + 1}, torch::kLong);
  auto a = out.accessor<int64_t, 2>();
  const uint64_t base =
      splitmix64(splitmix64(splitmix64(options_.seed) ^ static_cast<uint64_t>(split)) ^ step);
  for (int64_t r = 0; r < batchSize; ++r) {
    const uint64_t pos = splitmix64(base ^ static_cast<uint64_t>(r)) % starts;
    for (int64_t j = 0; j <= seqLen; ++j) {
      a[r][j] = static_cast<unsigned char>(t[pos + j]);
    }
  }
  return out;
}

std::string ByteCorpus::decode(const torch::Tensor& tokens) {
  if (!tokens.defined() || !c10::isIntegralType(tokens.scalar_type(), /*includeBool=*/false)) {
    SHOAL_THROW(InvalidArgument, "byte corpus: decode takes an integer tensor of tokens, not {}",
                tokens.defined() ? std::string(c10::toString(tokens.scalar_type())) : "undefined");
  }
  auto flat = tokens.to(torch::kCPU, torch::kLong).contiguous().view(-1);
  const int64_t* v = flat.data_ptr<int64_t>();
  std::string out(flat.numel(), '\0');
  for (int64_t i = 0; i < flat.numel(); ++i) {
    if (v[i] < 0 || v[i] >= kVocabSize) {
      SHOAL_THROW(InvalidArgument,
                  "byte corpus: token {} at flat index {} is not a byte (vocabulary {})", v[i], i,
                  kVocabSize);
    }
    out[i] = static_cast<char>(v[i]);
  }
  return out;
}

}  // namespace shoal::train
