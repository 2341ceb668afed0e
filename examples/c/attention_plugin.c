/* A C attention plug-in for attncheck (ABI 3): naive causal attention in double precision for float32,
 * float64 and bfloat16, with grouped-query heads, key padding, a sliding window and a backward pass. Built
 * five times: as is (correct); with -DBUG_MASK_FILL_ZERO, the source card's mistake of filling masked scores
 * with 0 instead of -inf, which attncheck must catch; with -DEMPTY_ROWS_NAN, correct but returning NaN for a
 * query that sees no key, as PyTorch's math path does (the `nan` convention, declared in its table); with
 * -DDECLARED, correct within what it declares (ABI 3): head dimensions a multiple of 8 up to 128, T_q <= T_k
 * only (cache positions are never negative), and rows that see no key unspecified (they get uniform weights
 * over every key, as Hugging Face's fully padded rows do), answering UNSUPPORTED outside that; with
 * -DBUG_DECLARED_TOO_MUCH, the same but declaring every multiple of 8 while it handles only multiples of 16:
 * an UNSUPPORTED answer to a declared shape is a finding. */
#include <attncheck/plugin.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
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
    if (x != x) { /* NaN: keep it a NaN (rounding could carry it into an Inf) */
      ((uint16_t*)t->data)[at] = (uint16_t)((bits >> 16) | 0x40u);
      return;
    }
    bits += 0x7FFFu + ((bits >> 16) & 1u);
    ((uint16_t*)t->data)[at] = (uint16_t)(bits >> 16);
  }
}

/* The keys query i of batch entry b sees: lo <= j <= hi (none when hi < lo). Its aligned position p is i, or
 * i + T_k - T_q bottom-right; it sees j <= p, j < key_lengths[b] (padding) and j >= p - window. */
static void visible(const attncheck_call* call, int64_t b, int64_t i, int64_t* lo, int64_t* hi) {
  const int64_t Tq = call->q.shape[2], Tk = call->k.shape[2];
  const int64_t p = i + (call->alignment == ATTNCHECK_ALIGN_BOTTOM_RIGHT ? Tk - Tq : 0);
  *hi = p < Tk - 1 ? p : Tk - 1;
  if (call->key_lengths && *hi > call->key_lengths[b] - 1) *hi = call->key_lengths[b] - 1;
  *lo = call->window >= 0 && p - call->window > 0 ? p - call->window : 0;
}

/* The weights of query i over all T_k keys into w (exactly 0 for keys it does not see; all 0, or NaN with
 * -DEMPTY_ROWS_NAN, when it sees none). Query head h reads kv head h / (H / H_kv). */
static void softmax_row(const attncheck_call* call, int64_t b, int64_t h, int64_t i, double scale, double* w) {
  const int64_t H = call->q.shape[1], Hkv = call->k.shape[1], D = call->q.shape[3], Tk = call->k.shape[2];
  const int64_t g = h / (H / Hkv);
  int64_t lo, hi;
  double max = -INFINITY, sum = 0;
  visible(call, b, i, &lo, &hi);
  for (int64_t j = 0; j < Tk; ++j) {
    double s = 0;
    for (int64_t d = 0; d < D; ++d) s += load(&call->q, call->dtype, b, h, i, d) * load(&call->k, call->dtype, b, g, j, d);
#ifdef BUG_MASK_FILL_ZERO
    w[j] = lo <= j && j <= hi ? s * scale : 0.0; /* BUG: a masked score of 0 still gets weight exp(0 - max) */
#else
    w[j] = lo <= j && j <= hi ? s * scale : -INFINITY; /* exp(-inf) = 0: a hidden key gets exactly 0 */
#endif
    if (w[j] > max) max = w[j];
  }
  /* Subtract the row max so exp never overflows. */
  for (int64_t j = 0; j < Tk; ++j) {
    w[j] = max == -INFINITY ? 0.0 : exp(w[j] - max);
    sum += w[j];
  }
  for (int64_t j = 0; j < Tk; ++j) {
#ifdef EMPTY_ROWS_NAN
    w[j] = w[j] / sum; /* 0/0 = NaN for a row that sees no key, as softmax over an all -inf row gives */
#elif defined(DECLARED) || defined(BUG_DECLARED_TOO_MUCH)
    w[j] = sum > 0 ? w[j] / sum : 1.0 / (double)Tk; /* unspecified (declared): uniform over every key */
#else
    w[j] = sum > 0 ? w[j] / sum : 0.0;
#endif
  }
}

static double scale_of(const attncheck_call* call) {
  return call->has_scale ? call->scale : 1.0 / sqrt((double)call->q.shape[3]);
}

