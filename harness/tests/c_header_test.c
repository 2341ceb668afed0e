/* Compiles attncheck/plugin.h as strict C99 (-std=c99 -pedantic -Werror) and fills every field of its
 * ABI-2 and ABI-3 tables, so a C plug-in author can include it; plugin_abi_test.cpp reads the tables back. */
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
  static const attncheck_plugin_v2 table = {ATTNCHECK_PLUGIN_ABI_V2,
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

/* Reports the ABI-3 call fields it reads: the causal rule, the right window, the softcap, and whether an LSE
 * is wanted; writes 0.5 as the LSE of row 0 when it is. */
static int32_t forward3(const attncheck_call* call, char* message, size_t message_size) {
  ((double*)call->output.data)[0] = 0;
  if (call->lse) call->lse->data[0] = 0.5;
  snprintf(message, message_size, "causal %d right %lld softcap %g lse %d", (int)call->causal,
           (long long)call->window_right, call->softcap, call->lse ? 1 : 0);
  return ATTNCHECK_OK;
}

static const attncheck_head_dim c_header_test_dims[] = {{64, 0}, {576, 512}};
static const int64_t c_header_test_pages[] = {16, 64};

const attncheck_plugin_v1* c_header_test_table3(void);

const attncheck_plugin_v1* c_header_test_table3(void) {
  static const attncheck_plugin_v3 table = {ATTNCHECK_PLUGIN_ABI_V3,
                                            ATTNCHECK_DTYPE_F64,
                                            ATTNCHECK_ALIGN_BOTTOM_RIGHT,
                                            ATTNCHECK_CAP_CROSS_LENGTHS,
                                            0,
                                            "c-header-test-3",
                                            "ABI 3",
                                            forward3,
                                            ATTNCHECK_EMPTY_ROWS_ANY,
                                            0,
                                            NULL,
                                            ATTNCHECK_CAP3_LSE | ATTNCHECK_CAP3_V_HEAD_DIM | ATTNCHECK_CAP3_PAGED,
                                            ATTNCHECK_CROSS_Q_LE_K,
                                            8,
                                            576,
                                            c_header_test_dims,
                                            2,
                                            c_header_test_pages,
                                            2,
                                            ATTNCHECK_PAGED_TOKEN_MAJOR,
                                            0};
  return (const attncheck_plugin_v1*)&table;
}
