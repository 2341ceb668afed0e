// The C ABI from C++: the header compiled as C (c_header_test.c) gives the ABI-2 and ABI-3 tables back field by
// field, forward and backward calls through it return their status and message without anything thrown across
// the boundary, and every ABI-1 and ABI-2 field sits where the frozen headers (tests/abi1/, tests/abi2/) put it.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <vector>

#include "attncheck/plugin.h"

extern "C" const attncheck_plugin_v1* c_header_test_table(void);
extern "C" const attncheck_plugin_v1* c_header_test_table3(void);
extern "C" const std::size_t abi1_layout[];
extern "C" const std::size_t abi1_layout_size;
extern "C" const std::size_t abi2_layout[];
extern "C" const std::size_t abi2_layout_size;
extern "C" const std::size_t abi3_layout[];
extern "C" const std::size_t abi3_layout_size;

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
                                      {&dv, {1, 1, 1, 1}, {1, 1, 1, 1}},
                                      nullptr};
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

TEST(PluginAbi, anAbi3TableCompiledAsCReadsBackInCpp) {
  const auto* t = reinterpret_cast<const attncheck_plugin_v3*>(c_header_test_table3());
  EXPECT_EQ(t->abi_version, ATTNCHECK_PLUGIN_ABI_V3);
  EXPECT_STREQ(t->name, "c-header-test-3");
  EXPECT_EQ(t->empty_rows, ATTNCHECK_EMPTY_ROWS_ANY);
  EXPECT_EQ(t->flags3, ATTNCHECK_CAP3_LSE | ATTNCHECK_CAP3_V_HEAD_DIM | ATTNCHECK_CAP3_PAGED);
  EXPECT_EQ(t->cross_lengths, ATTNCHECK_CROSS_Q_LE_K);
  EXPECT_EQ(t->head_dim_multiple, 8);
  EXPECT_EQ(t->max_head_dim, 576);
  ASSERT_EQ(t->num_head_dims, 2u);
  EXPECT_EQ(t->head_dims[1].k, 576);
  EXPECT_EQ(t->head_dims[1].v, 512);
  ASSERT_EQ(t->num_page_sizes, 2u);
  EXPECT_EQ(t->page_sizes[1], 64);
  EXPECT_EQ(t->page_layouts, ATTNCHECK_PAGED_TOKEN_MAJOR);
  // The ABI-3 call fields cross as C wrote them, the LSE output included.
  double q = 1, out = 1, lse = 0;
  attncheck_lse_out lse_out{&lse, {1, 1, 1}, {1, 1, 1}};
  attncheck_call call{};
  call.dtype = ATTNCHECK_DTYPE_F64;
  call.q = call.k = call.v = {&q, {1, 1, 1, 1}, {1, 1, 1, 1}};
  call.output = {&out, {1, 1, 1, 1}, {1, 1, 1, 1}};
  call.window = -1;
  call.causal = 0;
  call.window_right = 3;
  call.softcap = 30;
  call.lse = &lse_out;
  char message[64];
  EXPECT_EQ(t->forward(&call, message, sizeof message), ATTNCHECK_OK);
  EXPECT_STREQ(message, "causal 0 right 3 softcap 30 lse 1");
  EXPECT_EQ(lse, 0.5);
  EXPECT_EQ(out, 0);
}

// ABI 3 only appends: every ABI-2 offset (call, backward call, table) as the frozen ABI-2 header compiled as C
// gives it is the current header's, and attncheck_plugin_v3 starts with attncheck_plugin_v2's fields.
TEST(PluginAbi, abi3KeepsEveryAbi2OffsetAndOnlyAppends) {
  const std::vector<std::size_t> now = {
      offsetof(attncheck_call, dtype),           offsetof(attncheck_call, alignment),
      offsetof(attncheck_call, has_scale),       offsetof(attncheck_call, scale),
      offsetof(attncheck_call, q),               offsetof(attncheck_call, k),
      offsetof(attncheck_call, v),               offsetof(attncheck_call, output),
      offsetof(attncheck_call, weights),         offsetof(attncheck_call, key_lengths),
      offsetof(attncheck_call, window),          abi2_layout[11],  // sizeof(attncheck_call) grows: below
      offsetof(attncheck_backward_call, forward), offsetof(attncheck_backward_call, d_output),
      offsetof(attncheck_backward_call, dq),     offsetof(attncheck_backward_call, dk),
      offsetof(attncheck_backward_call, dv),     abi2_layout[17],  // grows too
      offsetof(attncheck_plugin_v3, abi_version), offsetof(attncheck_plugin_v3, dtypes),
      offsetof(attncheck_plugin_v3, alignments), offsetof(attncheck_plugin_v3, flags),
      offsetof(attncheck_plugin_v3, max_T),      offsetof(attncheck_plugin_v3, name),
      offsetof(attncheck_plugin_v3, description), offsetof(attncheck_plugin_v3, forward),
      offsetof(attncheck_plugin_v3, empty_rows), offsetof(attncheck_plugin_v3, reserved),
      offsetof(attncheck_plugin_v3, backward),   abi2_layout[29],  // the v3 table is longer
      sizeof(attncheck_tensor_in),               sizeof(attncheck_tensor_out)};
  ASSERT_EQ(abi2_layout_size, now.size());
  for (std::size_t i = 0; i < now.size(); ++i) EXPECT_EQ(abi2_layout[i], now[i]) << "layout entry " << i;
  EXPECT_GE(offsetof(attncheck_call, causal), abi2_layout[11]);
  EXPECT_GE(offsetof(attncheck_backward_call, d_sinks), abi2_layout[17]);
  EXPECT_GE(offsetof(attncheck_plugin_v3, flags3), abi2_layout[29]);
  // The current attncheck_plugin_v2 is the frozen one, field for field.
  EXPECT_EQ(sizeof(attncheck_plugin_v2), abi2_layout[29]);
  EXPECT_EQ(offsetof(attncheck_plugin_v2, backward), abi2_layout[28]);
}

