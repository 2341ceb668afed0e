// The C ABI from C++: the header compiled as C (c_header_test.c) gives the table back field by field, and a
// forward call through it returns its status and message, without anything thrown across the boundary.
#include <gtest/gtest.h>

#include <cstring>

#include "attncheck/plugin.h"

extern "C" const attncheck_plugin_v1* c_header_test_table(void);

namespace {

TEST(PluginAbi, aTableCompiledAsCReadsBackInCpp) {
  const attncheck_plugin_v1* t = c_header_test_table();
  ASSERT_NE(t, nullptr);
  // The version is the first field: readable without knowing the rest of the layout.
  std::uint32_t first = 0;
  std::memcpy(&first, t, sizeof first);
  EXPECT_EQ(first, ATTNCHECK_PLUGIN_ABI_VERSION);
  EXPECT_EQ(t->dtypes, ATTNCHECK_DTYPE_F64 | ATTNCHECK_DTYPE_BF16);
  EXPECT_EQ(t->alignments, ATTNCHECK_ALIGN_BOTTOM_RIGHT);
  EXPECT_EQ(t->flags, ATTNCHECK_CAP_CUSTOM_SCALE | ATTNCHECK_CAP_NONFINITE_SAFE);
  EXPECT_EQ(t->max_T, 64);
  EXPECT_STREQ(t->name, "c-header-test");
  EXPECT_EQ(t->description, nullptr);
}

TEST(PluginAbi, forwardReportsThroughStatusAndCallerOwnedMessage) {
  const double q = 2.5;
  double out = 0;
  attncheck_call call{};
  call.dtype = ATTNCHECK_DTYPE_F64;
  call.alignment = ATTNCHECK_ALIGN_BOTTOM_RIGHT;
  call.has_scale = 1;
  call.scale = 0.25;
  call.q = {&q, {1, 1, 1, 1}, {1, 1, 1, 1}};
  call.output = {&out, {1, 1, 1, 1}, {1, 1, 1, 1}};
  char message[64];
  EXPECT_EQ(c_header_test_table()->forward(&call, message, sizeof message), ATTNCHECK_ERROR);
  EXPECT_EQ(out, 2.5);
  EXPECT_STREQ(message, "dtype 2 alignment 2 scale 0.25");
  // A message buffer smaller than the message is never overrun: snprintf truncates and terminates.
  char tiny[6];
  std::memset(tiny, 'x', sizeof tiny);
  c_header_test_table()->forward(&call, tiny, sizeof tiny);
  EXPECT_STREQ(tiny, "dtype");
}

}  // namespace