/* q [B,H,T_q,D], k and v [B,H_kv,T_k,D] -> output [B,H,T_q,D], weights [B,H,T_q,T_k]. */
static int32_t forward(const attncheck_call* call, char* message, size_t message_size) {
  const int64_t B = call->q.shape[0], H = call->q.shape[1], Tq = call->q.shape[2], D = call->q.shape[3];
  const int64_t Hkv = call->k.shape[1], Tk = call->k.shape[2];
  double w[4096];
  if (Tk > 4096) {
    snprintf(message, message_size, "T_k = %lld is more than the 4096 this example handles", (long long)Tk);
    return ATTNCHECK_UNSUPPORTED;
  }
#if defined(DECLARED) || defined(BUG_DECLARED_TOO_MUCH)
#ifdef BUG_DECLARED_TOO_MUCH
  const int64_t step = 16; /* BUG: the table says 8 */
#else
  const int64_t step = 8;
#endif
  if (D % step != 0 || D > 128 || Tq > Tk) {
    snprintf(message, message_size, "D = %lld, T_q = %lld, T_k = %lld: only D a multiple of %lld up to 128 and T_q <= T_k",
             (long long)D, (long long)Tq, (long long)Tk, (long long)step);
    return ATTNCHECK_UNSUPPORTED;
  }
#endif
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < Tq; ++i) {
        int64_t lo, hi;
        softmax_row(call, b, h, i, scale_of(call), w);
        if (call->weights)
          for (int64_t j = 0; j < Tk; ++j) store(call->weights, call->dtype, b, h, i, j, w[j]);
        /* Only visible keys enter P·V: 0 · v would still turn an Inf or NaN in a hidden value into NaN. */
        visible(call, b, i, &lo, &hi);
#ifdef BUG_MASK_FILL_ZERO
        lo = 0;
        hi = Tk - 1;
#endif
#if defined(DECLARED) || defined(BUG_DECLARED_TOO_MUCH)
        if (hi < lo) { /* a row that sees no key: its uniform weights over every key enter P·V */
          lo = 0;
          hi = Tk - 1;
        }
#endif
        for (int64_t d = 0; d < D; ++d) {
          double o = 0;
          for (int64_t j = lo; j <= hi; ++j) o += w[j] * load(&call->v, call->dtype, b, h / (H / Hkv), j, d);
#ifdef EMPTY_ROWS_NAN
          if (hi < lo) o = NAN;
#endif
          store(&call->output, call->dtype, b, h, i, d, o);
        }
      }
  return ATTNCHECK_OK;
}

#if !defined(BUG_MASK_FILL_ZERO) && !defined(EMPTY_ROWS_NAN) && !defined(DECLARED) && \
    !defined(BUG_DECLARED_TOO_MUCH) /* the variants are forward-only */
/* The gradients of L = sum(O ∘ dO), row by row: with P the weights of query i, dP_j = dO_i · v_j,
 * Δ = Σ_j P_j dP_j (= dO_i · O_i), dS_j = P_j (dP_j − Δ); dQ_i = scale Σ_j dS_j k_j, dK_j += scale dS_j q_i,
 * dV_j += P_j dO_i. A kv head accumulates over every query head of its group, in double. */
static int32_t backward(const attncheck_backward_call* bc, char* message, size_t message_size) {
  const attncheck_call* call = bc->forward;
  const int64_t B = call->q.shape[0], H = call->q.shape[1], Tq = call->q.shape[2], D = call->q.shape[3];
  const int64_t Hkv = call->k.shape[1], Tk = call->k.shape[2], group = H / Hkv;
  const double scale = scale_of(call);
  double w[4096];
  double* dk = malloc(sizeof(double) * (size_t)(Tk * D));
  double* dv = malloc(sizeof(double) * (size_t)(Tk * D));
  double* dq = malloc(sizeof(double) * (size_t)D);
  int32_t status = ATTNCHECK_OK;
  if (Tk > 4096 || !dk || !dv || !dq) {
    snprintf(message, message_size, "T_k = %lld: more than 4096, or out of memory", (long long)Tk);
    status = Tk > 4096 ? ATTNCHECK_UNSUPPORTED : ATTNCHECK_ERROR;
  }
  for (int64_t b = 0; b < B && status == ATTNCHECK_OK; ++b)
    for (int64_t g = 0; g < Hkv; ++g) {
      memset(dk, 0, sizeof(double) * (size_t)(Tk * D));
      memset(dv, 0, sizeof(double) * (size_t)(Tk * D));
      for (int64_t h = g * group; h < (g + 1) * group; ++h)
        for (int64_t i = 0; i < Tq; ++i) {
          int64_t lo, hi;
          double delta = 0;
          softmax_row(call, b, h, i, scale, w);
          visible(call, b, i, &lo, &hi);
          for (int64_t j = lo; j <= hi; ++j) {
            double dp = 0;
            for (int64_t d = 0; d < D; ++d)
              dp += load(&bc->d_output, call->dtype, b, h, i, d) * load(&call->v, call->dtype, b, g, j, d);
            delta += w[j] * dp;
          }
          memset(dq, 0, sizeof(double) * (size_t)D);
          for (int64_t j = lo; j <= hi; ++j) {
            double dp = 0;
            for (int64_t d = 0; d < D; ++d)
              dp += load(&bc->d_output, call->dtype, b, h, i, d) * load(&call->v, call->dtype, b, g, j, d);
            const double ds = w[j] * (dp - delta);
            for (int64_t d = 0; d < D; ++d) {
              dq[d] += scale * ds * load(&call->k, call->dtype, b, g, j, d);
              dk[j * D + d] += scale * ds * load(&call->q, call->dtype, b, h, i, d);
              dv[j * D + d] += w[j] * load(&bc->d_output, call->dtype, b, h, i, d);
            }
          }
          for (int64_t d = 0; d < D; ++d) store(&bc->dq, call->dtype, b, h, i, d, dq[d]);
        }
      for (int64_t j = 0; j < Tk; ++j)
        for (int64_t d = 0; d < D; ++d) {
          store(&bc->dk, call->dtype, b, g, j, d, dk[j * D + d]);
          store(&bc->dv, call->dtype, b, g, j, d, dv[j * D + d]);
        }
    }
  free(dk);
  free(dv);
  free(dq);
  return status;
}
#endif

