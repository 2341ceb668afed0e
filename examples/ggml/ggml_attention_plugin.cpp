// ggml's CPU flash attention (ggml_flash_attn_ext) as an attncheck plug-in: K and V as float32, float16 or in ggml's
// q8_0, q4_0, q4_1, q5_0 and q5_1 blocks (llama.cpp's -ctk/-ctv), Q as float32, one graph per call on one thread.
//
// ggml is not a Debian package: examples/CMakeLists.txt builds this only when ATTNCHECK_GGML_SOURCE names a ggml
// source tree (docs/ggml.md says how). What this plug-in declares is what ggml's kernel is asked to do here:
//   - the causal rule at either alignment, key padding and a left window, all through ggml's float16 mask, whose
//     -inf cells the kernel skips; sinks (ggml_flash_attn_ext_add_sinks); a softcap (logit_softcap); GQA (ggml
//     broadcasts kv head h / (H / H_kv)); a V head dimension of its own;
//   - its compute precision: with a block-quantised K, ggml quantises each row of Q to Q8_0 (Q8_1 for Q4_1 and
//     Q5_1) blocks for the dot (ATTNCHECK_CAP4_Q_DOT_GGML_Q8, tolerance.cpp step 12b).
// A float16 call passes its K and V to ggml as GGML_TYPE_F16 (Q converted to float32, exactly), a float32 call as
// GGML_TYPE_F32; the output, float32 in ggml, is rounded to the call's dtype.
#include <attncheck/plugin.h>
#include <ggml-cpu.h>
#include <ggml.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

namespace {

float load(const attncheck_tensor_in& t, uint32_t dtype, int64_t b, int64_t h, int64_t i, int64_t d) {
  const int64_t at = b * t.strides[0] + h * t.strides[1] + i * t.strides[2] + d * t.strides[3];
  if (dtype == ATTNCHECK_DTYPE_F32) return static_cast<const float*>(t.data)[at];
  return ggml_fp16_to_fp32(static_cast<const ggml_fp16_t*>(t.data)[at]);
}

void store(const attncheck_tensor_out& t, uint32_t dtype, int64_t b, int64_t h, int64_t i, int64_t d, float x) {
  const int64_t at = b * t.strides[0] + h * t.strides[1] + i * t.strides[2] + d * t.strides[3];
  if (dtype == ATTNCHECK_DTYPE_F32)
    static_cast<float*>(t.data)[at] = x;
  else
    static_cast<ggml_fp16_t*>(t.data)[at] = ggml_fp32_to_fp16(x);
}

ggml_type ggml_type_of(uint32_t format) {
  switch (format) {
    case ATTNCHECK_QFMT_GGML_Q8_0:
      return GGML_TYPE_Q8_0;
    case ATTNCHECK_QFMT_GGML_Q4_0:
      return GGML_TYPE_Q4_0;
    case ATTNCHECK_QFMT_GGML_Q4_1:
      return GGML_TYPE_Q4_1;
    case ATTNCHECK_QFMT_GGML_Q5_0:
      return GGML_TYPE_Q5_0;
    case ATTNCHECK_QFMT_GGML_Q5_1:
      return GGML_TYPE_Q5_1;
    default:
      return GGML_TYPE_COUNT;
  }
}

// Fills ggml tensor `t` ([D, T_k, H_kv, B] in ggml's order) from the call's K or V.
void fill_kv(ggml_tensor* t, const attncheck_tensor_in& x, const attncheck_quant_tensor* q, uint32_t dtype) {
  const int64_t D = t->ne[0], T = t->ne[1], H = t->ne[2], B = t->ne[3];
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t j = 0; j < T; ++j) {
        char* row = static_cast<char*>(t->data) + j * t->nb[1] + h * t->nb[2] + b * t->nb[3];
        if (q) {  // the blocks as ggml stores them, one row of D / 32
          const std::size_t block = ggml_type_size(t->type);
          for (int64_t n = 0; n < D / 32; ++n)
            std::memcpy(row + n * block,
                        q->codes + b * q->strides[0] + h * q->strides[1] + j * q->strides[2] + n * q->strides[3],
                        block);
        } else if (t->type == GGML_TYPE_F32) {
          for (int64_t d = 0; d < D; ++d) reinterpret_cast<float*>(row)[d] = load(x, dtype, b, h, j, d);
        } else {
          for (int64_t d = 0; d < D; ++d)
            reinterpret_cast<ggml_fp16_t*>(row)[d] = static_cast<const ggml_fp16_t*>(
                x.data)[b * x.strides[0] + h * x.strides[1] + j * x.strides[2] + d * x.strides[3]];
        }
      }
}

