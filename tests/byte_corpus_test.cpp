// The byte-level text corpus (train/byte_corpus.h): which files and entries it reads, the
// streams and the split, deterministic windows, decode, and its errors; exact checks on a small
// corpus written here, and one on Debian's fortunes (installed by scripts/setup.sh).
#include "train/byte_corpus.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>

#include "common/error.h"
#include "tests/process_util.h"

namespace shoal::test {
namespace {

using train::ByteCorpus;
using Split = ByteCorpus::Split;

void write(const std::string& path, const std::string& content) {
  std::ofstream(path, std::ios::binary) << content;
}

// Six entries in two text files (an empty and a blank entry dropped, the last entry of "a"
// without a closing "%"), beside files and links the corpus must skip.
struct SmallCorpus {
  TempDir dir;
  SmallCorpus() {
    write(dir.path + "/a", "alpha\n%\nbeta\nline2\n%\n%\n  \n%\ngamma\n");
    write(dir.path + "/b", "delta\n%\nepsilon\n%\nzeta\n%\n");
    write(dir.path + "/a.dat", std::string("\x00\x01\x02%\n", 5));
    write(dir.path + "/b.u8", "delta\n%\n");
    write(dir.path + "/.hidden", "hidden\n%\n");
    std::filesystem::create_symlink(dir.path + "/a", dir.path + "/c");
    std::filesystem::create_directory(dir.path + "/d");
    write(dir.path + "/d/e", "nested\n%\n");
  }
  ByteCorpus corpus(uint64_t seed = 0) const {
    return ByteCorpus({.directory = dir.path, .seed = seed, .validationEvery = 3});
  }
};

// Entries 0..5 are alpha, beta, gamma, delta, epsilon, zeta; every 3rd (2 and 5) validates.
constexpr const char* kTrainText = "alpha\n\nbeta\nline2\n\ndelta\n\nepsilon\n";
constexpr const char* kValidationText = "gamma\n\nzeta\n";

TEST(ByteCorpus, ReadsTheTextFilesInNameOrderAndSplitsByEntry) {
  SmallCorpus s;
  ByteCorpus c = s.corpus();
  EXPECT_EQ(c.files(), (std::vector<std::string>{s.dir.path + "/a", s.dir.path + "/b"}));
  EXPECT_EQ(c.text(Split::kTrain), kTrainText);
  EXPECT_EQ(c.text(Split::kValidation), kValidationText);
  EXPECT_EQ(c.entries(Split::kTrain), 4);
  EXPECT_EQ(c.entries(Split::kValidation), 2);
  EXPECT_EQ(c.vocabSize(), 256);
}

// Every row is a window of the split's stream; targets are the inputs shifted by one.
void expectWindows(const ByteCorpus& c, const torch::Tensor& b, int64_t batchSize, int64_t seqLen,
                   Split split) {
  ASSERT_EQ(b.scalar_type(), torch::kLong);
  ASSERT_EQ(b.sizes(), (std::vector<int64_t>{batchSize, seqLen + 1}));
  EXPECT_GE(b.min().item<int64_t>(), 0);
  EXPECT_LT(b.max().item<int64_t>(), 256);
  auto inputs = b.slice(1, 0, -1), targets = b.slice(1, 1);
  EXPECT_TRUE(torch::equal(inputs.slice(1, 1), targets.slice(1, 0, -1)));
  for (int64_t r = 0; r < batchSize; ++r) {
    const std::string row = ByteCorpus::decode(b[r]);
    EXPECT_NE(c.text(split).find(row), std::string::npos) << row;
  }
}

TEST(ByteCorpus, BatchesAreDeterministicWindowsOfTheirSplit) {
  SmallCorpus s;
  ByteCorpus c = s.corpus(), again = s.corpus();
  auto b = c.batch(6, 5, 7, Split::kTrain);
  expectWindows(c, b, 6, 5, Split::kTrain);
  EXPECT_TRUE(torch::equal(b, c.batch(6, 5, 7, Split::kTrain)));
  EXPECT_TRUE(torch::equal(b, again.batch(6, 5, 7, Split::kTrain)));
  // A row depends on (seed, split, step, row) alone, not on the batch size.
  EXPECT_TRUE(torch::equal(b.slice(0, 0, 2), c.batch(2, 5, 7, Split::kTrain)));
  expectWindows(c, c.batch(4, 3, 7, Split::kValidation), 4, 3, Split::kValidation);
  // The longest window that fits is the whole stream, whatever the step.
  const int64_t n = static_cast<int64_t>(std::string(kValidationText).size());
  auto whole = c.batch(3, n - 1, 12345, Split::kValidation);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(ByteCorpus::decode(whole[r]), kValidationText);
}

TEST(ByteCorpus, ErrorsNameThePathAndTheSizes) {
  SmallCorpus s;
  ByteCorpus c = s.corpus();
  const int64_t n = static_cast<int64_t>(std::string(kValidationText).size());
  try {
    c.batch(1, n, 0, Split::kValidation);
    ADD_FAILURE() << "no throw";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()),
              fmt::format("byte corpus: sequence length {} needs windows of {} bytes, but the "
                          "validation split of {} has {} bytes (2 entries)",
                          n, n + 1, s.dir.path, n));
  }
  EXPECT_THROW(c.batch(0, 4, 0, Split::kTrain), InvalidArgument);
  EXPECT_THROW(c.batch(1, 0, 0, Split::kTrain), InvalidArgument);

