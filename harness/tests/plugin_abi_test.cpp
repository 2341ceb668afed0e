// The C ABI from C++: the header compiled as C (c_header_test.c) gives the ABI-2 table back field by field,
// forward and backward calls through it return their status and message without anything thrown across the
// boundary, and every ABI-1 field sits where the frozen ABI-1 header (tests/abi1/) put it.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <vector>

#include "attncheck/plugin.h"

extern "C" const attncheck_plugin_v1* c_header_test_table(void);
extern "C" const std::size_t abi1_layout[];
extern "C" const std::size_t abi1_layout_size;

namespace {

const attncheck_plugin_v2* table2() { return reinterpret_cast<const attncheck_plugin_v2*>(c_header_test_table()); }

TEST(PluginAbi, aTableCompiledAsCReadsBackInCpp) {
  const attncheck_plugin_v1* t = c_header_test_table();
  ASSERT_NE(t, nullptr);
  // The version is the first field: readable without knowing the rest of the layout.
  std::uint32_t first = 0;
  std::memcpy(&first, t, sizeof first);
  EXPECT_EQ(first, ATTNCHECK_PLUGIN_ABI_V2);
  EXPECT_EQ(t->dtypes, ATTNCHECK_DTYPE_F64 | ATTNCHECK_DTYPE_BF16);
  EXPECT_EQ(t->alignments, ATTNCHECK_ALIGN_BOTTOM_RIGHT);
  EXPECT_EQ(t->flags, ATTNCHECK_CAP_CUSTOM_SCALE | ATTNCHECK_CAP_NONFINITE_SAFE | ATTNCHECK_CAP_GQA |
                          ATTNCHECK_CAP_KEY_LENGTHS | ATTNCHECK_CAP_WINDOW);
  EXPECT_EQ(t->max_T, 64);
  EXPECT_STREQ(t->name, "c-header-test");
  EXPECT_EQ(t->description, nullptr);
  EXPECT_EQ(table2()->empty_rows, ATTNCHECK_EMPTY_ROWS_NAN);
  EXPECT_EQ(table2()->reserved, 0u);
  EXPECT_NE(table2()->backward, nullptr);
}

TEST(PluginAbi, forwardReportsThroughStatusAndCallerOwnedMessage) {
  const double q = 2.5;
  double out = 0;
  const std::int64_t lengths[] = {3};
  attncheck_call call{};
  call.dtype = ATTNCHECK_DTYPE_F64;
  call.alignment = ATTNCHECK_ALIGN_BOTTOM_RIGHT;
  call.has_scale = 1;
  call.scale = 0.25;
  call.q = {&q, {1, 1, 1, 1}, {1, 1, 1, 1}};
  call.output = {&out, {1, 1, 1, 1}, {1, 1, 1, 1}};
  call.key_lengths = lengths;
  call.window = 5;
  char message[64];
  EXPECT_EQ(c_header_test_table()->forward(&call, message, sizeof message), ATTNCHECK_ERROR);
  EXPECT_EQ(out, 2.5);
  EXPECT_STREQ(message, "dtype 2 alignment 2 scale 0.25 length 3 window 5");
  // A message buffer smaller than the message is never overrun: snprintf truncates and terminates.
  char tiny[6];
  std::memset(tiny, 'x', sizeof tiny);
  c_header_test_table()->forward(&call, tiny, sizeof tiny);
  EXPECT_STREQ(tiny, "dtype");
}

TEST(PluginAbi, backwardGetsTheForwardCallAndDOutput) {
  const double q = 1, d_out = 0.5;
  double scratch = 0, dq = 0, dk = 0, dv = 0;
  attncheck_call call{};
  call.dtype = ATTNCHECK_DTYPE_F64;
  call.q = call.k = call.v = {&q, {1, 1, 1, 1}, {1, 1, 1, 1}};
  call.output = {&scratch, {1, 1, 1, 1}, {1, 1, 1, 1}};
  call.window = -1;
  const attncheck_backward_call bcall{&call,
                                      {&d_out, {1, 1, 1, 1}, {1, 1, 1, 1}},
                                      {&dq, {1, 1, 1, 1}, {1, 1, 1, 1}},
                                      {&dk, {1, 1, 1, 1}, {1, 1, 1, 1}},
                                      {&dv, {1, 1, 1, 1}, {1, 1, 1, 1}}};
  char message[32];
  EXPECT_EQ(table2()->backward(&bcall, message, sizeof message), ATTNCHECK_OK);
  EXPECT_EQ(dq, 0.5);
  EXPECT_EQ(dk, 1.0);
  EXPECT_EQ(dv, 1.5);
  EXPECT_STREQ(message, "window -1");
}

// ABI 2 only appends: the offsets of every ABI-1 field, as the frozen header compiled as C gives them, are
// the current header's; the ABI-2 fields come after the end of the ABI-1 structs.
TEST(PluginAbi, abi2KeepsEveryAbi1OffsetAndOnlyAppends) {
  const std::vector<std::size_t> now = {
      offsetof(attncheck_call, dtype),          offsetof(attncheck_call, alignment),
      offsetof(attncheck_call, has_scale),      offsetof(attncheck_call, scale),
      offsetof(attncheck_call, q),              offsetof(attncheck_call, k),
      offsetof(attncheck_call, v),              offsetof(attncheck_call, output),
      offsetof(attncheck_call, weights),        abi1_layout[9],  // sizeof(attncheck_call) grows: checked below
      offsetof(attncheck_plugin_v1, abi_version), offsetof(attncheck_plugin_v1, dtypes),
      offsetof(attncheck_plugin_v1, alignments),  offsetof(attncheck_plugin_v1, flags),
      offsetof(attncheck_plugin_v1, max_T),       offsetof(attncheck_plugin_v1, name),
      offsetof(attncheck_plugin_v1, description), offsetof(attncheck_plugin_v1, forward),
      sizeof(attncheck_plugin_v1),              sizeof(attncheck_tensor_in),
      sizeof(attncheck_tensor_out)};
  ASSERT_EQ(abi1_layout_size, now.size());
  for (std::size_t i = 0; i < now.size(); ++i) EXPECT_EQ(abi1_layout[i], now[i]) << "layout entry " << i;
  EXPECT_GE(offsetof(attncheck_call, key_lengths), abi1_layout[9]);
  // attncheck_plugin_v2 starts with attncheck_plugin_v1's fields at the same offsets.
  EXPECT_EQ(offsetof(attncheck_plugin_v2, abi_version), offsetof(attncheck_plugin_v1, abi_version));
  EXPECT_EQ(offsetof(attncheck_plugin_v2, flags), offsetof(attncheck_plugin_v1, flags));
  EXPECT_EQ(offsetof(attncheck_plugin_v2, max_T), offsetof(attncheck_plugin_v1, max_T));
  EXPECT_EQ(offsetof(attncheck_plugin_v2, name), offsetof(attncheck_plugin_v1, name));
  EXPECT_EQ(offsetof(attncheck_plugin_v2, forward), offsetof(attncheck_plugin_v1, forward));
  EXPECT_GE(offsetof(attncheck_plugin_v2, empty_rows), sizeof(attncheck_plugin_v1));
}

}  // namespace
