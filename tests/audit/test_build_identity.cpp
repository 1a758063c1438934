// Build identity: the source commit comes from the configured source dir, and is a clear "unknown"
// (never an error, never garbage) where there is no git work tree.
#include <gtest/gtest.h>

#include <filesystem>

#include "audit/build_identity.h"

using namespace moesq::audit;

TEST(BuildIdentity, UnknownOutsideAGitWorkTree) {
  EXPECT_EQ(source_commit(""), "unknown");
  EXPECT_EQ(source_commit("/nonexistent/moesq/source"), "unknown");
  const auto dir = std::filesystem::temp_directory_path() / "moesq_no_git_here";
  std::filesystem::create_directories(dir);
  EXPECT_EQ(source_commit(dir.string()), "unknown");
  std::filesystem::remove_all(dir);
}

TEST(BuildIdentity, BinaryHashIsSha256) {
  const BuildIdentity id = current_build_identity();
  EXPECT_EQ(id.binary_sha256.size(), 64u);
  EXPECT_FALSE(id.git_commit.empty());
}
