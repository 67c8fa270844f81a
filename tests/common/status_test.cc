#include "common/status.h"

#include <gtest/gtest.h>

namespace tf {
namespace {

TEST(StatusTest, OkByDefaultAndNamedCodes) {
  EXPECT_TRUE(Status().ok());
  Status s = InvalidArgument("--vram must be positive");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.ToString(), "invalid_argument: --vram must be positive");
}

TEST(StatusTest, StatusOrCarriesValueOrError) {
  StatusOr<int> v = 42;
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, 42);
  StatusOr<int> e = NotFound("gpu 3");
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace tf