  const std::string missing = s.dir.path + "/nope";
  try {
    (void)ByteCorpus({.directory = missing});
    ADD_FAILURE() << "no throw";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()),
              "byte corpus: " + missing + ": no such directory; install Debian's fortunes package");
  }
  // Only an index file: no text file.
  TempDir indexOnly;
  write(indexOnly.path + "/x.dat", "%\n");
  EXPECT_THROW(ByteCorpus({.directory = indexOnly.path}), InvalidArgument);
  // Text files with nothing but separators and blank lines: no entry.
  TempDir empty;
  write(empty.path + "/x", "%\n \n%\n\n");
  try {
    (void)ByteCorpus({.directory = empty.path});
    ADD_FAILURE() << "no throw";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(empty.path + ": no entries in 1 text file"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(ByteCorpus({.directory = s.dir.path, .validationEvery = 1}), InvalidArgument);
}

TEST(ByteCorpus, DecodeIsTheBytesOfIntegerTokens) {
  EXPECT_EQ(ByteCorpus::decode(torch::tensor({104, 105, 10}, torch::kLong)), "hi\n");
  EXPECT_EQ(ByteCorpus::decode(torch::tensor({255, 0}, torch::kInt)), std::string("\xff\0", 2));
  EXPECT_THROW(ByteCorpus::decode(torch::tensor({256}, torch::kLong)), InvalidArgument);
  EXPECT_THROW(ByteCorpus::decode(torch::tensor({-1}, torch::kLong)), InvalidArgument);
  EXPECT_THROW(ByteCorpus::decode(torch::tensor({1.0f})), InvalidArgument);
}

TEST(ByteCorpus, DebiansFortunes) {
  ByteCorpus c;  // /usr/share/games/fortunes, installed by scripts/setup.sh
  ASSERT_GE(c.files().size(), 10u);
  for (const auto& f : c.files()) {
    EXPECT_FALSE(std::filesystem::path(f).has_extension()) << f;
    EXPECT_FALSE(std::filesystem::is_symlink(f)) << f;
  }
  EXPECT_TRUE(std::is_sorted(c.files().begin(), c.files().end()));
  const int64_t all = c.entries(Split::kTrain) + c.entries(Split::kValidation);
  EXPECT_GT(all, 1000);
  EXPECT_EQ(c.entries(Split::kValidation), all / 10);
  EXPECT_GT(c.text(Split::kTrain).size(), 1000000u);
  EXPECT_GT(c.text(Split::kValidation).size(), 100000u);

  auto b = c.batch(8, 128, 3, Split::kTrain);
  expectWindows(c, b, 8, 128, Split::kTrain);
  EXPECT_TRUE(torch::equal(b, ByteCorpus().batch(8, 128, 3, Split::kTrain)));
  EXPECT_FALSE(torch::equal(b, c.batch(8, 128, 4, Split::kTrain)));
  ByteCorpus seeded({.seed = 1});
  EXPECT_FALSE(torch::equal(b, seeded.batch(8, 128, 3, Split::kTrain)));
  expectWindows(c, c.batch(8, 128, 3, Split::kValidation), 8, 128, Split::kValidation);
}

}  // namespace
}  // namespace shoal::test