// Whether query i of batch entry b sees key j under the call's causal rule, padding and window.
bool visible(const attncheck_call* c, int64_t b, int64_t i, int64_t j) {
  const int64_t T_q = c->q.shape[2], T_k = c->k.shape[2];
  const int64_t p = c->alignment == ATTNCHECK_ALIGN_BOTTOM_RIGHT ? i + T_k - T_q : i;
  if (c->key_lengths && j >= c->key_lengths[b]) return false;
  if (j > p) return false;
  return c->window < 0 || j >= p - c->window;
}

int32_t forward(const attncheck_call* c, char* message, size_t message_size) {
  const int64_t B = c->q.shape[0], H = c->q.shape[1], T_q = c->q.shape[2], D = c->q.shape[3];
  const int64_t H_kv = c->k.shape[1], T_k = c->k.shape[2], D_v = c->v.shape[3];
  const attncheck_quant_kv* quant = c->quant;
  ggml_type k_type = c->dtype == ATTNCHECK_DTYPE_F32 ? GGML_TYPE_F32 : GGML_TYPE_F16, v_type = k_type;
  if (quant) {
    k_type = ggml_type_of(quant->k.format);
    v_type = ggml_type_of(quant->v.format);
    if (k_type == GGML_TYPE_COUNT || v_type == GGML_TYPE_COUNT || D % 32 != 0 || D_v % 32 != 0) {
      std::snprintf(message, message_size, "ggml: K and V in ggml's blocks only, with D and D_v multiples of 32");
      return ATTNCHECK_UNSUPPORTED;
    }
  }
  const std::size_t bytes = ggml_row_size(GGML_TYPE_F32, D) * std::size_t(T_q * H * B) +
                            ggml_row_size(k_type, D) * std::size_t(T_k * H_kv * B) +
                            ggml_row_size(v_type, D_v) * std::size_t(T_k * H_kv * B) +
                            ggml_row_size(GGML_TYPE_F16, T_k) * std::size_t(T_q * B) + std::size_t(H) * 4 +
                            ggml_row_size(GGML_TYPE_F32, D_v) * std::size_t(T_q * H * B) +
                            4 * ggml_tensor_overhead() * 8 + ggml_graph_overhead() + (std::size_t(8) << 20);
  ggml_init_params params{bytes, nullptr, false};
  ggml_context* ctx = ggml_init(params);
  if (!ctx) {
    std::snprintf(message, message_size, "ggml: ggml_init could not allocate %zu bytes", bytes);
    return ATTNCHECK_ERROR;
  }
  ggml_tensor* q = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, D, T_q, H, B);
  ggml_tensor* k = ggml_new_tensor_4d(ctx, k_type, D, T_k, H_kv, B);
  ggml_tensor* v = ggml_new_tensor_4d(ctx, v_type, D_v, T_k, H_kv, B);
  ggml_tensor* mask = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, T_k, T_q, 1, B);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < T_q; ++i)
        for (int64_t d = 0; d < D; ++d)
          static_cast<float*>(q->data)[((b * H + h) * T_q + i) * D + d] = load(c->q, c->dtype, b, h, i, d);
  fill_kv(k, c->k, quant ? &quant->k : nullptr, c->dtype);
  fill_kv(v, c->v, quant ? &quant->v : nullptr, c->dtype);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < T_q; ++i)
      for (int64_t j = 0; j < T_k; ++j)
        static_cast<ggml_fp16_t*>(mask->data)[(b * T_q + i) * T_k + j] =
            ggml_fp32_to_fp16(visible(c, b, i, j) ? 0.0f : -INFINITY);
  const float scale = c->has_scale ? float(c->scale) : 1.0f / std::sqrt(float(D));
  ggml_tensor* out = ggml_flash_attn_ext(ctx, q, k, v, mask, scale, 0.0f, float(c->softcap));
  ggml_flash_attn_ext_set_prec(out, GGML_PREC_F32);
  if (c->sinks) {
    ggml_tensor* sinks = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, H);
    for (int64_t h = 0; h < H; ++h) static_cast<float*>(sinks->data)[h] = float(c->sinks[h]);
    ggml_flash_attn_ext_add_sinks(out, sinks);
  }
  ggml_cgraph* graph = ggml_new_graph(ctx);
  ggml_build_forward_expand(graph, out);
  if (ggml_graph_compute_with_ctx(ctx, graph, 1) != GGML_STATUS_SUCCESS) {
    ggml_free(ctx);
    std::snprintf(message, message_size, "ggml: ggml_graph_compute_with_ctx failed");
    return ATTNCHECK_ERROR;
  }
  // The result is [D_v, H, T_q, B] (ggml's permute(0, 2, 1, 3)).
  const float* o = static_cast<const float*>(out->data);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < T_q; ++i)
        for (int64_t d = 0; d < D_v; ++d) store(c->output, c->dtype, b, h, i, d, o[((b * T_q + i) * H + h) * D_v + d]);
  ggml_free(ctx);
  return ATTNCHECK_OK;
}

}  // namespace