ATTNCHECK_PLUGIN_EXPORT const attncheck_plugin_v1* attncheck_plugin(void) {
  static const attncheck_plugin_v3 table = {
      .abi_version = ATTNCHECK_PLUGIN_ABI_VERSION,
      .dtypes = ATTNCHECK_DTYPE_F32 | ATTNCHECK_DTYPE_F64 | ATTNCHECK_DTYPE_BF16,
      .alignments = ATTNCHECK_ALIGN_TOP_LEFT | ATTNCHECK_ALIGN_BOTTOM_RIGHT,
#if defined(BUG_MASK_FILL_ZERO)
      /* A fused kernel that returns only outputs: attncheck recovers its weights by one-hot probing. */
      .flags = ATTNCHECK_CAP_CUSTOM_SCALE | ATTNCHECK_CAP_CROSS_LENGTHS,
      .name = "c-example-mask-fill-zero",
      .description = "naive C attention with masked scores filled with 0 (the bug attncheck must find)",
#elif defined(DECLARED) || defined(BUG_DECLARED_TOO_MUCH)
      .flags = ATTNCHECK_CAP_RETURNS_WEIGHTS | ATTNCHECK_CAP_CUSTOM_SCALE | ATTNCHECK_CAP_CROSS_LENGTHS |
               ATTNCHECK_CAP_NONFINITE_SAFE | ATTNCHECK_CAP_GQA | ATTNCHECK_CAP_KEY_LENGTHS | ATTNCHECK_CAP_WINDOW,
#ifdef BUG_DECLARED_TOO_MUCH
      .name = "c-example-declared-too-much",
      .description = "naive C attention declaring every D a multiple of 8, handling only multiples of 16",
#else
      .name = "c-example-declared",
      .description = "naive C attention for D a multiple of 8 up to 128, T_q <= T_k, empty rows unspecified",
#endif
      .empty_rows = ATTNCHECK_EMPTY_ROWS_ANY,
      .cross_lengths = ATTNCHECK_CROSS_Q_LE_K,
      .head_dim_multiple = 8,
      .max_head_dim = 128,
#elif defined(EMPTY_ROWS_NAN)
      .flags = ATTNCHECK_CAP_RETURNS_WEIGHTS | ATTNCHECK_CAP_CUSTOM_SCALE | ATTNCHECK_CAP_CROSS_LENGTHS |
               ATTNCHECK_CAP_NONFINITE_SAFE | ATTNCHECK_CAP_GQA | ATTNCHECK_CAP_KEY_LENGTHS | ATTNCHECK_CAP_WINDOW,
      .name = "c-example-empty-rows-nan",
      .description = "naive C attention, NaN for a query that sees no key",
      .empty_rows = ATTNCHECK_EMPTY_ROWS_NAN,
#else
      .flags = ATTNCHECK_CAP_RETURNS_WEIGHTS | ATTNCHECK_CAP_CUSTOM_SCALE | ATTNCHECK_CAP_CROSS_LENGTHS |
               ATTNCHECK_CAP_NONFINITE_SAFE | ATTNCHECK_CAP_GQA | ATTNCHECK_CAP_KEY_LENGTHS | ATTNCHECK_CAP_WINDOW,
      .name = "c-example",
      .description = "naive C attention, double accumulation, with a backward pass",
      .empty_rows = ATTNCHECK_EMPTY_ROWS_ZERO,
      .backward = backward,
#endif
      .max_T = 4096,
      .forward = forward,
  };
  return (const attncheck_plugin_v1*)&table;
}
