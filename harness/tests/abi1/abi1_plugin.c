/* FROZEN: examples/c/attention_plugin.c as it was under ABI 1, built against the frozen ABI-1 header beside it
 * (harness/tests/abi1/attncheck/plugin.h), never edited: it stands for a plug-in built before ABI 2, which
 * must keep loading and holding every law. Do not update it with the example or the header. */
#include <attncheck/plugin.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

/* Element (b,h,i,d) of a tensor, widened to double. bfloat16 is the top half of a float32's bits. */
static double load(const attncheck_tensor_in* t, uint32_t dtype, int64_t b, int64_t h, int64_t i, int64_t d) {
  const int64_t at = b * t->strides[0] + h * t->strides[1] + i * t->strides[2] + d * t->strides[3];
  if (dtype == ATTNCHECK_DTYPE_F64) return ((const double*)t->data)[at];
  if (dtype == ATTNCHECK_DTYPE_F32) return ((const float*)t->data)[at];
  uint32_t bits = (uint32_t)((const uint16_t*)t->data)[at] << 16;
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

/* Rounds x to the tensor's dtype and stores it (bfloat16: round to nearest even on the float32 bits). */
static void store(const attncheck_tensor_out* t, uint32_t dtype, int64_t b, int64_t h, int64_t i, int64_t d, double x) {
  const int64_t at = b * t->strides[0] + h * t->strides[1] + i * t->strides[2] + d * t->strides[3];
  if (dtype == ATTNCHECK_DTYPE_F64) {
    ((double*)t->data)[at] = x;
  } else if (dtype == ATTNCHECK_DTYPE_F32) {
    ((float*)t->data)[at] = (float)x;
  } else {
    const float f = (float)x;
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    bits += 0x7FFFu + ((bits >> 16) & 1u);
    ((uint16_t*)t->data)[at] = (uint16_t)(bits >> 16);
  }
}

/* q [B,H,T_q,D], k and v [B,H,T_k,D] -> output [B,H,T_q,D], weights [B,H,T_q,T_k]. */
static int32_t forward(const attncheck_call* call, char* message, size_t message_size) {
  const int64_t B = call->q.shape[0], H = call->q.shape[1], Tq = call->q.shape[2], D = call->q.shape[3];
  const int64_t Tk = call->k.shape[2];
  const double scale = call->has_scale ? call->scale : 1.0 / sqrt((double)D);
  /* Bottom-right alignment shifts the diagonal so the last query sees the last key. */
  const int64_t shift = call->alignment == ATTNCHECK_ALIGN_BOTTOM_RIGHT ? Tk - Tq : 0;
  double scores[4096];
  if (Tk > 4096) {
    snprintf(message, message_size, "T_k = %lld is more than the 4096 this example handles", (long long)Tk);
    return ATTNCHECK_UNSUPPORTED;
  }
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < Tq; ++i) {
        const int64_t last = i + shift; /* the last key query i may see */
        double max = -INFINITY, sum = 0;
        for (int64_t j = 0; j < Tk; ++j) {
          double s = 0;
          for (int64_t d = 0; d < D; ++d)
            s += load(&call->q, call->dtype, b, h, i, d) * load(&call->k, call->dtype, b, h, j, d);
#ifdef BUG_MASK_FILL_ZERO
          scores[j] = j <= last ? s * scale : 0.0; /* BUG: a masked score of 0 still gets weight exp(0 - max) */
#else
          scores[j] = j <= last ? s * scale : -INFINITY; /* exp(-inf) = 0: a future key gets exactly 0 */
#endif
          if (scores[j] > max) max = scores[j];
        }
        /* Subtract the row max so exp never overflows; a row that sees no key gets zero weights. */
        for (int64_t j = 0; j < Tk; ++j) {
          scores[j] = max == -INFINITY ? 0.0 : exp(scores[j] - max);
          sum += scores[j];
        }
        for (int64_t j = 0; j < Tk; ++j) {
          scores[j] = sum > 0 ? scores[j] / sum : 0.0;
          if (call->weights) store(call->weights, call->dtype, b, h, i, j, scores[j]);
        }
        /* Only visible keys enter P·V: 0 · v would still turn an Inf or NaN in a future value into NaN. */
#ifdef BUG_MASK_FILL_ZERO
        const int64_t end = Tk;
#else
        const int64_t end = last + 1 < 0 ? 0 : last + 1 > Tk ? Tk : last + 1;
#endif
        for (int64_t d = 0; d < D; ++d) {
          double o = 0;
          for (int64_t j = 0; j < end; ++j) o += scores[j] * load(&call->v, call->dtype, b, h, j, d);
          store(&call->output, call->dtype, b, h, i, d, o);
        }
      }
  return ATTNCHECK_OK;
}

ATTNCHECK_PLUGIN_EXPORT const attncheck_plugin_v1* attncheck_plugin(void) {
  static const attncheck_plugin_v1 table = {
      .abi_version = ATTNCHECK_PLUGIN_ABI_VERSION,
      .dtypes = ATTNCHECK_DTYPE_F32 | ATTNCHECK_DTYPE_F64 | ATTNCHECK_DTYPE_BF16,
      .alignments = ATTNCHECK_ALIGN_TOP_LEFT | ATTNCHECK_ALIGN_BOTTOM_RIGHT,
#ifdef BUG_MASK_FILL_ZERO
      /* A fused kernel that returns only outputs: attncheck recovers its weights by one-hot probing. */
      .flags = ATTNCHECK_CAP_CUSTOM_SCALE | ATTNCHECK_CAP_CROSS_LENGTHS,
      .name = "c-example-mask-fill-zero",
      .description = "naive C attention with masked scores filled with 0 (the bug attncheck must find)",
#else
      .flags = ATTNCHECK_CAP_RETURNS_WEIGHTS | ATTNCHECK_CAP_CUSTOM_SCALE | ATTNCHECK_CAP_CROSS_LENGTHS |
               ATTNCHECK_CAP_NONFINITE_SAFE,
      .name = "c-example",
      .description = "naive C attention, double accumulation",
#endif
      .max_T = 4096,
      .forward = forward,
  };
  return &table;
}
