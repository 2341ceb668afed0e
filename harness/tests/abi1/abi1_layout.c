/* The struct offsets and sizes of the frozen ABI-1 header, compiled as C: plugin_abi_test.cpp compares them
 * with the current header's, which proves ABI 2 only appended (every ABI-1 field where it was). */
#include <attncheck/plugin.h>
#include <stddef.h>

const size_t abi1_layout[] = {
    offsetof(attncheck_call, dtype),          offsetof(attncheck_call, alignment),
    offsetof(attncheck_call, has_scale),      offsetof(attncheck_call, scale),
    offsetof(attncheck_call, q),              offsetof(attncheck_call, k),
    offsetof(attncheck_call, v),              offsetof(attncheck_call, output),
    offsetof(attncheck_call, weights),        sizeof(attncheck_call),
    offsetof(attncheck_plugin_v1, abi_version), offsetof(attncheck_plugin_v1, dtypes),
    offsetof(attncheck_plugin_v1, alignments),  offsetof(attncheck_plugin_v1, flags),
    offsetof(attncheck_plugin_v1, max_T),       offsetof(attncheck_plugin_v1, name),
    offsetof(attncheck_plugin_v1, description), offsetof(attncheck_plugin_v1, forward),
    sizeof(attncheck_plugin_v1),              sizeof(attncheck_tensor_in),
    sizeof(attncheck_tensor_out)};
const size_t abi1_layout_size = sizeof abi1_layout / sizeof abi1_layout[0];
