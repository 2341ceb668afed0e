/* Compiles attncheck/plugin.h as strict C99 (-std=c99 -pedantic -Werror) and fills every field of its
 * table, so a C plug-in author can include it; plugin_abi_test.cpp reads the table back. */
#include <attncheck/plugin.h>
#include <stdio.h>

static int32_t forward(const attncheck_call* call, char* message, size_t message_size) {
  double* out = (double*)call->output.data;
  const double* q = (const double*)call->q.data;
  /* Echo q's first element; report the call's dtype and alignment codes in the message. */
  out[0] = q[0];
  snprintf(message, message_size, "dtype %u alignment %u scale %g", (unsigned)call->dtype, (unsigned)call->alignment,
           call->has_scale ? call->scale : -1.0);
  return call->weights ? ATTNCHECK_UNSUPPORTED : ATTNCHECK_ERROR;
}

const attncheck_plugin_v1* c_header_test_table(void);

const attncheck_plugin_v1* c_header_test_table(void) {
  static const attncheck_plugin_v1 table = {ATTNCHECK_PLUGIN_ABI_VERSION,
                                            ATTNCHECK_DTYPE_F64 | ATTNCHECK_DTYPE_BF16,
                                            ATTNCHECK_ALIGN_BOTTOM_RIGHT,
                                            ATTNCHECK_CAP_CUSTOM_SCALE | ATTNCHECK_CAP_NONFINITE_SAFE,
                                            64,
                                            "c-header-test",
                                            NULL,
                                            forward};
  return &table;
}
