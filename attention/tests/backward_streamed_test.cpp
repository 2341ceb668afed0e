// The streamed backward (backward_streamed.cpp) against the materialised one (backward.cpp) on small cases that
// cross the query block (64) and the key tile (128) under every option: the streamed float64 oracle's gradients
// within float64 reassociation of oracle_backward's, its tolerance equal to gradient_check's, the core's streamed
// float path within the derived bound, the same bits whatever the thread count, hidden NaN never read, and the
// long path taken by attention_backward above kStreamedBackwardWeights.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "attncheck/backward.hpp"
#include "wave.hpp"

namespace attncheck {
namespace {

using test::wave;

struct Case {
  std::string name;
  Index B, H, H_kv, T_q, T_k, D;
  AttentionOptions opts;
  double magnitude = 2.0;
  Index D_v = 0;  ///< V's own head dimension (MLA); 0: D
};

DenseMask checkerboard(Index B, Index H, Index T_q, Index T_k) {
  DenseMask m{.B = B, .H = H, .T_q = T_q, .T_k = T_k, .cells = {}};
  m.cells.resize(std::size_t(B * H * T_q * T_k));
  for (std::size_t n = 0; n < m.cells.size(); ++n) m.cells[n] = std::sin(0.77 * double(n) + 0.3) > -0.4 ? 1 : 0;
  return m;
}

std::vector<Case> cases() {
  using enum CausalAlignment;
  std::vector<Case> c;
  c.push_back({"causal-gqa", 2, 4, 2, 150, 150, 8, {}});
  c.push_back({"bottom-right-empty-rows-padding-window", 2, 2, 1, 200, 130, 5,
               {.alignment = BottomRight, .key_lengths = {130, 40}, .window = 37}});
  c.push_back({"all-padding-entry", 2, 1, 1, 140, 140, 4, {.key_lengths = {0, 129}}});
  c.push_back({"softcap-alibi", 1, 2, 1, 140, 140, 6,
               {.scale = 0.7, .softcap = 3.0, .alibi_slopes = {0.25, 0.0625}}, 3.0});
  c.push_back({"sinks", 2, 3, 3, 130, 130, 4, {.sinks = {1.5, -std::numeric_limits<double>::infinity(), -2.0}}});
  c.push_back({"sinks-with-empty-rows", 1, 2, 2, 150, 70, 4,
               {.alignment = BottomRight, .sinks = {0.5, 3.0}}});
  c.push_back({"prefix-right-window-chunks", 1, 2, 2, 160, 160, 4,
               {.prefix_length = 20, .window_right = 5, .chunk_size = 70}});
  c.push_back({"bidirectional-window", 1, 1, 1, 140, 140, 3, {.window = 60, .causal = false}});
  c.push_back({"documents", 2, 2, 1, 150, 150, 4, {.doc_bounds = {{40, 40, 129}, {100}}}});
  c.push_back({"query-documents", 1, 1, 1, 100, 150, 4,
               {.alignment = BottomRight, .doc_bounds = {{70, 150}}, .q_doc_bounds = {{30, 100}}}});
  {
    Case m{"dense-mask-per-head", 1, 2, 1, 130, 140, 4, {}};
    m.opts.dense_mask = checkerboard(1, 2, 130, 140);
    c.push_back(m);
  }
  {
    Case m{"block-mask", 2, 2, 2, 140, 140, 4, {}};
    DenseMask cells = checkerboard(1, 2, 140, 140);
    for (Index i = 0; i < 140; ++i)  // whole blocks visible or empty, so full, empty and partial blocks all occur
      for (Index j = 0; j < 140; ++j)
        if ((i / 32 + j / 32) % 3 == 0) cells.cells[std::size_t(i * 140 + j)] = 1;
    m.opts.block_mask = block_encoding(cells, 32, 32);
    c.push_back(m);
  }
  c.push_back({"large-scores", 1, 1, 1, 130, 130, 8, {}, 30.0});  // ρ large or infinite at low precision
  c.push_back({"v-head-dim-smaller-gqa-sinks", 1, 4, 2, 140, 140, 12, {.sinks = {0.5, -1.0, 2.0, 0.0}}, 2.0, 5});
  c.push_back({"v-head-dim-larger-bottom-right", 2, 1, 1, 70, 150, 3, {.alignment = BottomRight, .softcap = 2.0}, 2.0, 9});
  return c;
}

struct Inputs {
  Tensor<double> q{Shape{}}, k{Shape{}}, v{Shape{}}, dO{Shape{}};
};

// Inputs representable in S, so that the oracle and an S kernel see the same values.
template <class S> Inputs inputs(const Case& c) {
  const Index D_v = c.D_v > 0 ? c.D_v : c.D;
  const Shape qs{c.B, c.H, c.T_q, c.D}, ks{c.B, c.H_kv, c.T_k, c.D}, vs{c.B, c.H_kv, c.T_k, D_v}, os{c.B, c.H, c.T_q, D_v};
  return {wave<S>(qs, 0.3, c.magnitude).template cast<double>(), wave<S>(ks, 1.1, c.magnitude).template cast<double>(),
          wave<S>(vs, 2.0, 1.0).template cast<double>(), wave<S>(os, 2.9, 1.0).template cast<double>()};
}

std::string at(const char* what, Index n) { return std::string(what) + " entry " + std::to_string(n); }

// The streamed oracle is a float64 kernel that accumulates in double, so gradient_check's float64 bound holds
// between it and the materialised oracle: that is float64 reassociation, derived (backward.cpp), ~1e-15 relative.
void expect_gradients_agree(const AttentionGradients<double>& streamed, const GradientCheck& mat64,
                            const std::string& name) {
  for (const auto& [what, s, m, t] :
       {std::tuple{"dq", &streamed.dq, &mat64.oracle.dq, &mat64.tolerance.dq},
        std::tuple{"dk", &streamed.dk, &mat64.oracle.dk, &mat64.tolerance.dk},
        std::tuple{"dv", &streamed.dv, &mat64.oracle.dv, &mat64.tolerance.dv}}) {
    ASSERT_EQ(s->shape(), m->shape()) << name << " " << what;
    for (Index n = 0; n < s->size(); ++n)
      ASSERT_LE(std::abs(s->values()[n] - m->values()[n]), t->values()[n])
          << name << " " << at(what, n) << ": streamed " << s->values()[n] << " materialised " << m->values()[n];
  }
  ASSERT_EQ(streamed.dsinks.size(), mat64.oracle.dsinks.size()) << name;
  for (std::size_t h = 0; h < streamed.dsinks.size(); ++h)
    ASSERT_LE(std::abs(streamed.dsinks[h] - mat64.oracle.dsinks[h]), mat64.tolerance.dsinks[h]) << name << " d_sinks " << h;
}

// Each tolerance entry is a sum of non-negative terms (products of sums of non-negative terms, at most 8 deep,
// and expm1 of such a sum in ρ) computed in another order: each sum moves by at most γ_n relative, n <= 2·T·H
// <= 1200 terms here, so by 8·γ_1200 ≈ 1.1e-12 relative in all; 2e-12 leaves room for expm1's own ulp. The one
// signed term, safety·u_s·|grad|, moves by safety·u_s times the two oracles' difference.
constexpr double kTolRelative = 2e-12;

void expect_tolerances_equal(const GradientCheck& s, const GradientCheck& m, DType dtype, double safety,
                             const std::string& name) {
  const double u_s = unit_roundoff(dtype);
  for (const auto& [what, ts, tm, gs, gm] :
       {std::tuple{"dq", &s.tolerance.dq, &m.tolerance.dq, &s.oracle.dq, &m.oracle.dq},
        std::tuple{"dk", &s.tolerance.dk, &m.tolerance.dk, &s.oracle.dk, &m.oracle.dk},
        std::tuple{"dv", &s.tolerance.dv, &m.tolerance.dv, &s.oracle.dv, &m.oracle.dv}}) {
    ASSERT_EQ(ts->shape(), tm->shape()) << name << " " << what;
    for (Index n = 0; n < ts->size(); ++n) {
      const double a = ts->values()[n], b = tm->values()[n];
      const double allowed = kTolRelative * b + safety * u_s * std::abs(gs->values()[n] - gm->values()[n]);
      ASSERT_LE(std::abs(a - b), allowed) << name << " " << dtype_name(dtype) << " tolerance " << at(what, n)
                                          << ": streamed " << a << " materialised " << b;
    }
  }
  ASSERT_EQ(s.tolerance.dsinks.size(), m.tolerance.dsinks.size()) << name;
  for (std::size_t h = 0; h < s.tolerance.dsinks.size(); ++h) {
    const double a = s.tolerance.dsinks[h], b = m.tolerance.dsinks[h];
    ASSERT_LE(std::abs(a - b), kTolRelative * b + std::abs(s.oracle.dsinks[h] - m.oracle.dsinks[h]))
        << name << " d_sinks tolerance " << h;
  }
}

TEST(StreamedBackward, oracleAndToleranceAgreeWithTheMaterialisedOnes) {
  for (const Case& c : cases()) {
    const Inputs in = inputs<float>(c);
    const GradientCheck mat64 = gradient_check(DType::f64, in.q, in.k, in.v, in.dO, c.opts);
    const AttentionGradients<double> streamed = streaming_oracle_backward<double>(in.q, in.k, in.v, in.dO, c.opts);
    expect_gradients_agree(streamed, mat64, c.name);
    for (const DType dtype : {DType::f64, DType::f32, DType::f16, DType::bf16}) {
      const GradientCheck s = streamed_gradient_check(dtype, in.q, in.k, in.v, in.dO, c.opts);
      const GradientCheck m = dtype == DType::f64 ? mat64 : gradient_check(dtype, in.q, in.k, in.v, in.dO, c.opts);
      expect_gradients_agree(s.oracle, mat64, c.name + " (" + std::string(dtype_name(dtype)) + " check)");
      expect_tolerances_equal(s, m, dtype, 2.0, c.name);
    }
  }
}

TEST(StreamedBackward, weightRelativeErrorEqualsTheMaterialisedOne) {
  for (const Case& c : cases()) {
    const Inputs in = inputs<float>(c);
    const double scale = resolve_scale(c.opts.scale, c.D, "test");
    for (const DType dtype : {DType::f32, DType::f16}) {
      const Tensor<double> rho = streamed_weight_relative_error(dtype, in.q, in.k, c.opts);
      for (Index b = 0; b < c.B; ++b)
        for (Index h = 0; h < c.H; ++h) {
          const Index g = kv_head(h, c.H, c.H_kv);
          const Eigen::VectorXd want = weight_relative_error(
              dtype, in.q.head(b, h), in.k.head(b, g), BoolMask::of(visibility(c.opts, b, c.T_q, c.T_k, h)), scale,
              head_modifiers(c.opts, b, h, c.T_q, c.T_k));
          for (Index i = 0; i < c.T_q; ++i)  // max and sums of non-negative terms in another order (above)
            ASSERT_TRUE(rho(b, h, i, 0) == want(i) || std::abs(rho(b, h, i, 0) - want(i)) <= kTolRelative * want(i))
                << c.name << " row " << i << ": " << rho(b, h, i, 0) << " vs " << want(i);
        }
    }
  }
}

TEST(StreamedBackward, subnormalInputsWidenTheBoundAsTheMaterialisedOneDoes) {
  Case c{"subnormal", 1, 1, 1, 70, 70, 4, {}};
  Inputs in = inputs<float>(c);
  in.k.values()[5] = 1e-40;  // below float's smallest normal: a DAZ kernel reads it as 0 (backward.cpp step 10)
  in.dO.values()[9] = -3e-39;
  const GradientCheck s = streamed_gradient_check(DType::f32, in.q, in.k, in.v, in.dO, c.opts);
  const GradientCheck m = gradient_check(DType::f32, in.q, in.k, in.v, in.dO, c.opts);
  expect_tolerances_equal(s, m, DType::f32, 2.0, c.name);
}

// Both the core's streamed float path and its materialised one are float kernels within gradient_check's
// float32 bound t of the oracle, so they are within 2t of each other.
TEST(StreamedBackward, coreStreamedPathWithinTheDerivedBoundOfTheMaterialisedOne) {
  for (const Case& c : cases()) {
    const Inputs in = inputs<float>(c);
    const Tensor<float> q = in.q.cast<float>(), k = in.k.cast<float>(), v = in.v.cast<float>(), dO = in.dO.cast<float>();
    const AttentionGradients<float> s = detail::streamed_backward<float>(q, k, v, dO, c.opts);
    const AttentionGradients<float> m = attention_backward<float>(q, k, v, dO, c.opts);
    const GradientCheck t = gradient_check(DType::f32, in.q, in.k, in.v, in.dO, c.opts);
    for (const auto& [what, gs, gm, tol] : {std::tuple{"dq", &s.dq, &m.dq, &t.tolerance.dq},
                                            std::tuple{"dk", &s.dk, &m.dk, &t.tolerance.dk},
                                            std::tuple{"dv", &s.dv, &m.dv, &t.tolerance.dv}})
      for (Index n = 0; n < gs->size(); ++n)
        ASSERT_LE(std::abs(double(gs->values()[n]) - double(gm->values()[n])), 2 * tol->values()[n])
            << c.name << " " << at(what, n);
    for (std::size_t h = 0; h < s.dsinks.size(); ++h)
      ASSERT_LE(std::abs(s.dsinks[h] - m.dsinks[h]), 2 * t.tolerance.dsinks[h]) << c.name << " d_sinks " << h;
  }
}

template <class S> bool same_bits(const Tensor<S>& a, const Tensor<S>& b) {
  return a.shape() == b.shape() && std::memcmp(a.data(), b.data(), sizeof(S) * std::size_t(a.size())) == 0;
}

TEST(StreamedBackward, identicalBitsWhateverTheThreadCount) {
  // Large enough that threads are used (more than 2^22 multiply-adds).
  Case c{"threads", 1, 2, 1, 700, 700, 16, {.sinks = {0.5, -1.0}}};
  const Inputs in = inputs<float>(c);
  const Tensor<float> q = in.q.cast<float>(), k = in.k.cast<float>(), v = in.v.cast<float>(), dO = in.dO.cast<float>();
  AttentionOptions one = c.opts, many = c.opts;
  one.threads = 1;
  many.threads = 5;
  const auto a = detail::streamed_backward<float>(q, k, v, dO, one), b = detail::streamed_backward<float>(q, k, v, dO, many);
  EXPECT_TRUE(same_bits(a.dq, b.dq));
  EXPECT_TRUE(same_bits(a.dk, b.dk));
  EXPECT_TRUE(same_bits(a.dv, b.dv));
  EXPECT_EQ(a.dsinks, b.dsinks);
  const GradientCheck x = streamed_gradient_check(DType::f32, in.q, in.k, in.v, in.dO, one),
                      y = streamed_gradient_check(DType::f32, in.q, in.k, in.v, in.dO, many);
  EXPECT_TRUE(same_bits(x.oracle.dq, y.oracle.dq));
  EXPECT_TRUE(same_bits(x.oracle.dk, y.oracle.dk));
  EXPECT_TRUE(same_bits(x.tolerance.dq, y.tolerance.dq));
  EXPECT_TRUE(same_bits(x.tolerance.dk, y.tolerance.dk));
  EXPECT_TRUE(same_bits(x.tolerance.dv, y.tolerance.dv));
}

// A long context's check of some rows (GradientRows): on the rows it computes (the blocks of 64 queries and the
// tiles of 128 keys that hold the rows asked for) the oracle and its bound are the whole check's, to the bit (each
// block and tile is computed alone, its sums in the same order); every other row is NaN, never a number a law could
// pass. Over every case above (windows, padding, documents, masks, sinks, softcap, GQA, D_v), with a prologue too.
TEST(StreamedBackward, someRowsAreTheWholeChecksRowsAndTheRestNaN) {
  std::vector<Case> all = cases();
  all.push_back({"temperature", 1, 2, 1, 200, 200, 4, {}});
  all.back().opts.temperature = QueryTemperature{.B = 1, .H = 1, .T_q = 200, .values = std::vector<double>(200, 0.7)};
  for (const Case& c : all) {
    const Inputs in = inputs<float>(c);
    const GradientRows rows{{0, c.T_q - 1, 70}, {c.T_k / 2}};
    const GradientCheck whole = streamed_gradient_check(DType::f32, in.q, in.k, in.v, in.dO, c.opts),
                        some = streamed_gradient_check(DType::f32, in.q, in.k, in.v, in.dO, c.opts, 2.0, &rows);
    const auto on = [](Index i, const std::vector<Index>& asked, Index per) {
      for (const Index a : asked)
        if (a / per == i / per) return true;
      return false;
    };
    for (const auto& [what, w, s, keys] : {std::tuple{"dq", &whole.oracle.dq, &some.oracle.dq, false},
                                           std::tuple{"dk", &whole.oracle.dk, &some.oracle.dk, true},
                                           std::tuple{"dv", &whole.oracle.dv, &some.oracle.dv, true},
                                           std::tuple{"dq bound", &whole.tolerance.dq, &some.tolerance.dq, false},
                                           std::tuple{"dk bound", &whole.tolerance.dk, &some.tolerance.dk, true},
                                           std::tuple{"dv bound", &whole.tolerance.dv, &some.tolerance.dv, true}}) {
      const Shape& sh = w->shape();
      for (Index b = 0; b < sh.B; ++b)
        for (Index h = 0; h < sh.H; ++h)
          for (Index i = 0; i < sh.T; ++i) {
            const bool computed = keys ? on(i, rows.keys, 128) : on(i, rows.queries, 64);
            for (Index d = 0; d < sh.D; ++d) {
              const double x = (*w)(b, h, i, d), y = (*s)(b, h, i, d);
              if (computed)
                ASSERT_EQ(std::memcmp(&x, &y, sizeof x), 0)
                    << c.name << " " << what << " row " << i << ": " << x << " vs " << y;
              else
                ASSERT_TRUE(std::isnan(y)) << c.name << " " << what << " row " << i << " not asked for: " << y;
            }
          }
    }
    EXPECT_EQ(whole.oracle.dsinks, some.oracle.dsinks) << c.name;
  }
}

TEST(StreamedBackward, hiddenNaNNeverReachesAGradient) {
  Case c{"hidden-nan", 2, 1, 1, 150, 150, 4, {.key_lengths = {100, 150}, .window = 90}};
  const Inputs in = inputs<float>(c);
  Tensor<double> k = in.k, v = in.v;
  for (Index j = 100; j < 150; ++j)  // padding of entry 0
    for (Index d = 0; d < 4; ++d) k(0, 0, j, d) = v(0, 0, j, d) = std::numeric_limits<double>::quiet_NaN();
  const auto clean = streaming_oracle_backward<double>(in.q, in.k, in.v, in.dO, c.opts);
  const auto dirty = streaming_oracle_backward<double>(in.q, k, v, in.dO, c.opts);
  EXPECT_TRUE(same_bits(clean.dq, dirty.dq));
  for (Index j = 0; j < 100; ++j)
    for (Index d = 0; d < 4; ++d) {
      ASSERT_EQ(clean.dk(0, 0, j, d), dirty.dk(0, 0, j, d)) << j;
      ASSERT_EQ(clean.dv(0, 0, j, d), dirty.dv(0, 0, j, d)) << j;
    }
  const GradientCheck t = streamed_gradient_check(DType::f32, in.q, k, v, in.dO, c.opts);
  EXPECT_TRUE(t.tolerance.dq.values().allFinite());
}

// Above kStreamedBackwardWeights attention_backward streams: at B = H = 1, T = 2050 (2050² > 2^22) its float
// gradients are within the streamed float32 bound of the streamed oracle, with hidden-by-padding keys too.
TEST(StreamedBackward, attentionBackwardStreamsALongContextWithinTheBound) {
  const Index T = 2050, D = 4;
  ASSERT_GT(double(T) * double(T), kStreamedBackwardWeights);
  Case c{"long", 1, 1, 1, T, T, D, {.key_lengths = {T - 3}, .sinks = {0.5}}};
  const Inputs in = inputs<float>(c);
  const auto g = attention_backward<float>(in.q.cast<float>(), in.k.cast<float>(), in.v.cast<float>(),
                                           in.dO.cast<float>(), c.opts);
  const GradientCheck t = streamed_gradient_check(DType::f32, in.q, in.k, in.v, in.dO, c.opts);
  for (const auto& [what, gs, o, tol] : {std::tuple{"dq", &g.dq, &t.oracle.dq, &t.tolerance.dq},
                                         std::tuple{"dk", &g.dk, &t.oracle.dk, &t.tolerance.dk},
                                         std::tuple{"dv", &g.dv, &t.oracle.dv, &t.tolerance.dv}})
    for (Index n = 0; n < gs->size(); ++n)
      ASSERT_LE(std::abs(double(gs->values()[n]) - o->values()[n]), tol->values()[n]) << at(what, n);
  ASSERT_EQ(g.dsinks.size(), 1u);
  EXPECT_LE(std::abs(g.dsinks[0] - t.oracle.dsinks[0]), t.tolerance.dsinks[0]);
  // The padding keys get nothing.
  for (Index j = T - 3; j < T; ++j) EXPECT_EQ(g.dk(0, 0, j, 0), 0.0f);
}

TEST(StreamedBackward, badShapesAreNamed) {
  const Tensor<double> q({1, 1, 3, 2}), k({1, 1, 3, 2}), v({1, 1, 3, 2}), dO({1, 1, 3, 5});
  try {
    streaming_oracle_backward<double>(q, k, v, dO);
    FAIL() << "no ShapeError";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("streaming_oracle_backward: d_output is [1,1,3,5]"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace attncheck
