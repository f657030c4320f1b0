// A byte-level text corpus for small GPT-style language models: Debian's fortune files as one
// stream of bytes, each byte a token (vocabulary 256, no tokenizer).
//
//   train::ByteCorpus corpus;                        // /usr/share/games/fortunes
//   auto b = corpus.batch(32, 128, step, train::ByteCorpus::Split::kTrain);   // [32, 129]
//   auto inputs = b.slice(1, 0, -1), targets = b.slice(1, 1);
//   std::cout << train::ByteCorpus::decode(generated);
//
// The files: the regular files of `directory` without an extension, in name order (fortune's
// text files; its indexes .dat and its .u8 copies are skipped, and so are symbolic links, which
// would repeat a file, hidden files and subdirectories). An entry is the text between lines that
// hold only "%", its lines each ending in '\n'; entries of nothing but white space are dropped.
// Note [Byte stream]: a split's stream is its entries in file order joined by "\n", so an empty
// line separates two entries.
//
// The split is by entry, deterministic: entry i (numbered from 0 over all files in order) is in
// the validation split if i % validationEvery == validationEvery - 1 (every 10th by default),
// else in the training split. No entry is in both.
//
// Threading: constructed once (reads every file; throws then); every method after that is const
// and safe to call from any number of threads. Nothing here communicates.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

namespace shoal::train {

struct ByteCorpusOptions {
  std::string directory = "/usr/share/games/fortunes";
  // Mixed into every batch's window positions: runs with other seeds see other windows.
  uint64_t seed = 0;
  int validationEvery = 10;  // at least 2
};

class ByteCorpus {
 public:
  enum class Split { kTrain, kValidation };
  static constexpr int64_t kVocabSize = 256;

  // Reads the corpus. InvalidArgument: "byte corpus: <dir>: no such directory; install
  // Debian's fortunes package" (also when it is not a directory), no text file or no entry in
  // it, validationEvery below 2. SystemError if a file cannot be read.
  explicit ByteCorpus(ByteCorpusOptions options = {});

  int64_t vocabSize() const { return kVocabSize; }
  const ByteCorpusOptions& options() const { return options_; }
  // The files read, full paths, in the order read.
  const std::vector<std::string>& files() const { return files_; }
  // A split's byte stream (Note [Byte stream]) and its number of entries.
  const std::string& text(Split split) const;
  int64_t entries(Split split) const;

  // `batchSize` windows of seqLen + 1 consecutive bytes of the split's stream, as int64
  // [batchSize, seqLen + 1] (CPU): inputs are [:, :-1], targets [:, 1:]. Row r starts at a
  // position drawn from (seed, split, step, r) alone: the same on every rank and every run (so
  // every rank of a grid sees the same global batch), uniform over the stream, independent of
  // batchSize. InvalidArgument if batchSize or seqLen is below 1, or seqLen >= the split's
  // length in bytes (no window fits).
  torch::Tensor batch(int64_t batchSize, int64_t seqLen, uint64_t step, Split split) const;

  // The bytes of an integer tensor of tokens (any shape, read in row-major order), e.g. for
  // printing generated text. InvalidArgument if not an integer tensor or a value is outside
  // [0, 256).
  static std::string decode(const torch::Tensor& tokens);

  static const char* name(Split split);

 private:
  ByteCorpusOptions options_;
  std::vector<std::string> files_;
  std::string text_[2];
  int64_t entries_[2] = {0, 0};
};

}  // namespace shoal::train
