// The bytes of an elastic ZeRO commit (train/zero/elastic_part.h): a round trip, and crafted
// bytes refused with one line before anything is sized from them.
#include "train/zero/elastic_part.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "common/error.h"

namespace shoal::test {
namespace {

using train::ElasticProgress;
using train::FlatPiece;
using train::zero::decodeElasticPart;
using train::zero::encodeElasticPart;

std::string sample() {
  std::vector<FlatPiece> pieces;
  pieces.push_back({"param/0.weight", {4, 3}, 2, torch::arange(5, torch::kFloat)});
  pieces.push_back({"optim/momentum_buffer/0.weight",
                    {4, 3},
                    2,
                    torch::arange(5, torch::kFloat).to(torch::kBFloat16)});
  pieces.push_back({"buffer/bn.running_mean", {3}, 0, torch::ones({3}, torch::kDouble)});
  // An integer buffer (a FashionCnn's elastic ZeRO job failed on its first view change here).
  pieces.push_back({"buffer/bn.num_batches_tracked", {}, 0, torch::full({1}, 41, torch::kLong)});
  return encodeElasticPart(ElasticProgress{7, 1, 96}, 7, pieces);
}

// The error's text, or "" when it was accepted.
std::string refusal(const std::string& bytes) {
  try {
    decodeElasticPart(bytes, "shard from rank 1");
    return "";
  } catch (const InvalidArgument& e) {
    return e.what();
  }
}

// Overwrites the 8 bytes at `at` with `v`.
std::string patched(std::string bytes, size_t at, int64_t v) {
  std::memcpy(bytes.data() + at, &v, sizeof v);
  return bytes;
}

TEST(ElasticPart, RoundTripsEveryPieceAndTheProgress) {
  const auto part = decodeElasticPart(sample(), "sample");
  EXPECT_EQ(part.progress.step, 7);
  EXPECT_EQ(part.progress.epoch, 1);
  EXPECT_EQ(part.progress.position, 96);
  EXPECT_EQ(part.optimizerStep, 7);
  ASSERT_EQ(part.pieces.size(), 4u);
  EXPECT_EQ(part.pieces[1].name, "optim/momentum_buffer/0.weight");
  EXPECT_EQ(part.pieces[1].shape, (std::vector<int64_t>{4, 3}));
  EXPECT_EQ(part.pieces[1].offset, 2);
  EXPECT_EQ(part.pieces[1].data.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::equal(part.pieces[0].data, torch::arange(5, torch::kFloat)));
  EXPECT_TRUE(torch::equal(part.pieces[2].data, torch::ones({3}, torch::kDouble)));
  EXPECT_TRUE(torch::equal(part.pieces[3].data, torch::full({1}, 41, torch::kLong)));
}

TEST(ElasticPart, EveryTruncationAndTrailingBytesAreRefused) {
  const std::string bytes = sample();
  for (size_t n = 0; n < bytes.size(); ++n) {
    EXPECT_NE(refusal(bytes.substr(0, n)), "") << "accepted " << n << " of " << bytes.size();
  }
  EXPECT_NE(refusal(bytes + "x").find("1 bytes after the end"), std::string::npos);
  std::string other = bytes;
  other[0] = 'X';
  EXPECT_NE(refusal(other).find("not a Shoal elastic shard"), std::string::npos);
}

// Offsets into sample(): magic 8, four i64 (to 40), the count (to 48), then the first piece:
// name length 8 + 14 bytes (to 70), dimensions 4 (to 74), two sizes (to 90), offset (to 98),
// dtype 4 (to 102), elements (to 110).
TEST(ElasticPart, CraftedSizesAreRefusedBeforeAnythingIsSized) {
  const std::string bytes = sample();
  EXPECT_NE(refusal(patched(bytes, 40, int64_t{1} << 60)).find("pieces"), std::string::npos);
  EXPECT_NE(refusal(patched(bytes, 48, int64_t{1} << 60)).find("truncated"), std::string::npos);
  std::string dims = bytes;
  const int32_t many = 17;
  std::memcpy(dims.data() + 70, &many, sizeof many);
  EXPECT_NE(refusal(dims).find("17 dimensions"), std::string::npos);
  EXPECT_NE(refusal(patched(bytes, 74, -4)).find("negative"), std::string::npos);
  // 2^40 x 2^40 elements overflow a 64-bit count.
  EXPECT_NE(refusal(patched(patched(bytes, 74, int64_t{1} << 40), 82, int64_t{1} << 40))
                .find("over 2^62"),
            std::string::npos);
  EXPECT_NE(refusal(patched(bytes, 90, 8)).find("outside"), std::string::npos);
  EXPECT_NE(refusal(patched(bytes, 90, -1)).find("outside"), std::string::npos);
  std::string type = bytes;
  for (const int32_t crafted : {static_cast<int32_t>(torch::kBool), 1000}) {
    std::memcpy(type.data() + 98, &crafted, sizeof crafted);
    EXPECT_NE(refusal(type).find("element type"), std::string::npos) << crafted;
  }
  // More elements than bytes left (and than the shape holds).
  EXPECT_NE(refusal(patched(bytes, 102, int64_t{1} << 58)).find("outside"), std::string::npos);
  EXPECT_NE(refusal(patched(patched(bytes, 74, int64_t{1} << 59), 102, int64_t{1} << 58))
                .find("truncated"),
            std::string::npos);
}

}  // namespace
}  // namespace shoal::test
