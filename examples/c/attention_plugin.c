/* A C attention plug-in for attncheck (ABI 3): naive causal attention in double precision for float32,
 * float64 and bfloat16, with grouped-query heads, key padding, a sliding window and a backward pass. Built
 * five times: as is (correct); with -DBUG_MASK_FILL_ZERO, the source card's mistake of filling masked scores
 * with 0 instead of -inf, which attncheck must catch; with -DEMPTY_ROWS_NAN, correct but returning NaN for a
 * query that sees no key, as PyTorch's math path does (the `nan` convention, declared in its table); with
 * -DDECLARED, correct within what it declares (ABI 3): head dimensions a multiple of 8 up to 128, T_q <= T_k
 * only (cache positions are never negative), and rows that see no key unspecified (they get uniform weights
 * over every key, as Hugging Face's fully padded rows do), answering UNSUPPORTED outside that; with
 * -DBUG_DECLARED_TOO_MUCH, the same but declaring every multiple of 8 while it handles only multiples of 16:
 * an UNSUPPORTED answer to a declared shape is a finding; with -DBUG_CONTIGUOUS_READS, declaring strided inputs
 * (ATTNCHECK_CAP3_STRIDED, as the plain build does) but reading every input as contiguous [B,H,T,D]; with -DMODIFIERS, correct and declaring ABI 3's
 * score modifiers (softcap, ALiBi, sinks, with d_sinks in the backward), causal = 0 and the LSE; with -DPAGED,
 * correct, forward only, and declaring paged K and V (ATTNCHECK_CAP3_PAGED: token-major and head-major pages of
 * 1, 8, 16, 64 or 256 keys), which it reads only through the block table, key by key; with -DMASKS, correct,
 * with a backward pass, and declaring the masks beyond causal (packed documents through q_doc_ids and
 * k_doc_ids, the queries' ids their own, each document aligned on its own lengths; chunked local attention, a
 * bidirectional prefix, a right window) and causal = 0; with -DBLOCK_MASKS,
 * correct, with a backward pass, and declaring block masks and dense masks (call->block_mask's kinds and partial
 * cells, call->dense_mask's cells, read through their strides, 0 broadcasting) and causal = 0; with -DABI4, the
 * plain build's table as an ABI-4 one, declaring ABI 4's additive bias too (call->bias, forward and backward), its
 * gradient (backward_call->d_bias), per-query temperatures (call->temperature), rotary embeddings in both
 * pairings (call->rope), QK-norm (call->qk_norm), dropout (call->dropout: a keep mask from Random123's Philox,
 * one counter per cell within a head, the head in the counter's last word) and quantised K and V caches
 * (call->quant: FP8 e4m3fn and e5m2 and int8 codes, per tensor, kv head or token, with int8 zero points, and
 * ggml's q8_0, q4_0, q4_1, q5_0 and q5_1 blocks), selected keys (call->index_list) and trees of draft tokens
 * (call->tree: parent arrays, and packed bitmasks in either bit order); with -DABI4 -DPAGED, a paged call's index
 * lists as slots of the pool too (ATTNCHECK_INDEX_PHYSICAL).
 * Every build honours
 * the modifiers' fields, the masks' fields and a paged call; without -DMODIFIERS, -DMASKS, -DBLOCK_MASKS or
 * -DPAGED attncheck sends only their neutral values (no paged call, no block or dense mask). No build reads a key the query does not see (but the buggy one, which reads every key). */
#include <attncheck/plugin.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef ABI4
#include <Random123/philox.h>
#endif