extern "C" ATTNCHECK_PLUGIN_EXPORT const attncheck_plugin_v1* attncheck_plugin(void) {
  // C++ wants designators in declaration order, so the version and the size are set where they are declared
  // rather than by ATTNCHECK_PLUGIN_V4_HEADER.
  static const attncheck_plugin_v4 table = {
      .abi_version = ATTNCHECK_PLUGIN_ABI_V4,
      .dtypes = ATTNCHECK_DTYPE_F32 | ATTNCHECK_DTYPE_F16,
      .alignments = ATTNCHECK_ALIGN_TOP_LEFT | ATTNCHECK_ALIGN_BOTTOM_RIGHT,
      .flags = ATTNCHECK_CAP_CUSTOM_SCALE | ATTNCHECK_CAP_CROSS_LENGTHS | ATTNCHECK_CAP_GQA |
               ATTNCHECK_CAP_KEY_LENGTHS | ATTNCHECK_CAP_WINDOW,
      .max_T = 0,
      .name = "ggml-cpu-flash-attn",
      .description = "ggml_flash_attn_ext on the CPU backend, K and V float or in ggml's blocks, one thread",
      .forward = forward,
      .empty_rows = ATTNCHECK_EMPTY_ROWS_ZERO,
      .flags3 = ATTNCHECK_CAP3_SINKS | ATTNCHECK_CAP3_SOFTCAP | ATTNCHECK_CAP3_V_HEAD_DIM | ATTNCHECK_CAP3_STRIDED |
                ATTNCHECK_CAP3_DETERMINISTIC,
      .table_size = ATTNCHECK_PLUGIN_V4_SIZE,
      .flags4 = ATTNCHECK_CAP4_KV_GGML_Q8_0 | ATTNCHECK_CAP4_KV_GGML_Q4_0 | ATTNCHECK_CAP4_KV_GGML_Q4_1 |
                ATTNCHECK_CAP4_KV_GGML_Q5_0 | ATTNCHECK_CAP4_KV_GGML_Q5_1 | ATTNCHECK_CAP4_Q_DOT_GGML_Q8,
  };
  return reinterpret_cast<const attncheck_plugin_v1*>(&table);
}