// ABI 4 only appends: every ABI-3 offset (call, backward call, table, the structs a call points to) as the frozen
// ABI-3 header compiled as C gives it is the current header's; attncheck_plugin_v4 starts with attncheck_plugin_v3's
// fields, and its own size comes right after them.
TEST(PluginAbi, abi4KeepsEveryAbi3OffsetAndOnlyAppends) {
#define V4(f) offsetof(attncheck_plugin_v4, f)
  const std::vector<std::size_t> now = {
      offsetof(attncheck_call, dtype), offsetof(attncheck_call, alignment), offsetof(attncheck_call, has_scale),
      offsetof(attncheck_call, scale), offsetof(attncheck_call, q), offsetof(attncheck_call, k),
      offsetof(attncheck_call, v), offsetof(attncheck_call, output), offsetof(attncheck_call, weights),
      offsetof(attncheck_call, key_lengths), offsetof(attncheck_call, window), offsetof(attncheck_call, causal),
      offsetof(attncheck_call, reserved3), offsetof(attncheck_call, prefix_length),
      offsetof(attncheck_call, window_right), offsetof(attncheck_call, chunk_size), offsetof(attncheck_call, q_doc_ids),
      offsetof(attncheck_call, k_doc_ids), offsetof(attncheck_call, block_mask), offsetof(attncheck_call, dense_mask),
      offsetof(attncheck_call, softcap), offsetof(attncheck_call, alibi_slopes), offsetof(attncheck_call, sinks),
      offsetof(attncheck_call, lse), offsetof(attncheck_call, paged), abi3_layout[25],  // the call may grow: below
      offsetof(attncheck_backward_call, forward), offsetof(attncheck_backward_call, d_output),
      offsetof(attncheck_backward_call, dq), offsetof(attncheck_backward_call, dk), offsetof(attncheck_backward_call, dv),
      offsetof(attncheck_backward_call, d_sinks), abi3_layout[32],  // grows too
      V4(abi_version), V4(dtypes), V4(alignments), V4(flags), V4(max_T), V4(name), V4(description), V4(forward),
      V4(empty_rows), V4(reserved), V4(backward), V4(flags3), V4(cross_lengths), V4(head_dim_multiple),
      V4(max_head_dim), V4(head_dims), V4(num_head_dims), V4(page_sizes), V4(num_page_sizes), V4(page_layouts),
      V4(reserved3), abi3_layout[54],  // the v4 table is longer
      sizeof(attncheck_tensor_in), sizeof(attncheck_tensor_out), sizeof(attncheck_lse_out),
      sizeof(attncheck_block_mask), sizeof(attncheck_dense_mask), sizeof(attncheck_paged_kv),
      sizeof(attncheck_head_dim)};
#undef V4
  ASSERT_EQ(abi3_layout_size, now.size());
  for (std::size_t i = 0; i < now.size(); ++i) EXPECT_EQ(abi3_layout[i], now[i]) << "layout entry " << i;
  EXPECT_GE(sizeof(attncheck_call), abi3_layout[25]);
  EXPECT_GE(sizeof(attncheck_backward_call), abi3_layout[32]);
  // The table's own size is the first ABI-4 field, right after the ABI-3 ones; the current attncheck_plugin_v3 is
  // the frozen one.
  EXPECT_EQ(offsetof(attncheck_plugin_v4, table_size), abi3_layout[54]);
  EXPECT_EQ(sizeof(attncheck_plugin_v3), abi3_layout[54]);
  EXPECT_EQ(ATTNCHECK_PLUGIN_V4_MIN_SIZE, offsetof(attncheck_plugin_v4, flags4) + sizeof(std::uint32_t));
  EXPECT_EQ(ATTNCHECK_PLUGIN_V4_SIZE % 8, 0u);
  EXPECT_EQ(ATTNCHECK_PLUGIN_ABI_VERSION, ATTNCHECK_PLUGIN_ABI_V4);
}

}  // namespace