/* Element (b,h,i,d) of a tensor, widened to double. bfloat16 is the top half of a float32's bits. */
static double load(const attncheck_tensor_in* t, uint32_t dtype, int64_t b, int64_t h, int64_t i, int64_t d) {
#ifdef BUG_CONTIGUOUS_READS /* the strides unread: right for contiguous [B,H,T,D] inputs only */
  const int64_t at = ((b * t->shape[1] + h) * t->shape[2] + i) * t->shape[3] + d;
#else
  const int64_t at = b * t->strides[0] + h * t->strides[1] + i * t->strides[2] + d * t->strides[3];
#endif
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

/* Element (b,g,j,d) of K (which = 0) or V (which = 1): from the tensor, or in a paged call through the block
 * table: key j of sequence b lies in page block_table[b * block_table_stride + j / page_size], slot
 * j % page_size, at (page, slot, g, d) of a token-major pool or (page, g, slot, d) of a head-major one. Only keys
 * j < key_lengths[b] are ever asked for: the pool's other slots and the table's other entries hold anything. */
#ifdef ABI4
/* The value of a quantised cache's byte (ATTNCHECK_QFMT_*): e4m3fn S.EEEE.MMM (bias 7, no infinities), e5m2
 * S.EEEEE.MM (bias 15), int8 two's complement. attncheck never sends a NaN or infinite code. */
static double quant_code_value(uint32_t format, uint8_t code) {
  if (format == ATTNCHECK_QFMT_INT8) return (double)(int8_t)code;
  const int man = format == ATTNCHECK_QFMT_E4M3FN ? 3 : 2, bias = format == ATTNCHECK_QFMT_E4M3FN ? 7 : 15;
  const int e = (code & 0x7F) >> man, m = code & ((1 << man) - 1);
  const double mag = e == 0 ? ldexp((double)m, 1 - bias - man) : ldexp((double)((1 << man) + m), e - bias - man);
  return code & 0x80 ? -mag : mag;
}

/* A little-endian float16 at p, widened. */
static double half_at(const uint8_t* p) {
  const unsigned h = (unsigned)p[0] | ((unsigned)p[1] << 8), e = (h >> 10) & 0x1F, m = h & 0x3FF;
  const double mag = e == 0 ? ldexp((double)m, -24) : ldexp((double)(m | 0x400), (int)e - 25);
  return h & 0x8000 ? -mag : mag; /* attncheck sends no infinite or NaN scale */
}

/* Element d of a row of ggml's blocks (ATTNCHECK_QFMT_GGML_*): block d/32 at `row` + (d/32)·strides[3], d (and m)
 * float16 first, then Q5's fifth bits qh (bit j element j's), then qs (element j the low nibble of byte j, j + 16
 * its high one; Q8_0: 32 int8). */
static double ggml_element(const attncheck_quant_tensor* t, const uint8_t* row, int64_t d) {
  const uint8_t* blk = row + (d / 32) * t->strides[3];
  const int j = (int)(d % 32), has_min = t->format == ATTNCHECK_QFMT_GGML_Q4_1 || t->format == ATTNCHECK_QFMT_GGML_Q5_1;
  const double scale = half_at(blk), min = has_min ? half_at(blk + 2) : 0.0;
  const uint8_t* q = blk + (has_min ? 4 : 2);
  if (t->format == ATTNCHECK_QFMT_GGML_Q8_0) return scale * (double)(int8_t)q[j];
  int n;
  if (t->format == ATTNCHECK_QFMT_GGML_Q5_0 || t->format == ATTNCHECK_QFMT_GGML_Q5_1) {
    const uint32_t qh = (uint32_t)q[0] | ((uint32_t)q[1] << 8) | ((uint32_t)q[2] << 16) | ((uint32_t)q[3] << 24);
    n = (j < 16 ? q[4 + j] & 0x0F : q[4 + j - 16] >> 4) | (int)(((qh >> j) & 1u) << 4);
    if (t->format == ATTNCHECK_QFMT_GGML_Q5_0) n -= 16;
  } else {
    n = j < 16 ? q[j] & 0x0F : q[j - 16] >> 4;
    if (t->format == ATTNCHECK_QFMT_GGML_Q4_0) n -= 8;
  }
  return scale * (double)n + min;
}

/* Element (b,g,j,d) of a quantised cache: (value(code) - zero point)·scale, its scale and zero point those of
 * (b, g, j) through the scale strides (0 over a broadcast extent); in ggml's blocks, ggml_element. */
static double dequantised(const attncheck_quant_tensor* t, int64_t b, int64_t g, int64_t j, int64_t d) {
  if (t->granularity == ATTNCHECK_QSCALE_BLOCK32)
    return ggml_element(t, t->codes + b * t->strides[0] + g * t->strides[1] + j * t->strides[2], d);
  const uint8_t code = t->codes[b * t->strides[0] + g * t->strides[1] + j * t->strides[2] + d * t->strides[3]];
  const int64_t at = b * t->scale_strides[0] + g * t->scale_strides[1] + j * t->scale_strides[2];
  const double zero = t->zero_points ? (double)t->zero_points[at] : 0.0;
  return (quant_code_value(t->format, code) - zero) * (double)t->scales[at];
}
#endif

static double kv(const attncheck_call* call, int which, int64_t b, int64_t g, int64_t j, int64_t d) {
  const attncheck_paged_kv* pk = call->paged;
#ifdef ABI4
  if (call->quant && !pk) return dequantised(which ? &call->quant->v : &call->quant->k, b, g, j, d);
#endif
  if (!pk) return load(which ? &call->v : &call->k, call->dtype, b, g, j, d);
  const int64_t page = pk->block_table[b * pk->block_table_stride + j / pk->page_size], slot = j % pk->page_size;
#ifdef ABI4
  /* Paged and quantised (ATTNCHECK_CAP4_PAGED_QUANT): quant->k and quant->v are the pools, codes and scales alike in
   * the layout's order, so a key's element is the pool's (page, slot, g, d) or (page, g, slot, d). */
  if (call->quant) {
    const attncheck_quant_tensor* t = which ? &call->quant->v : &call->quant->k;
    return pk->layout == ATTNCHECK_PAGED_TOKEN_MAJOR ? dequantised(t, page, slot, g, d) : dequantised(t, page, g, slot, d);
  }
#endif
  const attncheck_tensor_in* pool = which ? &pk->v_pages : &pk->k_pages;
  return pk->layout == ATTNCHECK_PAGED_TOKEN_MAJOR ? load(pool, call->dtype, page, slot, g, d)
                                                   : load(pool, call->dtype, page, g, slot, d);
}

/* The rope's pair of head dimension d (its first element *a, second *e and index *m), for d < rotary_dim. */
static void rope_pair(const attncheck_rope* r, int64_t d, int64_t* a, int64_t* e, int64_t* m) {
  const int64_t half = r->rotary_dim / 2;
  *m = r->variant == ATTNCHECK_ROPE_INTERLEAVED ? d / 2 : d % half;
  *a = r->variant == ATTNCHECK_ROPE_INTERLEAVED ? 2 * *m : *m;
  *e = r->variant == ATTNCHECK_ROPE_INTERLEAVED ? 2 * *m + 1 : *m + half;
}

/* The angle of pair m at token t of batch entry b: of q's positions (which 0) or k's (which 1). */
static double rope_angle(const attncheck_call* call, int which, int64_t b, int64_t t, int64_t m) {
  const attncheck_rope* r = call->rope;
  const int64_t T = which ? call->k.shape[2] : call->q.shape[2];
  const double pos = (double)(which ? r->k_positions : r->q_positions)[b * T + t];
  const double f = r->scaling_params[0], e = -2.0 * (double)m / (double)r->rotary_dim;
  if (r->scaling == ATTNCHECK_ROPE_SCALING_NTK) /* the base grown to base·f^(r/(r-2)) */
    return pos * pow(r->base * pow(f, (double)r->rotary_dim / (double)(r->rotary_dim - 2)), e);
  if (r->scaling == ATTNCHECK_ROPE_SCALING_LLAMA3) { /* Llama 3.1: by each pair's wavelength */
    const double w = pow(r->base, e), wavelen = 2 * 3.14159265358979323846 / w;
    const double lo = r->scaling_params[1], hi = r->scaling_params[2], L = r->scaling_params[3];
    if (wavelen < L / hi) return pos * w;
    if (wavelen > L / lo) return pos * w / f;
    const double s = (L / wavelen - lo) / (hi - lo);
    return pos * ((1 - s) * w / f + s * w);
  }
  return pos / (r->scaling == ATTNCHECK_ROPE_SCALING_LINEAR ? f : 1.0) * pow(r->base, e);
}

/* Element c of q (which 0) or k (which 1) as stored (ABI 4: a quantised q decoded from its codes). */
static double raw_qk(const attncheck_call* call, int which, int64_t b, int64_t h, int64_t t, int64_t c) {
  if (which) return kv(call, 0, b, h, t, c);
#ifdef ABI4
  if (call->quant && call->quant->q.codes) return dequantised(&call->quant->q, b, h, t, c);
#endif
  return load(&call->q, call->dtype, b, h, t, c);
}

/* ABI 4's QK-norm weights of q (which 0) or k (which 1), NULL for a side not normalised (or no QK-norm). */
static const double* norm_weights(const attncheck_call* call, int which) {
  if (!call->qk_norm) return NULL;
  return which ? call->qk_norm->k_weight : call->qk_norm->q_weight;
}

/* The row's r = sqrt(mean x^2 + eps) (or sqrt(mean x^2) + eps), and its sqrt(mean x^2 [+ eps]) into *s. */
static double norm_r(const attncheck_call* call, int which, int64_t b, int64_t h, int64_t t, double* s) {
  const int64_t D = call->q.shape[3];
  double ms = 0;
  for (int64_t c = 0; c < D; ++c) ms += raw_qk(call, which, b, h, t, c) * raw_qk(call, which, b, h, t, c);
  ms /= (double)D;
  if (call->qk_norm->eps_placement == ATTNCHECK_NORM_EPS_OUTSIDE) {
    *s = sqrt(ms);
    return *s + call->qk_norm->eps;
  }
  *s = sqrt(ms + call->qk_norm->eps);
  return *s;
}

/* Element c after ABI 4's QK-norm (w * x / r), as stored without one. */
static double normed_qk(const attncheck_call* call, int which, int64_t b, int64_t h, int64_t t, int64_t c) {
  const double* w = norm_weights(call, which);
  double s;
  if (!w) return raw_qk(call, which, b, h, t, c);
  return w[c] * raw_qk(call, which, b, h, t, c) / norm_r(call, which, b, h, t, &s);
}

/* Element d of q (which 0: head h, query t) or k (which 1: kv head h, key t) as the scores read it: normalised by
 * ABI 4's QK-norm (call->qk_norm), then rotated by its token's position under its rope (call->rope). */
static double qk(const attncheck_call* call, int which, int64_t b, int64_t h, int64_t t, int64_t d) {
  int64_t a, e, m;
  double theta, xa, xe;
  if (!call->rope || d >= call->rope->rotary_dim) return normed_qk(call, which, b, h, t, d);
  rope_pair(call->rope, d, &a, &e, &m);
  theta = rope_angle(call, which, b, t, m);
  xa = normed_qk(call, which, b, h, t, a);
  xe = normed_qk(call, which, b, h, t, e);
  return d == a ? xa * cos(theta) - xe * sin(theta) : xe * cos(theta) + xa * sin(theta);
}

#if !defined(BUG_MASK_FILL_ZERO) && !defined(EMPTY_ROWS_NAN) && !defined(DECLARED) && \
    !defined(BUG_DECLARED_TOO_MUCH) && !defined(PAGED) /* the builds with a backward */
/* A gradient row g[0..D) of the rotated q (which 0) or k (which 1) at token t turned back by R^T: the gradient of q
 * or k itself. */
static void rope_back(const attncheck_call* call, int which, int64_t b, int64_t t, double* g) {
  if (!call->rope) return;
  for (int64_t m = 0; m < call->rope->rotary_dim / 2; ++m) {
    int64_t a, e, mm;
    const double theta = rope_angle(call, which, b, t, m);
    rope_pair(call->rope, call->rope->variant == ATTNCHECK_ROPE_INTERLEAVED ? 2 * m : m, &a, &e, &mm);
    const double ga = g[a], ge = g[e];
    g[a] = cos(theta) * ga + sin(theta) * ge;
    g[e] = cos(theta) * ge - sin(theta) * ga;
  }
}

/* A gradient row g[0..D) of the normalised q or k row (head h, token t) turned into that of the row itself:
 * dx_c = w_c g_c / r - x_c (sum_d w_d g_d x_d) / (D s r^2). */
static void norm_back(const attncheck_call* call, int which, int64_t b, int64_t h, int64_t t, double* g) {
  const double* w = norm_weights(call, which);
  const int64_t D = call->q.shape[3];
  double s, r, dot = 0;
  if (!w) return;
  r = norm_r(call, which, b, h, t, &s);
  for (int64_t c = 0; c < D; ++c) dot += w[c] * g[c] * raw_qk(call, which, b, h, t, c);
  for (int64_t c = 0; c < D; ++c) /* a zero row with eps outside the root (s = 0): the second term is 0 */
    g[c] = w[c] * g[c] / r - (s > 0 ? raw_qk(call, which, b, h, t, c) * dot / ((double)D * s * r * r) : 0.0);
}
#endif

/* A paged call's table entries that hold keys (the first ceil(key_lengths[b] / page_size) of each sequence)
 * name pages of the pool: an ATTNCHECK_ERROR naming the first that does not. */
static int32_t check_paged(const attncheck_call* call, char* message, size_t message_size) {
  const attncheck_paged_kv* pk = call->paged;
  if (!pk) return ATTNCHECK_OK;
  if (call->k.data || call->v.data || !call->key_lengths || pk->page_size < 1 ||
      (pk->layout != ATTNCHECK_PAGED_TOKEN_MAJOR && pk->layout != ATTNCHECK_PAGED_HEAD_MAJOR)) {
    snprintf(message, message_size, "a paged call with k.data %p, v.data %p, key_lengths %p, page size %lld, layout %u",
             (const void*)call->k.data, (const void*)call->v.data, (const void*)call->key_lengths,
             (long long)pk->page_size, (unsigned)pk->layout);
    return ATTNCHECK_ERROR;
  }
  for (int64_t b = 0; b < call->q.shape[0]; ++b)
    for (int64_t n = 0; n < (call->key_lengths[b] + pk->page_size - 1) / pk->page_size; ++n) {
      const int64_t page = n < pk->max_pages ? pk->block_table[b * pk->block_table_stride + n] : -1;
      if (page < 0 || page >= pk->num_pages) {
        snprintf(message, message_size, "block_table[%lld][%lld] = %lld is not a page of the pool of %lld",
                 (long long)b, (long long)n, (long long)page, (long long)pk->num_pages);
        return ATTNCHECK_ERROR;
      }
    }
  return ATTNCHECK_OK;
}

/* [*first, *end): the run of n non-decreasing ids equal to id (empty, at where it would be, when none is). */
static void id_run(const int32_t* ids, int64_t n, int32_t id, int64_t* first, int64_t* end) {
  int64_t lo = 0, hi = n;
  while (lo < hi) { /* the first id >= id */
    const int64_t mid = lo + (hi - lo) / 2;
    if (ids[mid] < id) lo = mid + 1; else hi = mid;
  }
  *first = lo;
  for (hi = n; lo < hi;) { /* the first id > id */
    const int64_t mid = lo + (hi - lo) / 2;
    if (ids[mid] <= id) lo = mid + 1; else hi = mid;
  }
  *end = lo;
}

/* The aligned position p of query i of batch entry b: i, or i + T_k - T_q bottom-right; with documents, the same
 * inside the query's document, aligned on the document's own queries [q0, q1) and keys [k0, k1) (the query ids may
 * be their own: ATTNCHECK_CAP3_QUERY_DOCUMENTS): k0 + (i - q0), plus (k1 - k0) - (q1 - q0) bottom-right. */
static int64_t position(const attncheck_call* call, int64_t b, int64_t i) {
  const int64_t Tq = call->q.shape[2], Tk = call->k.shape[2];
  const int bottom_right = call->alignment == ATTNCHECK_ALIGN_BOTTOM_RIGHT;
  if (!call->q_doc_ids || !call->k_doc_ids) return i + (bottom_right ? Tk - Tq : 0);
  const int32_t doc = call->q_doc_ids[b * Tq + i];
  int64_t q0, q1, k0, k1;
  id_run(call->q_doc_ids + b * Tq, Tq, doc, &q0, &q1);
  id_run(call->k_doc_ids + b * Tk, Tk, doc, &k0, &k1);
  return k0 + (i - q0) + (bottom_right ? (k1 - k0) - (q1 - q0) : 0);
}

#ifdef ABI4
/* A tree node's depth in batch entry b: how many earlier nodes its row shows (its ancestors). */
static int64_t node_depth(const attncheck_tree_mask* t, int64_t b, int64_t n) {
  const int64_t P = t->prefix_lengths[b], L = P + t->nodes;
  int64_t d = 0, m;
  if (t->form == ATTNCHECK_TREE_PARENTS) {
    for (m = t->parents[b * t->nodes + n]; m >= 0; m = t->parents[b * t->nodes + m]) ++d;
    return d;
  }
  for (m = 0; m < n; ++m) {
    const int64_t c = n * L + P + m;
    d += (t->bits[t->offsets[b] + c / 8] >> (t->bit_order == ATTNCHECK_BITS_MSB_FIRST ? 7 - c % 8 : c % 8)) & 1;
  }
  return d;
}
#endif

/* Where query i sits for the window and ALiBi: its aligned position, or in a tree of draft tokens the prefix's
 * length plus the node's depth (its place in the sequence it would continue). */
static int64_t place(const attncheck_call* call, int64_t b, int64_t i) {
#ifdef ABI4
  if (call->tree) return call->tree->prefix_lengths[b] + node_depth(call->tree, b, i);
#endif
  return position(call, b, i);
}

/* Where key j sits for them: j, or a tree node's key the place of its node. */
static int64_t key_place(const attncheck_call* call, int64_t b, int64_t j) {
#ifdef ABI4
  if (call->tree) {
    const int64_t P = call->tree->prefix_lengths[b];
    if (j >= P && j < P + call->tree->nodes) return P + node_depth(call->tree, b, j - P);
  }
#endif
  return j;
}

/* floor(a / n) for n > 0, also for a negative a (a position before the first key, bottom-right). */
static int64_t floor_div(int64_t a, int64_t n) { return a >= 0 ? a / n : -((-a + n - 1) / n); }

/* The keys query i of batch entry b sees: lo <= j <= hi (none when hi < lo). At its aligned position p it
 * sees j <= p or j < prefix_length (the causal rule, unless call->causal is 0), j < key_lengths[b] (padding),
 * j >= p - window, j <= p + window_right (when >= 0), the keys of its chunk (j / chunk_size == p / chunk_size,
 * when > 0) and the keys of its document (k_doc_ids[b][j] == q_doc_ids[b][i], when given). Every family cuts
 * one range (a document's keys are contiguous: key ids are non-decreasing), so their intersection is one too. */
static void visible(const attncheck_call* call, int64_t b, int64_t i, int64_t* lo, int64_t* hi) {
  const int64_t Tk = call->k.shape[2], Tq = call->q.shape[2];
  const int64_t p = position(call, b, i);
  int64_t last = p > call->prefix_length - 1 ? p : call->prefix_length - 1; /* the causal rule with a prefix */
  *hi = last < Tk - 1 && call->causal ? last : Tk - 1;
  if (call->key_lengths && *hi > call->key_lengths[b] - 1) *hi = call->key_lengths[b] - 1;
  const int64_t wp = place(call, b, i); /* p, or a tree node's place (cells_allow cuts the nodes' keys) */
  *lo = call->window >= 0 && wp - call->window > 0 ? wp - call->window : 0;
  if (call->window_right >= 0 && call->window_right < Tk - p && *hi > p + call->window_right)
    *hi = p + call->window_right;
  if (call->chunk_size > 0) {
    const int64_t c0 = floor_div(p, call->chunk_size) * call->chunk_size;
    if (*lo < c0) *lo = c0;
    if (c0 < Tk && call->chunk_size < Tk - c0 && *hi > c0 + call->chunk_size - 1) *hi = c0 + call->chunk_size - 1;
  }
  if (call->q_doc_ids && call->k_doc_ids) {
    int64_t first, end; /* the keys of the query's document: [first, end) */
    id_run(call->k_doc_ids + b * Tk, Tk, call->q_doc_ids[b * Tq + i], &first, &end);
    if (first == end) { /* no key in its document */
      *hi = *lo - 1;
      return;
    }
    if (*lo < first) *lo = first;
    if (*hi > end - 1) *hi = end - 1;
  }
}

/* Whether the block mask and the dense mask, when given, let query i of (b,h) see key j: a block's kind first
 * (EMPTY hides every key of it, FULL shows every one, PARTIAL defers to its cell), then the dense mask's cell. Unlike
 * the families of visible(), these may hide any key of a row and differ per head. */
static int cells_allow(const attncheck_call* call, int64_t b, int64_t h, int64_t i, int64_t j) {
  const attncheck_block_mask* bm = call->block_mask;
  const attncheck_dense_mask* dm = call->dense_mask;
  if (bm) {
    const int64_t* ks = bm->kind_strides;
    const uint8_t kind = bm->kinds[b * ks[0] + h * ks[1] + (i / bm->block_q) * ks[2] + (j / bm->block_k) * ks[3]];
    if (kind == ATTNCHECK_BLOCK_EMPTY) return 0;
    if (kind == ATTNCHECK_BLOCK_PARTIAL) {
      const int64_t* ps = bm->partial_strides;
      if (!bm->partial[b * ps[0] + h * ps[1] + i * ps[2] + j * ps[3]]) return 0;
    }
  }
  if (dm && !dm->data[b * dm->strides[0] + h * dm->strides[1] + i * dm->strides[2] + j * dm->strides[3]]) return 0;
#ifdef ABI4
  if (call->index_list) { /* selected keys: row (b, h's kv head, i) must list j (its block), -1 never a key */
    const attncheck_index_list* l = call->index_list;
    const int64_t g = l->per == ATTNCHECK_INDEX_PER_QUERY_HEAD ? h : h / (call->q.shape[1] / call->k.shape[1]);
    int64_t unit = j / l->block_size;
    if (l->space == ATTNCHECK_INDEX_PHYSICAL && call->paged) { /* the pool's slot of key j: its page's, plus its slot */
      const attncheck_paged_kv* pk = call->paged;
      unit = (int64_t)pk->block_table[b * pk->block_table_stride + j / pk->page_size] * pk->page_size + j % pk->page_size;
    }
    const int32_t* row = l->indices + b * l->strides[0] + g * l->strides[1] + i * l->strides[2];
    int64_t n;
    for (n = 0; n < l->max_k; ++n)
      if (row[n * l->strides[3]] >= 0 && row[n * l->strides[3]] == unit) break;
    if (n == l->max_k) return 0;
  }
  if (call->tree) { /* a tree of draft tokens: node i sees the prefix and its ancestors (a bitmask: its cells) */
    const attncheck_tree_mask* t = call->tree;
    const int64_t P = t->prefix_lengths[b], L = P + t->nodes;
    if (j >= L) return 0;
    if (t->form == ATTNCHECK_TREE_BITMASK) {
      const int64_t c = i * L + j;
      const uint8_t byte = t->bits[t->offsets[b] + c / 8];
      if (!((byte >> (t->bit_order == ATTNCHECK_BITS_MSB_FIRST ? 7 - c % 8 : c % 8)) & 1)) return 0;
    } else if (j >= P) {
      int64_t n = i; /* up the parent pointers from node i: j must be one of them */
      while (n >= 0 && n != j - P) n = t->parents[b * t->nodes + n];
      if (n < 0) return 0;
    }
    if (call->window >= 0 && key_place(call, b, j) < place(call, b, i) - call->window) return 0;
  }
#endif
  return 1;
}

/* The additive bias of (b, h, i, j) (ABI 4's call->bias, of the call's dtype, read through its strides: 0 over a
 * broadcast extent), 0 without one. */
static double bias_of(const attncheck_call* call, int64_t b, int64_t h, int64_t i, int64_t j) {
  attncheck_tensor_in t;
  if (!call->bias) return 0.0;
  t.data = call->bias->data;
  memcpy(t.shape, call->bias->shape, sizeof t.shape);
  memcpy(t.strides, call->bias->strides, sizeof t.strides);
  return load(&t, call->dtype, b, h, i, j);
}

/* The temperature of query i of (b, h) (ABI 4's call->temperature, read through its strides: 0 over a broadcast
 * extent), 1 without one. */
static double temperature_of(const attncheck_call* call, int64_t b, int64_t h, int64_t i) {
  if (!call->temperature) return 1.0;
  return call->temperature[b * call->temperature_strides[0] + h * call->temperature_strides[1] +
                           i * call->temperature_strides[2]];
}

/* The modified score of query i (head h) and key j from its scaled score s = scale·(q_i·k_j): divided by the
 * query's temperature, then softcap, ALiBi and the additive bias (the order attncheck/plugin.h gives). *ds, when
 * not NULL, gets its derivative with respect to s (a bias, like ALiBi, only shifts the score). */
static double modified(const attncheck_call* call, int64_t b, int64_t h, int64_t i, int64_t j, double s,
                       double* ds) {
  double slope_term =
      call->alibi_slopes ? call->alibi_slopes[h] * (double)(key_place(call, b, j) - place(call, b, i)) : 0.0;
  const double tau = temperature_of(call, b, h, i);
  s /= tau;
  if (ds) *ds = 1.0 / tau;
  if (call->softcap > 0) {
    const double t = tanh(s / call->softcap);
    s = call->softcap * t;
    if (ds) *ds *= 1.0 - t * t;
  }
  return (s + slope_term) + bias_of(call, b, h, i, j);
}

/* The sink logit of query head h: -inf (none) without call->sinks. */
static double sink_of(const attncheck_call* call, int64_t h) { return call->sinks ? call->sinks[h] : -INFINITY; }

/* The weights of query i over all T_k keys into w (exactly 0 for keys it does not see; all 0, or NaN with
 * -DEMPTY_ROWS_NAN, when it sees none), and its log-sum-exp into *lse (sink included; -inf for a row that sees
 * no key and has no sink). Query head h reads kv head h / (H / H_kv). */
static void softmax_row(const attncheck_call* call, int64_t b, int64_t h, int64_t i, double scale, double* w,
                        double* lse) {
  const int64_t H = call->q.shape[1], Hkv = call->k.shape[1], D = call->q.shape[3], Tk = call->k.shape[2];
  const int64_t g = h / (H / Hkv);
  const double sink = sink_of(call, h);
  int64_t lo, hi;
  double max = sink, sum = 0;
  visible(call, b, i, &lo, &hi);
  for (int64_t j = 0; j < Tk; ++j) {
    double s = 0;
#ifndef BUG_MASK_FILL_ZERO
    if (j < lo || j > hi || !cells_allow(call, b, h, i, j)) { /* a hidden key is never read: exp(-inf) = 0 */
      w[j] = -INFINITY;
      continue;
    }
#endif
    for (int64_t d = 0; d < D; ++d) s += qk(call, 0, b, h, i, d) * qk(call, 1, b, g, j, d);
    s = modified(call, b, h, i, j, s * scale, NULL);
#ifdef BUG_MASK_FILL_ZERO
    w[j] = lo <= j && j <= hi ? s : 0.0; /* BUG: a masked score of 0 still gets weight exp(0 - max) */
#else
    w[j] = s;
#endif
    if (w[j] > max) max = w[j];
  }
  /* Subtract the row max (the sink's logit included) so exp never overflows. */
  for (int64_t j = 0; j < Tk; ++j) {
    w[j] = max == -INFINITY ? 0.0 : exp(w[j] - max);
    sum += w[j];
  }
  if (sink > -INFINITY) sum += exp(sink - max); /* the sink's share: in the sum, in no weight */
  *lse = sum > 0 ? max + log(sum) : -INFINITY;
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

/* What weight (b,h,i,j) is multiplied by under dropout (call->dropout): 1/(1 - p) where kept, 0 where dropped, 1
 * without. The keep bit: lane 0 of Philox4x32-10 under the seed, at counter (i·T_k + j, the offset's two words,
 * b·H + h), kept where its uniform is >= p. A function of the seed, the offset and the cell only: a backward with the
 * same ones draws the same mask. */
static double keep_scale(const attncheck_call* call, int64_t b, int64_t h, int64_t i, int64_t j) {
#ifdef ABI4
  if (!call->dropout) return 1.0;
  const attncheck_dropout* d = call->dropout;
  const int64_t H = call->q.shape[1], Tk = call->k.shape[2];
  philox4x32_ctr_t ctr = {{(uint32_t)(i * Tk + j), (uint32_t)d->offset, (uint32_t)(d->offset >> 32),
                           (uint32_t)(b * H + h)}};
  philox4x32_key_t key = {{(uint32_t)d->seed, (uint32_t)(d->seed >> 32)}};
  const philox4x32_ctr_t r = philox4x32(ctr, key);
  return (double)r.v[0] >= d->p * 4294967296.0 ? 1.0 / (1.0 - d->p) : 0.0;
#else
  (void)call, (void)b, (void)h, (void)i, (void)j;
  return 1.0;
#endif
}

static double scale_of(const attncheck_call* call) {
  return call->has_scale ? call->scale : 1.0 / sqrt((double)call->q.shape[3]);
}

/* q [B,H,T_q,D], k [B,H_kv,T_k,D], v [B,H_kv,T_k,D_v] -> output [B,H,T_q,D_v], weights [B,H,T_q,T_k]. D_v is v's own
 * (ATTNCHECK_CAP3_V_HEAD_DIM, declared by the default build): D for the scores, D_v for P·V. */
static int32_t forward(const attncheck_call* call, char* message, size_t message_size) {
  const int64_t B = call->q.shape[0], H = call->q.shape[1], Tq = call->q.shape[2], Dv = call->v.shape[3];
  const int64_t Hkv = call->k.shape[1], Tk = call->k.shape[2];
  double w[4096];
  if (Tk > 4096) {
    snprintf(message, message_size, "T_k = %lld is more than the 4096 this example handles", (long long)Tk);
    return ATTNCHECK_UNSUPPORTED;
  }
  if (check_paged(call, message, message_size) != ATTNCHECK_OK) return ATTNCHECK_ERROR;
#if defined(DECLARED) || defined(BUG_DECLARED_TOO_MUCH)
  const int64_t D = call->q.shape[3];
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
        double lse;
        softmax_row(call, b, h, i, scale_of(call), w, &lse);
        for (int64_t j = 0; j < Tk; ++j) w[j] *= keep_scale(call, b, h, i, j); /* dropout; the LSE is the softmax's */
        if (call->lse)
          call->lse->data[b * call->lse->strides[0] + h * call->lse->strides[1] + i * call->lse->strides[2]] = lse;
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
        for (int64_t d = 0; d < Dv; ++d) {
          double o = 0;
          for (int64_t j = lo; j <= hi; ++j)
            if (cells_allow(call, b, h, i, j)) o += w[j] * kv(call, 1, b, h / (H / Hkv), j, d);
#ifdef EMPTY_ROWS_NAN
          if (hi < lo) o = NAN;
#endif
          store(&call->output, call->dtype, b, h, i, d, o);
        }
      }
  return ATTNCHECK_OK;
}

#if !defined(BUG_MASK_FILL_ZERO) && !defined(EMPTY_ROWS_NAN) && !defined(DECLARED) && \
    !defined(BUG_DECLARED_TOO_MUCH) && !defined(PAGED) /* the variants are forward-only */
/* The gradients of L = sum(O ∘ dO), row by row: with P the weights of query i, dP_j = dO_i · v_j,
 * Δ = Σ_j P_j dP_j (= dO_i · O_i), dZ_j = P_j (dP_j − Δ) for the modified score Z_j, and dS_j = dZ_j · dZ_j/dS_j
 * (1 − tanh²(S_j/cap) under a softcap; ALiBi adds a constant); dQ_i = scale Σ_j dS_j k_j, dK_j += scale dS_j q_i,
 * dV_j += P_j dO_i. The sink has no value (its dP is 0), so its logit gets −P_sink·Δ from every row of its head.
 * Under dropout the output is Σ_j m_j P_j v_j (m_j = keep_scale: the forward's mask, drawn again): dP_j = m_j dO_i · v_j
 * and dV_j += m_j P_j dO_i.
 * A kv head accumulates over every query head of its group, in double. */
static int32_t backward(const attncheck_backward_call* bc, char* message, size_t message_size) {
  const attncheck_call* call = bc->forward;
  const int64_t B = call->q.shape[0], H = call->q.shape[1], Tq = call->q.shape[2], D = call->q.shape[3];
  const int64_t Hkv = call->k.shape[1], Tk = call->k.shape[2], group = H / Hkv, Dv = call->v.shape[3];
  const double scale = scale_of(call);
  double w[4096];
  double* dk = malloc(sizeof(double) * (size_t)(Tk * D));
  double* dv = malloc(sizeof(double) * (size_t)(Tk * Dv));
  double* dq = malloc(sizeof(double) * (size_t)D);
  double* dsinks = calloc((size_t)H, sizeof(double));
  int32_t status = ATTNCHECK_OK;
#ifdef ABI4
  /* dBias (ATTNCHECK_CAP4_BIAS_GRAD): dZ summed over the axes the bias broadcasts over, in double. */
  const int64_t Bb = bc->d_bias.data ? bc->d_bias.shape[0] : 0, Hb = bc->d_bias.data ? bc->d_bias.shape[1] : 0;
  double* dbias = bc->d_bias.data ? calloc((size_t)(Bb * Hb * Tq * Tk), sizeof(double)) : NULL;
  if (bc->d_bias.data && !dbias) status = ATTNCHECK_ERROR;
#endif
  if (Tk > 4096 || !dk || !dv || !dq || !dsinks) {
    snprintf(message, message_size, "T_k = %lld: more than 4096, or out of memory", (long long)Tk);
    status = Tk > 4096 ? ATTNCHECK_UNSUPPORTED : ATTNCHECK_ERROR;
  }
  for (int64_t b = 0; b < B && status == ATTNCHECK_OK; ++b)
    for (int64_t g = 0; g < Hkv; ++g) {
      memset(dk, 0, sizeof(double) * (size_t)(Tk * D));
      memset(dv, 0, sizeof(double) * (size_t)(Tk * Dv));
      for (int64_t h = g * group; h < (g + 1) * group; ++h)
        for (int64_t i = 0; i < Tq; ++i) {
          int64_t lo, hi;
          double delta = 0, lse;
          softmax_row(call, b, h, i, scale, w, &lse);
          visible(call, b, i, &lo, &hi);
          for (int64_t j = lo; j <= hi; ++j) {
            double dp = 0;
            if (!cells_allow(call, b, h, i, j)) continue; /* a hidden key is never read */
            for (int64_t d = 0; d < Dv; ++d)
              dp += load(&bc->d_output, call->dtype, b, h, i, d) * load(&call->v, call->dtype, b, g, j, d);
            delta += w[j] * dp * keep_scale(call, b, h, i, j);
          }
          if (sink_of(call, h) > -INFINITY) dsinks[h] -= exp(sink_of(call, h) - lse) * delta;
          memset(dq, 0, sizeof(double) * (size_t)D);
          for (int64_t j = lo; j <= hi; ++j) {
            double dp = 0, s = 0, dz_ds;
            if (!cells_allow(call, b, h, i, j)) continue;
            const double m = keep_scale(call, b, h, i, j);
            for (int64_t d = 0; d < Dv; ++d)
              dp += load(&bc->d_output, call->dtype, b, h, i, d) * load(&call->v, call->dtype, b, g, j, d);
            dp *= m;
            for (int64_t d = 0; d < D; ++d)
              s += qk(call, 0, b, h, i, d) * qk(call, 1, b, g, j, d);
            modified(call, b, h, i, j, s * scale, &dz_ds);
            const double ds = w[j] * (dp - delta) * dz_ds;
#ifdef ABI4
            if (dbias) dbias[(((Bb == 1 ? 0 : b) * Hb + (Hb == 1 ? 0 : h)) * Tq + i) * Tk + j] += w[j] * (dp - delta);
#endif
            for (int64_t d = 0; d < D; ++d) {
              dq[d] += scale * ds * qk(call, 1, b, g, j, d);
              dk[j * D + d] += scale * ds * qk(call, 0, b, h, i, d);
            }
            for (int64_t d = 0; d < Dv; ++d) dv[j * Dv + d] += m * w[j] * load(&bc->d_output, call->dtype, b, h, i, d);
          }
          rope_back(call, 0, b, i, dq); /* the gradient of q' = R q is R^T of q''s */
          norm_back(call, 0, b, h, i, dq);
          for (int64_t d = 0; d < D; ++d) store(&bc->dq, call->dtype, b, h, i, d, dq[d]);
        }
      for (int64_t j = 0; j < Tk; ++j) {
        rope_back(call, 1, b, j, dk + j * D);
        norm_back(call, 1, b, g, j, dk + j * D);
        for (int64_t d = 0; d < D; ++d) store(&bc->dk, call->dtype, b, g, j, d, dk[j * D + d]);
        for (int64_t d = 0; d < Dv; ++d) store(&bc->dv, call->dtype, b, g, j, d, dv[j * Dv + d]);
      }
    }
  if (status == ATTNCHECK_OK && bc->d_sinks)
    for (int64_t h = 0; h < H; ++h) bc->d_sinks[h] = dsinks[h];
#ifdef ABI4
  if (status == ATTNCHECK_OK && dbias)
    for (int64_t n = 0; n < Bb * Hb * Tq * Tk; ++n)
      store(&bc->d_bias, call->dtype, n / (Hb * Tq * Tk), n / (Tq * Tk) % Hb, n / Tk % Tq, n % Tk, dbias[n]);
  free(dbias);
#endif
  free(dk);
  free(dv);
  free(dq);
  free(dsinks);
  return status;
}
#endif

ATTNCHECK_PLUGIN_EXPORT const attncheck_plugin_v1* attncheck_plugin(void) {
#ifdef PAGED
  static const int64_t page_sizes[] = {1, 8, 16, 64, 256};
#endif
#ifdef ABI4
  /* The same table as an ABI-4 one: ATTNCHECK_PLUGIN_V4_HEADER sets the version and the table's own size. */
  static const attncheck_plugin_v4 table = {
      ATTNCHECK_PLUGIN_V4_HEADER,
#else
  static const attncheck_plugin_v3 table = {
      .abi_version = ATTNCHECK_PLUGIN_ABI_V3,
#endif
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
#elif defined(MODIFIERS)
      .flags = ATTNCHECK_CAP_RETURNS_WEIGHTS | ATTNCHECK_CAP_CUSTOM_SCALE | ATTNCHECK_CAP_CROSS_LENGTHS |
               ATTNCHECK_CAP_NONFINITE_SAFE | ATTNCHECK_CAP_GQA | ATTNCHECK_CAP_KEY_LENGTHS | ATTNCHECK_CAP_WINDOW,
      .name = "c-example-modifiers",
      .description = "naive C attention with softcap, ALiBi, sinks, causal = 0 and the LSE, with a backward pass",
      .empty_rows = ATTNCHECK_EMPTY_ROWS_ZERO,
      .backward = backward,
      .flags3 = ATTNCHECK_CAP3_LSE | ATTNCHECK_CAP3_SINKS | ATTNCHECK_CAP3_SOFTCAP | ATTNCHECK_CAP3_ALIBI |
                ATTNCHECK_CAP3_BIDIRECTIONAL,
#elif defined(MASKS)
      .flags = ATTNCHECK_CAP_RETURNS_WEIGHTS | ATTNCHECK_CAP_CUSTOM_SCALE | ATTNCHECK_CAP_CROSS_LENGTHS |
               ATTNCHECK_CAP_NONFINITE_SAFE | ATTNCHECK_CAP_GQA | ATTNCHECK_CAP_KEY_LENGTHS | ATTNCHECK_CAP_WINDOW,
      .name = "c-example-masks",
      .description = "naive C attention with packed documents, chunks, a prefix, a right window and causal = 0",
      .empty_rows = ATTNCHECK_EMPTY_ROWS_ZERO,
      .backward = backward,
      .flags3 = ATTNCHECK_CAP3_DOCUMENTS | ATTNCHECK_CAP3_QUERY_DOCUMENTS | ATTNCHECK_CAP3_CHUNKED_LOCAL |
                ATTNCHECK_CAP3_PREFIX | ATTNCHECK_CAP3_BIDIRECTIONAL | ATTNCHECK_CAP3_RIGHT_WINDOW,
#elif defined(BLOCK_MASKS)
      .flags = ATTNCHECK_CAP_RETURNS_WEIGHTS | ATTNCHECK_CAP_CUSTOM_SCALE | ATTNCHECK_CAP_CROSS_LENGTHS |
               ATTNCHECK_CAP_NONFINITE_SAFE | ATTNCHECK_CAP_GQA | ATTNCHECK_CAP_KEY_LENGTHS | ATTNCHECK_CAP_WINDOW,
      .name = "c-example-block-masks",
      .description = "naive C attention under block masks and dense masks, causal or not",
      .empty_rows = ATTNCHECK_EMPTY_ROWS_ZERO,
      .backward = backward,
      .flags3 = ATTNCHECK_CAP3_BLOCK_MASK | ATTNCHECK_CAP3_DENSE_MASK | ATTNCHECK_CAP3_BIDIRECTIONAL,
#elif defined(PAGED)
      .flags = ATTNCHECK_CAP_RETURNS_WEIGHTS | ATTNCHECK_CAP_CUSTOM_SCALE | ATTNCHECK_CAP_CROSS_LENGTHS |
               ATTNCHECK_CAP_NONFINITE_SAFE | ATTNCHECK_CAP_GQA | ATTNCHECK_CAP_KEY_LENGTHS | ATTNCHECK_CAP_WINDOW,
      .name = "c-example-paged",
      .description = "naive C attention reading K and V through a block table (paged, both layouts)",
      .empty_rows = ATTNCHECK_EMPTY_ROWS_ZERO,
      /* The V pool's rows may be D_v wide (a V head dimension of its own: FlashMLA's paged latent cache). */
      .flags3 = ATTNCHECK_CAP3_PAGED | ATTNCHECK_CAP3_V_HEAD_DIM,
      .page_sizes = page_sizes,
      .num_page_sizes = sizeof page_sizes / sizeof page_sizes[0],
      .page_layouts = ATTNCHECK_PAGED_TOKEN_MAJOR | ATTNCHECK_PAGED_HEAD_MAJOR,
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
      /* It reads every input through its strides and computes the same sums in the same order whatever they are;
       * V may have a head dimension of its own (P·V and dP run over v's D_v). */
      .flags3 = ATTNCHECK_CAP3_STRIDED | ATTNCHECK_CAP3_LAYOUT_INVARIANT | ATTNCHECK_CAP3_V_HEAD_DIM,
#endif
      .max_T = 4096,
      .forward = forward,
#ifdef ABI4
      .flags4 = ATTNCHECK_CAP4_BIAS | ATTNCHECK_CAP4_BIAS_GRAD | ATTNCHECK_CAP4_TEMPERATURE | ATTNCHECK_CAP4_ROPE |
                ATTNCHECK_CAP4_ROPE_INTERLEAVED | ATTNCHECK_CAP4_QK_NORM | ATTNCHECK_CAP4_QK_NORM_EPS_OUTSIDE |
                ATTNCHECK_CAP4_DROPOUT | ATTNCHECK_CAP4_ROPE_NTK | ATTNCHECK_CAP4_ROPE_LLAMA3 | ATTNCHECK_CAP4_KV_E4M3FN |
                ATTNCHECK_CAP4_KV_E5M2 | ATTNCHECK_CAP4_KV_INT8 | ATTNCHECK_CAP4_KV_SCALE_PER_HEAD |
                ATTNCHECK_CAP4_KV_SCALE_PER_TOKEN | ATTNCHECK_CAP4_KV_ZERO_POINTS | ATTNCHECK_CAP4_KV_GGML_Q8_0 |
                ATTNCHECK_CAP4_KV_GGML_Q4_0 | ATTNCHECK_CAP4_KV_GGML_Q4_1 | ATTNCHECK_CAP4_KV_GGML_Q5_0 |
                ATTNCHECK_CAP4_KV_GGML_Q5_1 | ATTNCHECK_CAP4_Q_QUANT
                | ATTNCHECK_CAP4_INDEX_LIST | ATTNCHECK_CAP4_INDEX_LIST_BLOCKS | ATTNCHECK_CAP4_INDEX_LIST_PER_QUERY_HEAD
                | ATTNCHECK_CAP4_TREE | ATTNCHECK_CAP4_TREE_BITMASK
#ifdef PAGED
                | ATTNCHECK_CAP4_PAGED_QUANT | ATTNCHECK_CAP4_INDEX_LIST_PHYSICAL
#endif
                ,
      /* the bias, dBias, τ, both pairings of rotary embeddings and their NTK and Llama 3 scalings, QK-norm with eps on
       * either side, dropout, quantised K and V caches in every format and granularity and a quantised Q (decoded
       * here from the bits) */
#endif
  };
  return (const attncheck_plugin_v1*)&table;
}
