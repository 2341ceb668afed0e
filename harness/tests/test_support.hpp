// Shared by the harness tests: where the example plug-ins and helper programs are, and deterministic
// problems (closed-form values, no randomness) for calls outside RapidCheck.
#pragma once

#include <array>
#include <cmath>
#include <string>

#include "attncheck/implementation.hpp"

namespace attncheck::test {

inline std::string example_plugin(const std::string& name) {
  return std::string(ATTNCHECK_EXAMPLES_DIR) + "/lib" + name + ".so";
}

/// Values sin(1.3·n + seed) rounded to `dtype` (exact there), n the flat index: distinct, mixed signs.
inline Tensor<double> wave(const Shape& s, DType dtype, double seed) {
  Tensor<double> t(s);
  for (Index n = 0; n < t.size(); ++n)
    t.values()[n] = visit_dtype(
        dtype, [&](auto tag) { return double(static_cast<decltype(tag)>(std::sin(1.3 * double(n) + seed))); });
  return t;
}

inline Problem wave_problem(DType dtype, Index B, Index H, Index T_q, Index T_k, Index D) {
  Problem p;
  p.dtype = dtype;
  p.q = wave({B, H, T_q, D}, dtype, 0.1);
  p.k = wave({B, H, T_k, D}, dtype, 0.2);
  p.v = wave({B, H, T_k, D}, dtype, 0.3);
  return p;
}

/// A forward problem with grouped-query heads (B 2, H 4, H_kv 2, T_q 3, T_k 5, D 2), bottom-right, key lengths
/// {4, 3} and a window of 1, paged: pages of `page_size`, shuffled, two spare pages and a spare column, junk in
/// every table entry past a sequence's pages and NaN in every free slot (a reader of either gets NaN or an
/// out-of-range page). With page size 1, sequence 1 shares sequence 0's first two pages (its first two keys and
/// values made equal to sequence 0's).
inline Problem paged_problem(DType dtype, PageLayout layout, Index page_size) {
  Problem p = wave_problem(dtype, 2, 4, 3, 5, 2);
  p.k = wave({2, 2, 5, 2}, dtype, 0.2);
  p.v = wave({2, 2, 5, 2}, dtype, 0.3);
  p.alignment = CausalAlignment::BottomRight;
  p.key_lengths = {4, 3};
  p.window = 1;
  PagedPlan plan;
  plan.page_size = page_size;
  plan.layout = layout;
  plan.order = PagedPlan::Order::shuffled;
  plan.shuffle_seed = 7;
  plan.spare_pages = 2;
  plan.spare_columns = 1;
  plan.junk_entries = true;
  plan.fill = PageFill::nan;
  if (page_size == 1) {
    plan.shared_pages = 2;
    for (Tensor<double>* x : {&p.k, &p.v})
      for (Index g = 0; g < 2; ++g)
        for (Index j = 0; j < 2; ++j)
          for (Index d = 0; d < 2; ++d) (*x)(1, g, j, d) = (*x)(0, g, j, d);
  }
  p.paged = plan;
  return p;
}

// A paged problem's K and V quantised in format f at granularity g (block32 for ggml's formats, D then 32: the problem
// rebuilt with k and v 32 wide), its scales keyed by kv head and key only, so that a page two sequences share gets the
// same scales from both; int8 with zero points.
inline Problem quantised(Problem p, QuantFormat f, QuantGranularity g) {
  if (quant_blocked(f)) {
    g = QuantGranularity::block32;
    const Shape qs = p.q.shape(), ks = p.k.shape();
    Tensor<double> q({qs.B, qs.H, qs.T, 32}), k({ks.B, ks.H, ks.T, 32}), v({ks.B, ks.H, ks.T, 32});
    for (Tensor<double>* x : {&q, &k, &v})
      for (Index n = 0; n < x->size(); ++n) {
        const Index d = n % 32, rest = n / 32, t = rest % x->shape().T, h = rest / x->shape().T % x->shape().H;
        x->values()[n] = std::sin(0.37 * double(d + 5 * t + 11 * h) + (x == &q ? 0 : x == &k ? 1 : 2));
      }
    p.q = std::move(q), p.k = std::move(k), p.v = std::move(v);
  }
  QuantizedKV qk{.format = f, .k = quant_extents(g, p.k.shape()), .v = quant_extents(g, p.v.shape())};
  for (QuantScales* s : {&qk.k, &qk.v})
    for (Index b = 0; b < s->B; ++b)
      for (Index h = 0; h < s->H; ++h)
        for (Index t = 0; t < s->T; ++t)
          for (Index c = 0; c < s->C; ++c) {
            s->scales.push_back(double(
                float(quant_blocked(f) ? 0.03125 * double(1 + (h + t + c) % 3) : 0.0625 + 0.013 * double(h * 7 + t))));
            if (f == QuantFormat::int8) s->zero_points.push_back(double((h + 2 * t) % 5) - 2);
            if (quant_has_min(f)) s->mins.push_back(-0.25 * double((t + c) % 3));
          }
  p.k = quantize_dequantize(f, qk.k, p.k);
  p.v = quantize_dequantize(f, qk.v, p.v);
  p.quant = qk;
  return p;
}

/// p with V given a head dimension of its own, D_v = D + 1: its extra column is column 0 negated (exact at every
/// dtype). A paged p's V pool then has rows D + 1 wide (FlashMLA's paged latent cache).
inline Problem with_v_head_dim(Problem p) {
  const Shape s = p.v.shape();
  Tensor<double> v(Shape{s.B, s.H, s.T, s.D + 1});
  for (Index b = 0; b < s.B; ++b)
    for (Index h = 0; h < s.H; ++h) {
      v.head(b, h).leftCols(s.D) = p.v.head(b, h);
      v.head(b, h).col(s.D) = -p.v.head(b, h).col(0);
    }
  p.v = std::move(v);
  return p;
}

/// Every mask family beyond causal at once (B 2, H 2, T_q 4 bottom-right over T_k 6, head dimension D), with dO:
/// key lengths {6, 5}, a window of 3, a prefix of 2, a right window of 1, chunks of 3 and `causal` as given.
/// Batch entry 0 holds documents with bounds {0, 2, 2, 5, 9} (an empty first document, an empty one at 2 and one
/// past T_k): its key ids are {1, 1, 3, 3, 3, 4} and, the queries sitting at positions 2 .. 5, its query ids
/// {3, 3, 3, 4}; entry 1 has no bound (one document: every id 0).
inline Problem masks_problem(Index D, bool causal = true) {
  Problem p = wave_problem(DType::f64, 2, 2, 4, 6, D);
  p.alignment = CausalAlignment::BottomRight;
  p.key_lengths = {6, 5};
  p.window = 3;
  p.causal = causal;
  p.prefix_length = 2;
  p.window_right = 1;
  p.chunk_size = 3;
  p.doc_bounds = {{0, 2, 2, 5, 9}, {}};
  p.want_weights = true;
  p.d_output = wave(p.q.shape(), DType::f64, 0.4);
  return p;
}

/// A block mask and a dense mask with every way of broadcasting (B 2, H 2, T_q 4 bottom-right over T_k 6, head
/// dimension D), with dO and key lengths {6, 5}: the block mask has blocks of 3 x 4 (2 x 2 of them, the last of each
/// short), kinds [kinds_B, kinds_H] (kind (b,h,m,n) = (1 + b + h + 2m + n) % 3: every kind in every head) and partial
/// cells [cells_B, cells_H] ((b + h + i + 2j) % 3 != 0); the dense mask is [dense_B, dense_H] ((3i + j + b + 2h) % 5
/// != 0). An extent of 1 broadcasts, 2 is the call's. So each (b, h) sees its own keys, with gaps in its rows.
inline Problem cell_masks_problem(Index D, bool causal = true, std::array<Index, 6> extents = {1, 2, 2, 1, 2, 1}) {
  Problem p = wave_problem(DType::f64, 2, 2, 4, 6, D);
  p.alignment = CausalAlignment::BottomRight;
  p.key_lengths = {6, 5};
  p.causal = causal;
  p.want_weights = true;
  p.d_output = wave(p.q.shape(), DType::f64, 0.4);
  const auto cells = [](Index B, Index H, auto visible) {
    DenseMask m{.B = B, .H = H, .T_q = 4, .T_k = 6, .cells = {}};
    for (Index b = 0; b < B; ++b)
      for (Index h = 0; h < H; ++h)
        for (Index i = 0; i < 4; ++i)
          for (Index j = 0; j < 6; ++j) m.cells.push_back(visible(b, h, i, j) ? 1 : 0);
    return m;
  };
  BlockMask m{.block_q = 3, .block_k = 4, .B = extents[0], .H = extents[1], .q_blocks = 2, .k_blocks = 2, .kinds = {},
              .partial = {}};
  for (Index b = 0; b < m.B; ++b)
    for (Index h = 0; h < m.H; ++h)
      for (Index x = 0; x < 2; ++x)
        for (Index y = 0; y < 2; ++y) m.kinds.push_back(std::uint8_t((1 + b + h + 2 * x + y) % 3));
  m.partial = cells(extents[2], extents[3], [](Index b, Index h, Index i, Index j) { return (b + h + i + 2 * j) % 3 != 0; });
  p.block_mask = m;
  p.dense_mask = cells(extents[4], extents[5], [](Index b, Index h, Index i, Index j) { return (3 * i + j + b + 2 * h) % 5 != 0; });
  return p;
}

}  // namespace attncheck::test
