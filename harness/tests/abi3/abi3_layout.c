/* The struct offsets and sizes of the frozen ABI-3 header, compiled as C: plugin_abi_test.cpp compares them
 * with the current header's, which proves ABI 4 only appended (every ABI-3 field where it was). */
#include <attncheck/plugin.h>
#include <stddef.h>

const size_t abi3_layout[] = {
    /* the call: every field (ABI 1 to 3), then its size */
    offsetof(attncheck_call, dtype), offsetof(attncheck_call, alignment), offsetof(attncheck_call, has_scale),
    offsetof(attncheck_call, scale), offsetof(attncheck_call, q), offsetof(attncheck_call, k),
    offsetof(attncheck_call, v), offsetof(attncheck_call, output), offsetof(attncheck_call, weights),
    offsetof(attncheck_call, key_lengths), offsetof(attncheck_call, window), offsetof(attncheck_call, causal),
    offsetof(attncheck_call, reserved3), offsetof(attncheck_call, prefix_length),
    offsetof(attncheck_call, window_right), offsetof(attncheck_call, chunk_size), offsetof(attncheck_call, q_doc_ids),
    offsetof(attncheck_call, k_doc_ids), offsetof(attncheck_call, block_mask), offsetof(attncheck_call, dense_mask),
    offsetof(attncheck_call, softcap), offsetof(attncheck_call, alibi_slopes), offsetof(attncheck_call, sinks),
    offsetof(attncheck_call, lse), offsetof(attncheck_call, paged), sizeof(attncheck_call),
    /* the backward call */
    offsetof(attncheck_backward_call, forward), offsetof(attncheck_backward_call, d_output),
    offsetof(attncheck_backward_call, dq), offsetof(attncheck_backward_call, dk), offsetof(attncheck_backward_call, dv),
    offsetof(attncheck_backward_call, d_sinks), sizeof(attncheck_backward_call),
    /* the ABI-3 table */
    offsetof(attncheck_plugin_v3, abi_version), offsetof(attncheck_plugin_v3, dtypes),
    offsetof(attncheck_plugin_v3, alignments), offsetof(attncheck_plugin_v3, flags), offsetof(attncheck_plugin_v3, max_T),
    offsetof(attncheck_plugin_v3, name), offsetof(attncheck_plugin_v3, description),
    offsetof(attncheck_plugin_v3, forward), offsetof(attncheck_plugin_v3, empty_rows),
    offsetof(attncheck_plugin_v3, reserved), offsetof(attncheck_plugin_v3, backward),
    offsetof(attncheck_plugin_v3, flags3), offsetof(attncheck_plugin_v3, cross_lengths),
    offsetof(attncheck_plugin_v3, head_dim_multiple), offsetof(attncheck_plugin_v3, max_head_dim),
    offsetof(attncheck_plugin_v3, head_dims), offsetof(attncheck_plugin_v3, num_head_dims),
    offsetof(attncheck_plugin_v3, page_sizes), offsetof(attncheck_plugin_v3, num_page_sizes),
    offsetof(attncheck_plugin_v3, page_layouts), offsetof(attncheck_plugin_v3, reserved3), sizeof(attncheck_plugin_v3),
    /* the structs the call points to */
    sizeof(attncheck_tensor_in), sizeof(attncheck_tensor_out), sizeof(attncheck_lse_out),
    sizeof(attncheck_block_mask), sizeof(attncheck_dense_mask), sizeof(attncheck_paged_kv), sizeof(attncheck_head_dim)};
const size_t abi3_layout_size = sizeof abi3_layout / sizeof abi3_layout[0];
