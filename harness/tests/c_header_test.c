/* Compiles attncheck/plugin.h as strict C99 (-std=c99 -pedantic -Werror) and fills every field of its
 * ABI-2 table, so a C plug-in author can include it; plugin_abi_test.cpp reads the table back. */
#include <attncheck/plugin.h>
#include <stdio.h>

static int32_t forward(const attncheck_call* call, char* message, size_t message_size) {
  double* out = (double*)call->output.data;
  const double* q = (const double*)call->q.data;
  /* Echo q's first element; report the call's dtype, alignment, scale, first key length and window. */
  out[0] = q[0];
  snprintf(message, message_size, "dtype %u alignment %u scale %g length %lld window %lld", (unsigned)call->dtype,
           (unsigned)call->alignment, call->has_scale ? call->scale : -1.0,
           call->key_lengths ? (long long)call->key_lengths[0] : -1LL, (long long)call->window);
  return call->weights ? ATTNCHECK_UNSUPPORTED : ATTNCHECK_ERROR;
}

/* Writes dO's first element into dq, dk and dv. */
static int32_t backward(const attncheck_backward_call* call, char* message, size_t message_size) {
  const double d = ((const double*)call->d_output.data)[0];
  ((double*)call->dq.data)[0] = d;
  ((double*)call->dk.data)[0] = 2 * d;
  ((double*)call->dv.data)[0] = 3 * d;
  snprintf(message, message_size, "window %lld", (long long)call->forward->window);
  return ATTNCHECK_OK;
}

const attncheck_plugin_v1* c_header_test_table(void);

const attncheck_plugin_v1* c_header_test_table(void) {
  static const attncheck_plugin_v2 table = {ATTNCHECK_PLUGIN_ABI_VERSION,
                                            ATTNCHECK_DTYPE_F64 | ATTNCHECK_DTYPE_BF16,
                                            ATTNCHECK_ALIGN_BOTTOM_RIGHT,
                                            ATTNCHECK_CAP_CUSTOM_SCALE | ATTNCHECK_CAP_NONFINITE_SAFE |
                                                ATTNCHECK_CAP_GQA | ATTNCHECK_CAP_KEY_LENGTHS | ATTNCHECK_CAP_WINDOW,
                                            64,
                                            "c-header-test",
                                            NULL,
                                            forward,
                                            ATTNCHECK_EMPTY_ROWS_NAN,
                                            0,
                                            backward};
  return (const attncheck_plugin_v1*)&table;
}
