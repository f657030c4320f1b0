// The secret Slurm tasks on one node share through a private directory (run/node_secret.h).
#include "run/node_secret.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <string>

#include "common/error.h"
#include "tests/process_util.h"

namespace shoal::test {
namespace {

using namespace std::chrono_literals;

std::string secretPath(const std::string& base, const std::string& key) {
  return base + "/" + key + ".secret";
}

TEST(NodeSecret, AReaderGetsWhatTheHostPublishedAndTheFileGoesWithItsOwner) {
  TempDir dir;
  const std::string base = dir.path + "/private";
  std::string path;
  {
    const run::NodeSecret published = run::publishNodeSecret("slurm-7.0", base);
    EXPECT_EQ(published.secret.size(), 64u);
    path = secretPath(base, "slurm-7.0");
    struct stat st {};
    ASSERT_EQ(::stat(path.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    ASSERT_EQ(::stat(base.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0700u);
    EXPECT_EQ(run::awaitNodeSecret("slurm-7.0", 1, 5s, base), published.secret);
    // Another step of the job has a secret of its own.
    const run::NodeSecret other = run::publishNodeSecret("slurm-7.1", base);
    EXPECT_NE(other.secret, published.secret);
  }
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(secretPath(base, "slurm-7.1")));
}

TEST(NodeSecret, AReaderThatCameFirstIsWokenByThePublication) {
  TempDir dir;
  const std::string base = dir.path + "/private";
  run::nodeSecretDirectory(base);
  // The reader is waiting (its directory watch is set before its first look) when the file
  // appears; it must not need the deadline to notice.
  auto reader = std::async(std::launch::async,
                           [&] { return run::awaitNodeSecret("slurm-8.0", 1, 60s, base); });
  const auto start = std::chrono::steady_clock::now();
  const run::NodeSecret published = run::publishNodeSecret("slurm-8.0", base);
  EXPECT_EQ(reader.get(), published.secret);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 30s);  // generous: far below the 60 s
}

TEST(NodeSecret, ANeverPublishedSecretTimesOutNamingThePathAndTheRank) {
  TempDir dir;
  const std::string base = dir.path + "/private";
  try {
    run::awaitNodeSecret("slurm-9.0", 3, 200ms, base);
    FAIL() << "no timeout";
  } catch (const TimeoutError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("rank 3: no job secret at " + secretPath(base, "slurm-9.0")),
              std::string::npos)
        << what;
  }
}

TEST(NodeSecret, FilesAnotherCouldHaveWrittenOrReadAreNeverUsed) {
  TempDir dir;
  const std::string base = dir.path + "/private";
  run::nodeSecretDirectory(base);
  const std::string path = secretPath(base, "slurm-10.0");
  const std::string planted(64, 'a');
  for (mode_t mode : {0644, 0660, 0604}) {
    { std::ofstream(path) << planted; }
    ASSERT_EQ(::chmod(path.c_str(), mode), 0);
    EXPECT_THROW(run::awaitNodeSecret("slurm-10.0", 1, 100ms, base), TimeoutError) << mode;
  }
  // The right mode but not a secret's shape: also waited past.
  { std::ofstream(path) << "short"; }
  ASSERT_EQ(::chmod(path.c_str(), 0600), 0);
  EXPECT_THROW(run::awaitNodeSecret("slurm-10.0", 1, 100ms, base), TimeoutError);
  // A link, even to a valid file, is not followed.
  const std::string real = dir.path + "/real";
  { std::ofstream(real) << planted; }
  ASSERT_EQ(::chmod(real.c_str(), 0600), 0);
  std::filesystem::remove(path);
  std::filesystem::create_symlink(real, path);
  EXPECT_THROW(run::awaitNodeSecret("slurm-10.0", 1, 100ms, base), TimeoutError);
  // Publishing replaces what was there.
  const run::NodeSecret published = run::publishNodeSecret("slurm-10.0", base);
  EXPECT_EQ(run::awaitNodeSecret("slurm-10.0", 1, 5s, base), published.secret);
}

TEST(NodeSecret, ADirectoryOpenToOthersIsRefusedNamingIt) {
  TempDir dir;
  const std::string base = dir.path + "/open";
  ASSERT_EQ(::mkdir(base.c_str(), 0755), 0);
  ASSERT_EQ(::chmod(base.c_str(), 0755), 0);  // whatever the umask
  for (auto attempt : {0, 1}) {
    try {
      if (attempt == 0) run::publishNodeSecret("slurm-11.0", base);
      if (attempt == 1) run::awaitNodeSecret("slurm-11.0", 1, 100ms, base);
      FAIL() << "accepted a directory with mode 0755";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(base + " must be a directory owned by this user"),
                std::string::npos)
          << e.what();
    }
  }
  // A file where the directory should be.
  const std::string file = dir.path + "/file";
  { std::ofstream(file) << "x"; }
  EXPECT_THROW(run::nodeSecretDirectory(file), InvalidArgument);
}

TEST(NodeSecret, SlurmKeysAreMadeOnlyOfIds) {
  EXPECT_EQ(run::slurmSecretKey("123", "4"), "slurm-123.4");
  EXPECT_EQ(run::slurmSecretKey("123", ""), "slurm-123.0");
  for (const char* bad : {"", "12a", "../x", "-1", "123456789012345678901"}) {
    EXPECT_THROW(run::slurmSecretKey(bad, "0"), InvalidArgument) << bad;
  }
  EXPECT_THROW(run::slurmSecretKey("1", "2/3"), InvalidArgument);
}

}  // namespace
}  // namespace shoal::test
