/* The struct offsets and sizes of the frozen ABI-2 header, compiled as C: plugin_abi_test.cpp compares them
 * with the current header's, which proves ABI 3 only appended (every ABI-2 field where it was). */
#include <attncheck/plugin.h>
#include <stddef.h>

const size_t abi2_layout[] = {
    offsetof(attncheck_call, dtype),           offsetof(attncheck_call, alignment),
    offsetof(attncheck_call, has_scale),       offsetof(attncheck_call, scale),
    offsetof(attncheck_call, q),               offsetof(attncheck_call, k),
    offsetof(attncheck_call, v),               offsetof(attncheck_call, output),
    offsetof(attncheck_call, weights),         offsetof(attncheck_call, key_lengths),
    offsetof(attncheck_call, window),          sizeof(attncheck_call),
    offsetof(attncheck_backward_call, forward), offsetof(attncheck_backward_call, d_output),
    offsetof(attncheck_backward_call, dq),     offsetof(attncheck_backward_call, dk),
    offsetof(attncheck_backward_call, dv),     sizeof(attncheck_backward_call),
    offsetof(attncheck_plugin_v2, abi_version), offsetof(attncheck_plugin_v2, dtypes),
    offsetof(attncheck_plugin_v2, alignments), offsetof(attncheck_plugin_v2, flags),
    offsetof(attncheck_plugin_v2, max_T),      offsetof(attncheck_plugin_v2, name),
    offsetof(attncheck_plugin_v2, description), offsetof(attncheck_plugin_v2, forward),
    offsetof(attncheck_plugin_v2, empty_rows), offsetof(attncheck_plugin_v2, reserved),
    offsetof(attncheck_plugin_v2, backward),   sizeof(attncheck_plugin_v2),
    sizeof(attncheck_tensor_in),               sizeof(attncheck_tensor_out)};
const size_t abi2_layout_size = sizeof abi2_layout / sizeof abi2_layout[0];
