// Configuration that refuses nonsense (common/env.h: the SHOAL_* variables and the one number
// parser every flag uses) and sealed files that never size an allocation from a crafted length.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <map>

#include "common/env.h"
#include "common/error.h"
#include "common/sealed_file.h"
#include "tests/process_util.h"

namespace shoal::test {
namespace {

// The message of the InvalidArgument `fn` throws ("" if it throws nothing).
template <typename Fn>
std::string errorOf(Fn&& fn) {
  try {
    fn();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(ConfigNumbers, TheWholeTextMustBeANumberInRange) {
  EXPECT_EQ(parseInteger("--n", "5", 1, 10), 5);
  EXPECT_EQ(parseInteger("--n", "+5", 1, 10), 5);
  EXPECT_EQ(parseInteger("--n", "-3", -5, 10), -3);
  for (const char* bad : {"", " 5", "5 ", "5x", "0x5", "5.0", "1e1", "-5", "11", "nan", "inf",
                          "99999999999999999999999"}) {
    const std::string what = errorOf([&] { parseInteger("--n", bad, 1, 10); });
    EXPECT_EQ(what, fmt::format("--n='{}': expected an integer from 1 to 10", bad)) << bad;
  }
  EXPECT_DOUBLE_EQ(parseNumber("--lr", "2.5e-3", 0, 1), 2.5e-3);
  for (const char* bad :
       {"", "inf", "-inf", "nan", "NaN", "1e300", "1e-300x", "0.5 ", "-0.1", "1.5", "1e9999"}) {
    const std::string what = errorOf([&] { parseNumber("--lr", bad, 0, 1); });
    EXPECT_EQ(what, fmt::format("--lr='{}': expected a finite number from 0 to 1", bad)) << bad;
  }
}

EnvReader mapEnv(std::map<std::string, std::string> vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

TEST(ConfigEnv, TimeoutsThatWouldOverflowADeadlineAreRefused) {
  for (const char* bad : {"inf", "1e300", "nan", "0", "-1", "60s", "1e7"}) {
    const std::string what = errorOf([&] { readEnvConfig(mapEnv({{"SHOAL_TIMEOUT", bad}})); });
    EXPECT_NE(what.find(fmt::format("SHOAL_TIMEOUT='{}': expected a finite number", bad)),
              std::string::npos)
        << bad << ": " << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
  EXPECT_DOUBLE_EQ(readEnvConfig(mapEnv({{"SHOAL_TIMEOUT", "2.5"}})).timeoutSeconds, 2.5);
  EXPECT_DOUBLE_EQ(readEnvConfig(mapEnv({})).timeoutSeconds, 60.0);
}

TEST(ConfigEnv, AnEmptyValueIsAnErrorNotUnset) {
  for (const char* name : {"SHOAL_TIMEOUT", "SHOAL_TRANSPORT", "SHOAL_ALLREDUCE_ALGORITHM",
                           "SHOAL_SECRET", "SHOAL_SECRET_FILE", "SHOAL_ADDR", "SHOAL_BACKEND",
                           "SHOAL_SHM_RING_BYTES", "SHOAL_LOG_LEVEL", "SHOAL_ENCRYPT"}) {
    const std::string what = errorOf([&] { readEnvConfig(mapEnv({{name, ""}})); });
    EXPECT_EQ(what, fmt::format("{} is set but empty: give it a value or unset it", name));
  }
}

TEST(ConfigEnv, EveryVariableRefusesNonsenseNamingItself) {
  const std::map<std::string, std::string> bad{
      {"SHOAL_TRANSPORT", "carrier-pigeon"}, {"SHOAL_BACKEND", "gloo"},
      {"SHOAL_SHM_RING_BYTES", "4096x"},     {"SHOAL_SHM_RING_BYTES", "1024"},
      {"SHOAL_LOG_LEVEL", "loud"},           {"SHOAL_ENCRYPT", "sometimes"},
  };
  for (const auto& [name, value] : bad) {
    const std::string what = errorOf([&] { readEnvConfig(mapEnv({{name, value}})); });
    EXPECT_NE(what.find(name), std::string::npos) << name << ": " << what;
    EXPECT_NE(what.find(value), std::string::npos) << name << ": " << what;
  }
  EXPECT_NE(errorOf([] {
              readEnvConfig(mapEnv({{"SHOAL_SHM_RING_BYTES", "99999999999"}}));
            }).find("expected an integer from 4096 to 4294967296"),
            std::string::npos);
  auto ok = readEnvConfig(mapEnv({{"SHOAL_SHM_RING_BYTES", "65536"}, {"SHOAL_BACKEND", "mpi"}}));
  EXPECT_EQ(ok.shmRingBytes, 65536u);
  EXPECT_EQ(ok.backend, "mpi");
}

// ---- sealed files: a crafted length is compared with the file's real size first.

void writeBytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

TEST(SealedFileDecoder, AHugeLengthIsRefusedWithoutAllocating) {
  TempDir dir;
  const std::string path = dir.path + "/crafted.ck";
  std::string bytes = "SHOALCK1";
  const uint64_t huge = uint64_t{1} << 60;
  bytes.append(reinterpret_cast<const char*>(&huge), 8);
  bytes.append(64, 'x');  // a few bytes of "payload" and "digest"
  writeBytes(path, bytes);
  const std::string what = errorOf([&] { readSealedFile(path); });
  EXPECT_EQ(what, fmt::format("checkpoint {}: truncated or padded: header says {} bytes of "
                              "payload, the file holds 32",
                              path, huge));
  // And the real thing still reads.
  writeSealedFile(path, "payload");
  EXPECT_EQ(readSealedFile(path), "payload");
}

TEST(SealedFileDecoder, ANonRegularFileIsRefusedNotReadForever) {
  EXPECT_EQ(errorOf([] { readSealedFile("/dev/zero"); }),
            "checkpoint /dev/zero: not a regular file");
  TempDir dir;
  EXPECT_EQ(errorOf([&] { readSealedFile(dir.path); }),
            fmt::format("checkpoint {}: not a regular file", dir.path));
  EXPECT_NE(errorOf([&] { readSealedFile(dir.path + "/missing"); }).find("cannot be read"),
            std::string::npos);
}

}  // namespace
}  // namespace shoal::test
