/* A test plug-in (ABI 3, float64 only) that computes no attention: it echoes the masks' call fields into its
 * outputs, so that a test can read back what the loader (in process, or through the plug-in host and the exec
 * protocol) sent. It declares documents, chunked local attention, a prefix, a right window and bidirectional.
 *
 * forward: output (b,h,i,d) = d 0: q_doc_ids[b*T_q+i] (-100 when NULL), 1: prefix_length, 2: window_right,
 *          3: chunk_size, 4: causal, 5 and up: 0 (needs D >= 5); weights (b,h,i,j) = k_doc_ids[b*T_k+j] (-100
 *          when NULL).
 * backward: dq as forward's output, dk (b,g,j,d) = k_doc_ids[b*T_k+j] (-100 when NULL), dv 0. */
#include <attncheck/plugin.h>
#include <stdio.h>

static void put(const attncheck_tensor_out* t, int64_t b, int64_t h, int64_t i, int64_t d, double x) {
  ((double*)t->data)[b * t->strides[0] + h * t->strides[1] + i * t->strides[2] + d * t->strides[3]] = x;
}

static double field(const attncheck_call* c, int64_t b, int64_t i, int64_t d) {
  switch (d) {
    case 0:
      return c->q_doc_ids ? c->q_doc_ids[b * c->q.shape[2] + i] : -100;
    case 1:
      return (double)c->prefix_length;
    case 2:
      return (double)c->window_right;
    case 3:
      return (double)c->chunk_size;
    case 4:
      return c->causal;
  }
  return 0;
}

static int32_t echo_rows(const attncheck_call* c, const attncheck_tensor_out* out, char* message, size_t size) {
  const int64_t B = c->q.shape[0], H = c->q.shape[1], Tq = c->q.shape[2], D = c->q.shape[3];
  if (c->dtype != ATTNCHECK_DTYPE_F64 || D < 5) {
    snprintf(message, size, "the echo plug-in takes float64 and D >= 5");
    return ATTNCHECK_UNSUPPORTED;
  }
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < Tq; ++i)
        for (int64_t d = 0; d < D; ++d) put(out, b, h, i, d, field(c, b, i, d));
  return ATTNCHECK_OK;
}

static double k_id(const attncheck_call* c, int64_t b, int64_t j) {
  return c->k_doc_ids ? c->k_doc_ids[b * c->k.shape[2] + j] : -100;
}

static int32_t forward(const attncheck_call* c, char* message, size_t size) {
  const int32_t st = echo_rows(c, &c->output, message, size);
  if (st != ATTNCHECK_OK || !c->weights) return st;
  for (int64_t b = 0; b < c->q.shape[0]; ++b)
    for (int64_t h = 0; h < c->q.shape[1]; ++h)
      for (int64_t i = 0; i < c->q.shape[2]; ++i)
        for (int64_t j = 0; j < c->k.shape[2]; ++j) put(c->weights, b, h, i, j, k_id(c, b, j));
  return ATTNCHECK_OK;
}

static int32_t backward(const attncheck_backward_call* bc, char* message, size_t size) {
  const attncheck_call* c = bc->forward;
  const int32_t st = echo_rows(c, &bc->dq, message, size);
  if (st != ATTNCHECK_OK) return st;
  for (int64_t b = 0; b < c->k.shape[0]; ++b)
    for (int64_t g = 0; g < c->k.shape[1]; ++g)
      for (int64_t j = 0; j < c->k.shape[2]; ++j)
        for (int64_t d = 0; d < c->k.shape[3]; ++d) {
          put(&bc->dk, b, g, j, d, k_id(c, b, j));
          put(&bc->dv, b, g, j, d, 0);
        }
  return ATTNCHECK_OK;
}

ATTNCHECK_PLUGIN_EXPORT const attncheck_plugin_v1* attncheck_plugin(void) {
  static const attncheck_plugin_v3 table = {
      .abi_version = ATTNCHECK_PLUGIN_ABI_V3,
      .dtypes = ATTNCHECK_DTYPE_F64,
      .alignments = ATTNCHECK_ALIGN_TOP_LEFT | ATTNCHECK_ALIGN_BOTTOM_RIGHT,
      .flags = ATTNCHECK_CAP_RETURNS_WEIGHTS | ATTNCHECK_CAP_CROSS_LENGTHS | ATTNCHECK_CAP_KEY_LENGTHS |
               ATTNCHECK_CAP_WINDOW,
      .name = "masks-echo",
      .description = "echoes the masks' call fields (a test fixture, not attention)",
      .forward = forward,
      .empty_rows = ATTNCHECK_EMPTY_ROWS_ZERO,
      .backward = backward,
      .flags3 = ATTNCHECK_CAP3_DOCUMENTS | ATTNCHECK_CAP3_CHUNKED_LOCAL | ATTNCHECK_CAP3_PREFIX |
                ATTNCHECK_CAP3_BIDIRECTIONAL | ATTNCHECK_CAP3_RIGHT_WINDOW,
  };
  return (const attncheck_plugin_v1*)&table;
}
