// The tensor bundle (train/tensor_bundle.h): what checkpoints and full states hold. Every dtype
// and shape comes back bitwise; anything cut, padded, relabelled or inflated is one
// InvalidArgument, and no crafted size allocates more than the input holds.
#include "train/tensor_bundle.h"

#include <gtest/gtest.h>

#include <cstring>

#include "common/error.h"

namespace {

using shoal::InvalidArgument;
using shoal::train::decodeTensorBundle;
using shoal::train::encodeTensorBundle;
using shoal::train::TensorBundle;

TensorBundle sample() {
  torch::manual_seed(3);
  return {
      {"w", torch::randn({3, 4})},
      {"half", torch::randn({5}).to(torch::kFloat16)},
      {"bf", torch::randn({2, 2}).to(torch::kBFloat16)},
      {"d", torch::randn({2}, torch::kFloat64)},
      {"step", torch::tensor(int64_t{7})},  // zero dimensions
      {"mask", torch::tensor({true, false, true})},
      {"bytes", torch::arange(0, 9, torch::kUInt8).reshape({3, 3})},
      {"i8", torch::tensor({-3, 4}, torch::kInt8)},
      {"i16", torch::tensor({-300, 400}, torch::kInt16)},
      {"i32", torch::tensor({-70000}, torch::kInt32)},
      {"empty", torch::empty({0, 5})},
      {"strided", torch::arange(12, torch::kFloat32).reshape({3, 4}).t()},  // not contiguous
  };
}

std::string errorOf(std::string_view bytes, std::string_view kind = "test") {
  try {
    (void)decodeTensorBundle(bytes, kind, "b");
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(TensorBundle, EveryDtypeAndShapeComesBackBitwiseInOrder) {
  const TensorBundle in = sample();
  const TensorBundle out = decodeTensorBundle(encodeTensorBundle("test", in), "test", "b");
  ASSERT_EQ(out.size(), in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    SCOPED_TRACE(in[i].first);
    EXPECT_EQ(out[i].first, in[i].first);
    EXPECT_EQ(out[i].second.scalar_type(), in[i].second.scalar_type());
    EXPECT_EQ(out[i].second.sizes(), in[i].second.sizes());
    EXPECT_TRUE(torch::equal(out[i].second, in[i].second));
  }
}

TEST(TensorBundle, EveryCutOrPaddedInputIsRefused) {
  const std::string bytes = encodeTensorBundle("test", sample());
  for (size_t n = 0; n < bytes.size(); ++n) {
    const std::string error = errorOf(std::string_view(bytes).substr(0, n));
    EXPECT_NE(error, "") << "cut to " << n << " of " << bytes.size() << " bytes";
  }
  EXPECT_NE(errorOf(bytes + '\0').find("bytes left over"), std::string::npos);
}

TEST(TensorBundle, ForeignKindsVersionsDtypesAndNamesAreNamed) {
  const std::string bytes = encodeTensorBundle("test", {{"a", torch::ones({2})}});
  EXPECT_NE(errorOf("PK\x03\x04 a zip").find("not a Shoal tensor bundle"), std::string::npos);
  EXPECT_NE(errorOf(bytes, "checkpoint").find("a bundle of kind 'test', not a checkpoint"),
            std::string::npos);
  std::string version = bytes;
  version[8] = 2;
  EXPECT_NE(errorOf(version).find("version 2"), std::string::npos);
  std::string dtype = bytes;
  dtype.replace(dtype.find("float32"), 7, "float99");
  EXPECT_NE(errorOf(dtype).find("'a' has unknown dtype 'float99'"), std::string::npos);

  std::string twice =
      encodeTensorBundle("test", {{"a", torch::ones({1})}, {"b", torch::ones({1})}});
  twice[twice.rfind('b')] = 'a';
  EXPECT_NE(errorOf(twice).find("'a' is named twice"), std::string::npos);
  EXPECT_THROW(encodeTensorBundle("test", {{"a", torch::ones({1})}, {"a", torch::ones({1})}}),
               InvalidArgument);
  EXPECT_THROW(encodeTensorBundle("test", {{"c", torch::ones({1}, torch::kComplexFloat)}}),
               InvalidArgument);

  std::string boolean = encodeTensorBundle("test", {{"m", torch::tensor({true})}});
  boolean.back() = 2;
  EXPECT_NE(errorOf(boolean).find("bool tensor 'm' holds a byte other than 0 or 1"),
            std::string::npos);
}

// Sizes that claim far more than the input holds are refused before anything is allocated (a
// 2^40-element shape would be 4 TiB).
TEST(TensorBundle, ClaimedSizesBeyondTheInputAllocateNothing) {
  std::string bytes = encodeTensorBundle("test", {{"a", torch::ones({2})}});
  const size_t shapeAt = bytes.find("float32") + 7 + 8;  // after the dimension count
  int64_t huge = int64_t{1} << 40;
  std::memcpy(bytes.data() + shapeAt, &huge, sizeof huge);
  EXPECT_NE(errorOf(bytes).find("truncated"), std::string::npos) << errorOf(bytes);

  int64_t negative = -2;
  std::memcpy(bytes.data() + shapeAt, &negative, sizeof negative);
  EXPECT_NE(errorOf(bytes).find("bad shape"), std::string::npos) << errorOf(bytes);

  std::string count = encodeTensorBundle("test", {});
  const uint64_t many = uint64_t{1} << 60;
  std::memcpy(count.data() + count.size() - 8, &many, sizeof many);
  EXPECT_NE(errorOf(count).find("does not fit"), std::string::npos) << errorOf(count);
}

}  // namespace
