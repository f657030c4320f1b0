// A libtorch archive's directory is checked against the file before libtorch reads it: a real
// archive passes (and loads), and each way of claiming more than the file holds is one line.
#include "train/archive_bounds.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cctype>
#include <cstring>
#include <sstream>
#include <string>

#include "common/error.h"

namespace shoal::test {
namespace {

std::string realArchive() {
  torch::serialize::OutputArchive archive;
  archive.write("w", torch::arange(1000, torch::kFloat32));
  archive.write("b", torch::ones({7}, torch::kFloat64));
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

// Offset of the first central directory entry (found by its signature).
size_t firstEntry(const std::string& s) {
  const char sig[4] = {0x50, 0x4b, 0x01, 0x02};
  size_t at = s.find(std::string(sig, 4));
  EXPECT_NE(at, std::string::npos);
  return at;
}

void put32(std::string& s, size_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) s[at + i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

std::string refusal(const std::string& archive) {
  try {
    train::checkArchiveBounds(archive);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(ArchiveBounds, ARealArchivePassesAndLoads) {
  const std::string a = realArchive();
  EXPECT_NO_THROW(train::checkArchiveBounds(a));
  torch::serialize::InputArchive in;
  std::istringstream is(a);
  in.load_from(is);
  torch::Tensor w;
  in.read("w", w);
  EXPECT_TRUE(torch::equal(w, torch::arange(1000, torch::kFloat32)));
}

TEST(ArchiveBounds, AnEntryClaimingMoreThanItHoldsIsRefused) {
  std::string a = realArchive();
  put32(a, firstEntry(a) + 24, 3338010633u);  // the size libtorch once allocated for a fuzz input
  const std::string why = refusal(a);
  EXPECT_NE(why.find("claims 3338010633 bytes"), std::string::npos) << why;
  EXPECT_EQ(why.find('\n'), std::string::npos) << why;
}

TEST(ArchiveBounds, DataPastTheDirectoryIsRefused) {
  std::string a = realArchive();
  const size_t e = firstEntry(a);
  put32(a, e + 20, 0x7fffffffu);  // compressed size
  put32(a, e + 24, 0x7fffffffu);
  EXPECT_NE(refusal(a).find("past the data"), std::string::npos) << refusal(a);
}

TEST(ArchiveBounds, AHeaderOffsetOutsideTheFileIsRefused) {
  std::string a = realArchive();
  put32(a, firstEntry(a) + 42, 0x10000000u);
  EXPECT_NE(refusal(a).find("has no header"), std::string::npos) << refusal(a);
}

// Note [Pickle lengths] in train/archive_bounds.cpp: a string in the pickle claiming 2.8 GB.
TEST(ArchiveBounds, APickleStringLongerThanItsRecordIsRefused) {
  std::string a = realArchive();
  const size_t pkl = a.find("data.pkl");  // the first occurrence names the local header
  ASSERT_NE(pkl, std::string::npos);
  // The first BINUNICODE ('X', 4-byte length, that many printable bytes) after it.
  size_t at = std::string::npos;
  for (size_t i = pkl; i + 5 < a.size() && at == std::string::npos; ++i) {
    if (a[i] != 'X') continue;
    const uint32_t len = static_cast<uint8_t>(a[i + 1]) | (static_cast<uint8_t>(a[i + 2]) << 8);
    if (len == 0 || len > 64 || a[i + 3] != 0 || a[i + 4] != 0 || i + 5 + len > a.size()) continue;
    bool printable = true;
    for (size_t k = 0; k < len; ++k)
      printable &= std::isprint(static_cast<uint8_t>(a[i + 5 + k])) != 0;
    if (printable) at = i;
  }
  ASSERT_NE(at, std::string::npos) << "no BINUNICODE in data.pkl";
  put32(a, at + 1, 2824732682u);
  const std::string why = refusal(a);
  EXPECT_NE(why.find("data.pkl claims 2824732682 bytes"), std::string::npos) << why;
}

TEST(ArchiveBounds, TruncatedOrForeignBytesAreRefused) {
  const std::string a = realArchive();
  EXPECT_NE(refusal(a.substr(0, a.size() - 10)), "");
  EXPECT_NE(refusal(a.substr(0, 10)), "");
  EXPECT_NE(refusal(std::string(4096, 'x')), "");
  EXPECT_NE(refusal(""), "");
}

}  // namespace
}  // namespace shoal::test
