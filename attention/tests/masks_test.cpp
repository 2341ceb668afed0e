// Causal alignment for T_q != T_k, empty rows, and boolean vs additive masks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "attncheck/attention.hpp"
#include "attncheck/backward.hpp"

namespace attncheck {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// What attention(q, k, v, o) throws, or "no error": the message a bad option gets.
template <class S>
std::string error_of(const Tensor<S>& q, const Tensor<S>& k, const Tensor<S>& v, const AttentionOptions& o) {
  try {
    attention(q, k, v, o);
  } catch (const std::exception& e) {
    return std::string(e.what());
  }
  return std::string("no error");
}

BoolMask::Array boolArray(Index r, Index c, std::initializer_list<int> v) {
  BoolMask::Array a(r, c);
  auto it = v.begin();
  for (Index i = 0; i < r; ++i)
    for (Index j = 0; j < c; ++j) a(i, j) = *it++ != 0;
  return a;
}

TEST(CausalMask, topLeftAndBottomRightDifferWhenQueriesAreFewerThanKeys) {
  // 2 queries over 3 keys. Top-left: query i sees j ≤ i. Bottom-right: j ≤ i + 3 - 2.
  EXPECT_TRUE((BoolMask::causal(2, 3, CausalAlignment::TopLeft).array() == boolArray(2, 3, {1, 0, 0, 1, 1, 0})).all());
  EXPECT_TRUE(
      (BoolMask::causal(2, 3, CausalAlignment::BottomRight).array() == boolArray(2, 3, {1, 1, 0, 1, 1, 1})).all());
  // Square: both are the lower triangle.
  EXPECT_TRUE((BoolMask::causal(3, 3, CausalAlignment::TopLeft).array() ==
               BoolMask::causal(3, 3, CausalAlignment::BottomRight).array())
                  .all());
  EXPECT_EQ(kDefaultAlignment, CausalAlignment::TopLeft);
}

// A hand-checked 2×3 case. D = 1, q = 0 so every visible score is 0 and the weights are uniform over what a
// query sees; V = [3, 6, 9].
//   top-left:     query 0 sees {3}        → 3;   query 1 sees {3, 6}    → 4.5
//   bottom-right: query 0 sees {3, 6}     → 4.5; query 1 sees {3, 6, 9} → 6
TEST(CausalMask, twoQueriesOverThreeKeysUnderBothAlignments) {
  Tensor<double> q({1, 1, 2, 1}), k({1, 1, 3, 1}), v({1, 1, 3, 1});
  k.head(0, 0) << 1, -2, 5;  // any keys: the scores are q·k = 0 whatever they are
  v.head(0, 0) << 3, 6, 9;
  Tensor<double> w({1, 1, 1, 1});
  const auto tl = attention(q, k, v, {.scale = {}, .alignment = CausalAlignment::TopLeft}, &w);
  EXPECT_EQ(w.shape(), (Shape{1, 1, 2, 3}));
  EXPECT_EQ(tl(0, 0, 0, 0), 3.0);
  EXPECT_EQ(tl(0, 0, 1, 0), 4.5);  // 0.5·3 + 0.5·6, exact in binary
  EXPECT_EQ(w(0, 0, 0, 1), 0.0);
  EXPECT_EQ(w(0, 0, 1, 2), 0.0);
  const auto br = attention(q, k, v, {.scale = {}, .alignment = CausalAlignment::BottomRight}, &w);
  EXPECT_EQ(br(0, 0, 0, 0), 4.5);
  // (1/3)·3 + (1/3)·6 + (1/3)·9: three roundings of the weight and three of the sum, each ≤ u·18.
  EXPECT_NEAR(br(0, 0, 1, 0), 6.0, 6 * std::ldexp(1.0, -53) * 18);
  EXPECT_EQ(w(0, 0, 0, 2), 0.0);
  EXPECT_NEAR(w(0, 0, 1, 2), 1.0 / 3, std::ldexp(1.0, -52));
}

// A query that sees no key gets zero weights and a zero output (documented), never NaN. Bottom-right with
// T_q > T_k leaves the first T_q - T_k queries with nothing to see.
TEST(CausalMask, aRowWithNoVisibleKeyIsZeroNotNaN) {
  Tensor<float> q({1, 1, 3, 2}), k({1, 1, 2, 2}), v({1, 1, 2, 2});
  q.values().setConstant(1);
  k.values().setConstant(2);
  v.values() << 1, 2, 3, 4;
  Tensor<float> w({1, 1, 1, 1});
  const auto out = attention(q, k, v, {.scale = {}, .alignment = CausalAlignment::BottomRight}, &w);
  for (Index c = 0; c < 2; ++c) EXPECT_EQ(out(0, 0, 0, c), 0.0f);
  for (Index j = 0; j < 2; ++j) EXPECT_EQ(w(0, 0, 0, j), 0.0f);
  EXPECT_TRUE(out.values().allFinite());
  EXPECT_EQ(out(0, 0, 1, 0), 1.0f);  // query 1 sees key 0 only
  // Same through an explicit all-false mask, on both mask types.
  const BoolMask none(BoolMask::Array::Constant(3, 2, false));
  EXPECT_TRUE((attention(q, k, v, none).values().array() == 0).all());
  EXPECT_TRUE((attention(q, k, v, none.to_additive()).values().array() == 0).all());
}

TEST(Masks, convertingBoolToAdditiveAndBackIsExact) {
  const BoolMask m = BoolMask::causal(4, 6, CausalAlignment::BottomRight);
  const AdditiveMask a = m.to_additive();
  for (Index i = 0; i < 4; ++i)
    for (Index j = 0; j < 6; ++j) EXPECT_EQ(a.bias(i, j), m.visible(i, j) ? 0.0f : -std::numeric_limits<float>::infinity());
  EXPECT_TRUE((a.to_bool().array() == m.array()).all());
  EXPECT_TRUE((AdditiveMask::causal(4, 6, CausalAlignment::BottomRight).array() == a.array()).all());
}

Tensor<double> filled(const Shape& s, double phase) {
  Tensor<double> t(s);
  for (Index n = 0; n < t.size(); ++n) t.values()[n] = std::sin(0.7 * double(n) + phase) * 3;
  return t;
}

// On finite inputs the two masks give the same weights bit for bit (0 added to a visible score is exact and
// both select nothing else); the outputs agree within the summation-order bound: the boolean path sums only
// the visible rows, the additive one all T_k (the extra terms are exact zeros), so the two differ by at
// most 2·γ_T·Σ_j w_j|v_j| ≤ 2·γ_T·max|v|.
TEST(Masks, boolAndAdditiveAgreeOnFiniteInputs) {
  const Shape s{2, 3, 7, 5};
  const auto q = filled(s, 0.1), k = filled(s, 1.3), v = filled(s, 2.9);
  const BoolMask m = BoolMask::causal(7, 7);
  Tensor<double> wb({1, 1, 1, 1}), wa({1, 1, 1, 1});
  const auto ob = attention(q, k, v, m, {}, &wb);
  const auto oa = attention(q, k, v, m.to_additive(), {}, &wa);
  EXPECT_EQ(wb.values(), wa.values());
  const double tol = 2 * 7 * std::ldexp(1.0, -53) * v.values().cwiseAbs().maxCoeff() * 1.01;
  EXPECT_LE((ob.values() - oa.values()).cwiseAbs().maxCoeff(), tol);
}

// An Inf in a masked score: the boolean mask never reads it, so the output stays finite and unchanged. The
// additive mask adds -inf to +inf, which is NaN: that NaN becomes the row max and poisons the whole row.
TEST(Masks, infInAMaskedScoreNeverReachesTheOutputUnderABoolMask) {
  Tensor<double> q({1, 1, 2, 1}), k({1, 1, 2, 1}), v({1, 1, 2, 1});
  q.values() << 1, 1;
  k.values() << 0.5, 2;
  v.values() << 7, 11;
  const BoolMask m = BoolMask::causal(2, 2);
  const auto before = attention(q, k, v, m);
  k(0, 0, 1, 0) = kInf;  // score (0,1) = q0·k1 = +inf, in the masked future of query 0
  const auto after_bool = attention(q, k, v, m);
  EXPECT_EQ(after_bool(0, 0, 0, 0), before(0, 0, 0, 0));
  EXPECT_EQ(after_bool(0, 0, 0, 0), 7.0);
  const auto after_add = attention(q, k, v, m.to_additive());
  EXPECT_TRUE(std::isnan(after_add(0, 0, 0, 0))) << "the additive mask turns inf + (-inf) into NaN";
  // Inf in a future value: 0·Inf is NaN in a plain weights·V product; the boolean path never multiplies it.
  k(0, 0, 1, 0) = 2;
  v(0, 0, 1, 0) = kInf;
  EXPECT_EQ(attention(q, k, v, m)(0, 0, 0, 0), 7.0);
  EXPECT_TRUE(std::isnan(attention(q, k, v, m.to_additive())(0, 0, 0, 0)));
}

TEST(Scale, defaultsToOneOverRootDAndCanBeOverridden) {
  Tensor<double> q({1, 1, 2, 4}), k({1, 1, 2, 4}), v({1, 1, 2, 4});
  q.values().setConstant(1);
  k.values() << 0, 0, 0, 0, 1, 1, 1, 1;  // scores for query 1: [0, 4·scale]
  v.values() << 0, 0, 0, 0, 1, 1, 1, 1;
  Tensor<double> w({1, 1, 1, 1});
  // Both sides are a few correctly rounded operations (exp, add, divide) on values ≤ 8: 8u apart at most.
  const double tol = 8 * std::ldexp(1.0, -53);
  attention(q, k, v, {}, &w);
  // default scale 1/√4: weight of key 1 is e^2/(1 + e^2)
  EXPECT_NEAR(w(0, 0, 1, 1), std::exp(2.0) / (1 + std::exp(2.0)), tol);
  attention(q, k, v, {.scale = 0.125, .alignment = kDefaultAlignment}, &w);
  EXPECT_NEAR(w(0, 0, 1, 1), std::exp(0.5) / (1 + std::exp(0.5)), tol);
}

// Scores far beyond exp's range: the row max is subtracted first, so nothing overflows.
TEST(Softmax, hugeScoresDoNotOverflow) {
  Tensor<float> q({1, 1, 2, 1}), k({1, 1, 2, 1}), v({1, 1, 2, 1});
  q.values() << 1e4f, 1e4f;
  k.values() << 1e4f, 1e4f - 1;  // scores 1e8 and 1e8 - 1e4: the second weight underflows to 0
  v.values() << 1, 2;
  Tensor<float> w({1, 1, 1, 1});
  const auto out = attention(q, k, v, {}, &w);
  EXPECT_TRUE(out.values().allFinite());
  EXPECT_EQ(w(0, 0, 1, 0), 1.0f);
  EXPECT_EQ(out(0, 0, 1, 0), 1.0f);
}

// An index list is the dense mask of the keys it lists, intersected with the causal rule: per kv head (shared by a
// group of two query heads) with duplicates and padding anywhere in a row, and as block indices; every path agrees
// with attention under that dense mask, a listed key past the causal limit stays hidden, and bad lists are named.
TEST(Visibility, anIndexListIsTheMaskOfTheKeysItListsIntersectedWithTheRest) {
  const Index B = 1, H = 2, T = 6, K = 3;
  Tensor<double> q = filled({B, H, T, 2}, 0.3), k = filled({B, 1, T, 2}, 1.1), v = filled({B, 1, T, 2}, 2.7);
  for (const Index block : {1, 2}) {
    IndexList l{.block_size = block, .group = 2, .B = 1, .H = 1, .T_q = T, .max_k = K, .indices = {}};
    const Index units = (T + block - 1) / block;
    for (Index i = 0; i < T; ++i)  // row i: unit i % units, -1, unit (i + 2) % units twice over rows
      for (const std::int32_t x : {std::int32_t(i % units), -1, std::int32_t((i + 2) % units)}) l.indices.push_back(x);
    AttentionOptions o;
    o.index_list = l;
    DenseMask cells{.B = 1, .H = 1, .T_q = T, .T_k = T, .cells = {}};
    for (Index i = 0; i < T; ++i)
      for (Index j = 0; j < T; ++j) cells.cells.push_back(j / block == i % units || j / block == (i + 2) % units);
    AttentionOptions dense;
    dense.dense_mask = cells;
    Tensor<double> w({1, 1, 1, 1}), wd({1, 1, 1, 1});
    const Tensor<double> full = attention(q, k, v, o, &w), streamed = attention(q, k, v, o),
                         want = attention(q, k, v, dense, &wd);
    EXPECT_EQ(full.values(), want.values()) << block;
    EXPECT_EQ(w.values(), wd.values()) << block;
    EXPECT_LE((streamed.values() - want.values()).cwiseAbs().maxCoeff(), 1e-14) << block;
    for (Index h = 0; h < H; ++h) {
      const Visibility vis = visibility(o, 0, T, T, h);
      for (Index i = 0; i < T; ++i)
        for (Index j = 0; j < T; ++j) {
          const bool listed = j / block == i % units || j / block == (i + 2) % units;
          EXPECT_EQ(vis.visible(i, j), listed && j <= i) << block << h << i << j;
          if (!listed) {
            EXPECT_EQ(vis.hidden_by(i, j), j > i ? "causal" : "index list");
          }
        }
    }
  }
  const auto message = [&](const AttentionOptions& o) { return error_of(q, k, v, o); };
  AttentionOptions bad;
  bad.index_list = IndexList{.block_size = 1, .group = 2, .B = 1, .H = 1, .T_q = T, .max_k = 1, .indices = {}};
  bad.index_list->indices.assign(T, 0);
  bad.index_list->indices[3] = std::int32_t(T);
  EXPECT_NE(message(bad).find("index_list entry 3 is 6; expected -1 (padding) or a key index in [0, 6)"),
            std::string::npos)
      << message(bad);
  bad.index_list->group = 1;
  EXPECT_NE(message(bad).find("the list heads times the group are not H"), std::string::npos) << message(bad);
}

// MoBA's current block (IndexList::current_block): a query sees its row's blocks and the block of its own aligned
// position, the causal rule still cutting inside it; bottom-right, position i + T_k - T_q. Rows list block 0 only
// (or nothing), blocks of 2 keys.
TEST(Visibility, theCurrentBlockIsSelectedBesidesTheRow) {
  const Index T_q = 3, T_k = 6;
  for (const bool listed : {true, false}) {
    IndexList l{.block_size = 2, .group = 1, .B = 1, .H = 1, .T_q = T_q, .max_k = 1, .indices = {}};
    l.indices.assign(T_q, listed ? 0 : -1);
    l.current_block = true;
    AttentionOptions o;
    o.alignment = CausalAlignment::BottomRight;
    o.index_list = l;
    const Visibility vis = visibility(o, 0, T_q, T_k, 0);
    for (Index i = 0; i < T_q; ++i)
      for (Index j = 0; j < T_k; ++j) {
        const Index p = i + T_k - T_q;
        const bool want = j <= p && ((listed && j < 2) || j / 2 == p / 2);
        EXPECT_EQ(vis.visible(i, j), want) << listed << i << j;
        if (!want && j <= p) {
          EXPECT_EQ(vis.hidden_by(i, j), "index list");
        }
      }
    o.index_list->current_block = false;  // the row alone
    const Visibility row = visibility(o, 0, T_q, T_k, 0);
    for (Index i = 0; i < T_q; ++i)
      for (Index j = 0; j < T_k; ++j) EXPECT_EQ(row.visible(i, j), listed && j < 2) << listed << i << j;
  }
}

// Where duplicates count (IndexList::counted), a key listed n times is n copies of that key: a row listing keys
// 0, 2, 0, 3, 0 over K equals the row listing each key once over K with key 0 written out three times (at
// positions the causal rule shows every query of a decode step), in the output, the weights summed over the
// copies, the LSE and the gradients (dK and dV summed over the copies), on the materialised and the streamed
// paths. Without `counted` the same list is the set {0, 2, 3}.
TEST(Visibility, aCountedDuplicateIsThatKeyWrittenOutAsOftenAsItIsListed) {
  const Index T = 4, D = 3;
  const Tensor<double> q = filled({1, 1, 1, D}, 0.3), k = filled({1, 1, T, D}, 1.1), v = filled({1, 1, T, D}, 2.7);
  AttentionOptions o;
  o.alignment = CausalAlignment::BottomRight;
  o.index_list = IndexList{
      .block_size = 1, .group = 1, .B = 1, .H = 1, .T_q = 1, .max_k = 5, .indices = {0, 2, 0, 3, 0}, .counted = true};
  // Keys 0, 0, 0, 2, 3 written out (key 1 dropped: unlisted), every one listed once.
  const std::vector<Index> copies{0, 0, 0, 2, 3};
  Tensor<double> k5({1, 1, 5, D}), v5({1, 1, 5, D});
  for (Index n = 0; n < 5; ++n)
    for (Index c = 0; c < D; ++c) {
      k5(0, 0, n, c) = k(0, 0, copies[std::size_t(n)], c);
      v5(0, 0, n, c) = v(0, 0, copies[std::size_t(n)], c);
    }
  AttentionOptions plain;
  plain.alignment = CausalAlignment::BottomRight;
  Tensor<double> w({1, 1, 1, 1}), w5({1, 1, 1, 1}), lse({1, 1, 1, 1}), lse5({1, 1, 1, 1});
  const Tensor<double> out = attention(q, k, v, o, &w, &lse), out5 = attention(q, k5, v5, plain, &w5, &lse5);
  const Tensor<double> streamed = attention(q, k, v, o);
  for (Index c = 0; c < D; ++c) {
    EXPECT_NEAR(out(0, 0, 0, c), out5(0, 0, 0, c), 1e-14) << c;
    EXPECT_NEAR(streamed(0, 0, 0, c), out5(0, 0, 0, c), 1e-14) << c;
  }
  EXPECT_NEAR(lse(0, 0, 0, 0), lse5(0, 0, 0, 0), 1e-14);
  EXPECT_NEAR(w(0, 0, 0, 0), w5(0, 0, 0, 0) + w5(0, 0, 0, 1) + w5(0, 0, 0, 2), 1e-15);
  EXPECT_EQ(w(0, 0, 0, 1), 0.0);
  EXPECT_NEAR(w(0, 0, 0, 3), w5(0, 0, 0, 4), 1e-15);
  const Tensor<double> dO = filled({1, 1, 1, D}, 0.9);
  const AttentionGradients<double> g = attention_backward(q, k, v, dO, o),
                                   g5 = attention_backward(q, k5, v5, dO, plain);
  for (Index c = 0; c < D; ++c) {
    EXPECT_NEAR(g.dq(0, 0, 0, c), g5.dq(0, 0, 0, c), 1e-14) << c;
    EXPECT_NEAR(g.dk(0, 0, 0, c), g5.dk(0, 0, 0, c) + g5.dk(0, 0, 1, c) + g5.dk(0, 0, 2, c), 1e-14) << c;
    EXPECT_NEAR(g.dv(0, 0, 0, c), g5.dv(0, 0, 0, c) + g5.dv(0, 0, 1, c) + g5.dv(0, 0, 2, c), 1e-14) << c;
    EXPECT_NEAR(g.dv(0, 0, 3, c), g5.dv(0, 0, 4, c), 1e-14) << c;
  }
  o.index_list->counted = false;  // a set: {0, 2, 3}, each once
  Tensor<double> ws({1, 1, 1, 1});
  attention(q, k, v, o, &ws);
  EXPECT_NE(ws(0, 0, 0, 0), w(0, 0, 0, 0));
  AttentionOptions once = o;
  once.index_list->indices = {0, 2, 3, -1, -1};
  Tensor<double> w1({1, 1, 1, 1});
  attention(q, k, v, once, &w1);
  EXPECT_EQ(ws.values(), w1.values());
}

}  // namespace
}  // namespace attncheck

namespace attncheck {
namespace {

Tensor<double> counting(const Shape& s, double step) {
  Tensor<double> t(s);
  for (Index n = 0; n < t.size(); ++n) t.values()[n] = std::sin(step * double(n + 1));
  return t;
}

TEST(Visibility, windowAndPaddingCutTheCausalRowToOneRun) {
  // 4 queries over 4 keys, window 1 (a query sees itself and one key back), keys >= 3 are padding.
  const Visibility v{.T_q = 4, .T_k = 4, .key_length = 3, .window = 1};
  EXPECT_TRUE((BoolMask::of(v).array() == boolArray(4, 4, {1, 0, 0, 0,  //
                                                            1, 1, 0, 0,  //
                                                            0, 1, 1, 0,  //
                                                            0, 0, 1, 0}))
                  .all());
  // Window 0: only the query's own position; bottom-right with T_q = 2 over T_k = 4: positions 2 and 3.
  const Visibility w{.T_q = 2, .T_k = 4, .alignment = CausalAlignment::BottomRight, .window = 0};
  EXPECT_TRUE((BoolMask::of(w).array() == boolArray(2, 4, {0, 0, 1, 0, 0, 0, 0, 1})).all());
  // Length 0: nothing visible.
  EXPECT_TRUE((Visibility{.T_q = 2, .T_k = 2, .key_length = 0}.keys(1).empty()));
}

// Grouped-query attention is attention with K and V repeated along heads (repeat_interleave): query head h
// reads kv head h / (H / H_kv). The two must agree bit for bit (same arithmetic, same order).
TEST(GroupedQuery, equalsExplicitRepetitionOfKAndV) {
  const Index B = 2, H = 6, H_kv = 2, T = 5, D = 3;
  const Tensor<double> q = counting({B, H, T, D}, 0.7), k = counting({B, H_kv, T, D}, 1.3),
                       v = counting({B, H_kv, T, D}, 0.9);
  Tensor<double> k_rep({B, H, T, D}), v_rep({B, H, T, D});
  for (Index b = 0; b < B; ++b)
    for (Index h = 0; h < H; ++h) {
      k_rep.head(b, h) = k.head(b, h / 3);
      v_rep.head(b, h) = v.head(b, h / 3);
    }
  const Tensor<double> grouped = attention(q, k, v), repeated = attention(q, k_rep, v_rep);
  EXPECT_TRUE(grouped.values() == repeated.values());
}

// A padded batch entry is the same attention as that entry alone with its keys cut to its length.
TEST(KeyPadding, paddedKeysNeverReachAnOutput) {
  const Index T = 5, D = 2;
  const Tensor<double> q = counting({2, 1, T, D}, 0.4), k = counting({2, 1, T, D}, 0.8), v = counting({2, 1, T, D}, 1.1);
  Tensor<double> v_bad = v;
  for (Index j = 3; j < T; ++j) v_bad.head(1, 0).row(j).setConstant(kInf);  // padding of entry 1 is Inf
  const Tensor<double> out = attention(q, k, v_bad, AttentionOptions{.key_lengths = {T, 3}});
  EXPECT_TRUE(out.values().allFinite());
  Tensor<double> weights({1, 1, 1, 1});
  attention(q, k, v, AttentionOptions{.key_lengths = {T, 3}}, &weights);
  for (Index i = 0; i < T; ++i)
    for (Index j = 3; j < T; ++j) EXPECT_EQ(weights(1, 0, i, j), 0.0) << i << "," << j;
}

}  // namespace
}  // namespace attncheck

namespace attncheck {
namespace {

// The mask families beyond causal, cell by cell from their definitions (plugin.h's words), independent of
// Visibility::keys.
bool visible_by_definition(const Visibility& v, Index i, Index j) {
  const Index p = v.position(i);
  const auto fdiv = [](Index a, Index b) { return Index(std::floor(double(a) / double(b))); };
  bool ok = true;
  if (v.causal) ok = ok && (j <= p || j < v.prefix);
  if (v.key_length >= 0) ok = ok && j < v.key_length;
  if (v.window) ok = ok && j >= p - *v.window;
  if (v.window_right) ok = ok && j <= p + *v.window_right;
  if (v.chunk > 0) ok = ok && fdiv(j, v.chunk) == fdiv(p, v.chunk);
  if (v.doc_bounds) {
    // The document of a key position: how many bounds are at or before it.
    const auto doc = [&](Index t) {
      Index d = 0;
      for (const Index bound : *v.doc_bounds) d += bound <= t ? 1 : 0;
      return d;
    };
    ok = ok && doc(j) == doc(std::clamp<Index>(p, 0, v.T_k - 1));
  }
  return ok;
}

TEST(Visibility, everyFamilyTogetherIsOneRunThatMatchesItsDefinition) {
  // Every combination of the families over small grids, both alignments, T_q above, at and below T_k.
  int checked = 0;
  const std::vector<std::vector<Index>> documents{{}, {2}, {0, 3}, {3, 3, 5}, {1, 2, 4, 9}};
  for (const Index T_q : {1, 3, 6})
    for (const Index T_k : {1, 4, 6})
      for (const auto a : {CausalAlignment::TopLeft, CausalAlignment::BottomRight})
        for (const bool causal : {true, false})
          for (const Index prefix : {0, 2, 7})
            for (const Index chunk : {0, 1, 2, 4})
              for (const auto& bounds : documents)
                for (const int windows : {0, 1, 2, 3}) {
                  Visibility v{.T_q = T_q, .T_k = T_k, .alignment = a, .causal = causal, .prefix = prefix, .chunk = chunk};
                  if (windows & 1) v.window = 1;
                  if (windows & 2) v.window_right = causal ? 0 : 2;
                  if (!bounds.empty()) v.doc_bounds = &bounds;
                  v.key_length = (T_q + prefix + chunk) % 3 == 0 ? T_k - 1 : -1;
                  Index last_begin = 0, last_end = 0;
                  for (Index i = 0; i < T_q; ++i) {
                    const KeyRange r = v.keys(i);
                    for (Index j = 0; j < T_k; ++j) {
                      ASSERT_EQ(r.contains(j), visible_by_definition(v, i, j))
                          << "query " << i << " key " << j << " T_q " << T_q << " T_k " << T_k << " causal " << causal
                          << " prefix " << prefix << " chunk " << chunk << " windows " << windows << " docs "
                          << bounds.size();
                      ASSERT_EQ(v.hidden_by(i, j).empty(), r.contains(j));
                    }
                    // The streamed forward relies on both ends never moving left.
                    if (!r.empty()) {
                      EXPECT_GE(r.begin, last_begin);
                      EXPECT_GE(r.end, last_end);
                      last_begin = r.begin;
                      last_end = r.end;
                    }
                    ++checked;
                  }
                }
  EXPECT_GT(checked, 10000);
}

TEST(Visibility, documentsOfAPackedRowAreCausalInsideEachDocument) {
  // Keys 0-1 are document 0, 2-4 document 1: query 3 sees keys 2 and 3, query 1 sees 0 and 1.
  const std::vector<Index> bounds{2};
  const Visibility v{.T_q = 5, .T_k = 5, .doc_bounds = &bounds};
  EXPECT_EQ(v.keys(3).begin, 2);
  EXPECT_EQ(v.keys(3).end, 4);
  EXPECT_EQ(v.keys(1).begin, 0);
  EXPECT_EQ(v.keys(1).end, 2);
  EXPECT_EQ(v.hidden_by(3, 1), "document");
  EXPECT_EQ(v.hidden_by(3, 4), "causal");
}

// Documents with query bounds of their own (varlen's cu_seqlens_q beside cu_seqlens_k): each document aligned on
// its own query and key lengths, worked by hand.
TEST(Visibility, queryDocumentsAlignEachDocumentOnItsOwnLengths) {
  // Document 0: queries 0-1, keys 0-3; document 1: query 2, keys 4-5.
  const std::vector<Index> keys{4}, queries{2};
  Visibility v{.T_q = 3, .T_k = 6, .alignment = CausalAlignment::BottomRight, .doc_bounds = &keys,
               .q_doc_bounds = &queries};
  // Bottom-right inside each document: query 0 at 0 + 0 + (4 - 2) = 2, query 1 at 3, query 2 at 4 + 0 + (2 - 1).
  EXPECT_EQ(v.position(0), 2);  // aligned on the whole call it would be 0 + 6 - 3 = 3
  EXPECT_EQ(v.position(1), 3);
  EXPECT_EQ(v.position(2), 5);
  EXPECT_EQ(v.keys(0).begin, 0);
  EXPECT_EQ(v.keys(0).end, 3);
  EXPECT_EQ(v.keys(2).begin, 4);
  EXPECT_EQ(v.keys(2).end, 6);
  EXPECT_EQ(v.query_document(1), 0);
  EXPECT_EQ(v.query_document(2), 1);
  EXPECT_EQ(v.hidden_by(0, 3), "causal");
  EXPECT_EQ(v.hidden_by(2, 3), "document");
  // Top-left inside each document: query 2 at 4 + 0, so it sees key 4 only.
  v.alignment = CausalAlignment::TopLeft;
  EXPECT_EQ(v.position(0), 0);
  EXPECT_EQ(v.position(2), 4);
  EXPECT_EQ(v.keys(2).end, 5);
  // A document without keys (its bound repeated) sees nothing; one without queries is skipped.
  const std::vector<Index> empty_keys{0}, all_queries{3};
  const Visibility w{.T_q = 3, .T_k = 6, .doc_bounds = &empty_keys, .q_doc_bounds = &all_queries};
  for (Index i = 0; i < 3; ++i) EXPECT_TRUE(w.keys(i).empty()) << i;
}

// Query bounds that follow from the positions (the first query of each later document) give every query the
// position, and the keys, it has without them: the derived case is the old one.
TEST(Visibility, derivedQueryBoundsChangeNothing) {
  int checked = 0;
  const std::vector<std::vector<Index>> documents{{}, {2}, {0, 3}, {3, 3, 5}, {1, 2, 4, 9}, {6}};
  for (const Index T_q : {1, 2, 3, 6, 8})
    for (const Index T_k : {1, 2, 4, 6})
      for (const auto a : {CausalAlignment::TopLeft, CausalAlignment::BottomRight})
        for (const bool causal : {true, false})
          for (const auto& bounds : documents) {
            const Visibility v{.T_q = T_q, .T_k = T_k, .alignment = a, .window = 1, .causal = causal, .chunk = 3,
                               .doc_bounds = &bounds};
            std::vector<Index> derived;
            for (Index d = 0; d < Index(bounds.size()); ++d) {
              Index i = 0;
              while (i < T_q && v.query_document(i) <= d) ++i;
              derived.push_back(i);
            }
            Visibility w = v;
            w.q_doc_bounds = &derived;
            for (Index i = 0; i < T_q; ++i, ++checked) {
              ASSERT_EQ(w.position(i), v.position(i)) << "query " << i << " T_q " << T_q << " T_k " << T_k;
              ASSERT_EQ(w.query_document(i), v.query_document(i));
              ASSERT_EQ(w.run(i).begin, v.run(i).begin);
              ASSERT_EQ(w.run(i).end, v.run(i).end);
            }
          }
  EXPECT_GT(checked, 1000);
}

TEST(Options, masksBeyondCausalAreValidatedNamingWhatCame) {
  Tensor<float> q({2, 1, 3, 2}), k({2, 1, 3, 2});
  q.values().setOnes();
  k.values().setOnes();
  const auto message = [&](const AttentionOptions& o) { return error_of(q, k, k, o); };
  EXPECT_NE(message({.doc_bounds = {{1}}}).find("doc_bounds has 1 lists but B = 2"), std::string::npos);
  EXPECT_NE(message({.doc_bounds = {{2, 1}, {}}}).find("doc_bounds[0][1] = 1 is below the bound before it"),
            std::string::npos);
  EXPECT_NE(message({.q_doc_bounds = {{1}, {}}}).find("q_doc_bounds needs doc_bounds"), std::string::npos);
  EXPECT_NE(message({.doc_bounds = {{1}, {}}, .q_doc_bounds = {{1}, {2}}})
                .find("q_doc_bounds[1] has 1 bounds but doc_bounds[1] has 0"),
            std::string::npos);
  EXPECT_NE(message({.doc_bounds = {{1, 2}, {}}, .q_doc_bounds = {{2, 1}, {}}})
                .find("q_doc_bounds[0][1] = 1 is below the bound before it"),
            std::string::npos);
  EXPECT_NE(message({.chunk_size = -1}).find("chunk_size must be >= 0"), std::string::npos);
  EXPECT_NE(message({.prefix_length = -2}).find("prefix_length must be >= 0"), std::string::npos);
  EXPECT_NE(message({.window_right = -1}).find("window_right must be >= 0"), std::string::npos);
}

// A block mask with a hole inside a row, per head: the materialised path, the streamed path and an explicit
// boolean mask of the same cells agree; its block encoding and dense form round-trip; a hidden NaN value never
// reaches an output; bad shapes are refused naming what came.
TEST(Visibility, blockAndDenseMasksHideTheirCellsPerHeadAndEveryPathAgrees) {
  const Index B = 1, H = 2, T = 5;
  DenseMask cells{.B = 1, .H = H, .T_q = T, .T_k = T, .cells = {}};
  for (Index h = 0; h < H; ++h)
    for (Index i = 0; i < T; ++i)
      for (Index j = 0; j < T; ++j) cells.cells.push_back((i + j + h) % 3 != 1);  // gaps in every row
  const BlockMask blocks = block_encoding(cells, 2, 3);
  EXPECT_EQ(blocks.q_blocks, 3);
  EXPECT_EQ(blocks.k_blocks, 2);
  EXPECT_EQ(dense_of(blocks, T, T), cells);
  Tensor<double> q = filled({B, H, T, 2}, 0.3), k = filled({B, H, T, 2}, 1.1), v = filled({B, H, T, 2}, 2.7);
  for (const bool as_blocks : {false, true}) {
    AttentionOptions o;
    o.causal = false;
    if (as_blocks)
      o.block_mask = blocks;
    else
      o.dense_mask = cells;
    Tensor<double> w({1, 1, 1, 1});
    const Tensor<double> full = attention(q, k, v, o, &w), streamed = attention(q, k, v, o);
    for (Index h = 0; h < H; ++h) {
      BoolMask::Array a(T, T);
      for (Index i = 0; i < T; ++i)
        for (Index j = 0; j < T; ++j) a(i, j) = cells.visible(0, h, i, j);
      const HeadTrace<double> want = attend<double>(Matrix<double>(q.head(0, h)), Matrix<double>(k.head(0, h)),
                                                    Matrix<double>(v.head(0, h)), BoolMask(a));
      EXPECT_LE((Matrix<double>(full.head(0, h)) - want.output).cwiseAbs().maxCoeff(), 1e-14) << as_blocks;
      EXPECT_LE((Matrix<double>(streamed.head(0, h)) - want.output).cwiseAbs().maxCoeff(), 1e-14) << as_blocks;
      for (Index i = 0; i < T; ++i)
        for (Index j = 0; j < T; ++j)
          if (!a(i, j)) {
            EXPECT_EQ(w(0, h, i, j), 0.0);
          }
    }
    // Key 1 is hidden from query 0 in head 0 ((0 + 1 + 0) % 3 == 1): a NaN there changes nothing of row 0.
    const Visibility vis = visibility(o, 0, T, T, 0);
    EXPECT_FALSE(vis.visible(0, 1));
    EXPECT_EQ(vis.hidden_by(0, 1), as_blocks ? "block mask" : "dense mask");
    EXPECT_EQ(vis.count(0), 3);
    Tensor<double> v_nan = v;
    v_nan(0, 0, 1, 0) = std::numeric_limits<double>::quiet_NaN();
    const Tensor<double> again = attention(q, k, v_nan, o);
    EXPECT_EQ(again(0, 0, 0, 0), streamed(0, 0, 0, 0));
  }
  const auto message = [&](const AttentionOptions& o) { return error_of(q, k, v, o); };
  AttentionOptions bad;
  bad.dense_mask = cells;
  bad.dense_mask->T_k = 4;
  EXPECT_NE(message(bad).find("T_k differs"), std::string::npos);
  bad = {};
  bad.block_mask = blocks;
  bad.block_mask->k_blocks = 1;
  EXPECT_NE(message(bad).find("has 1 key blocks; T_k = 5 in blocks of 3 needs 2"), std::string::npos);
}

// A tree of draft tokens is the mask of each node's prefix and ancestors, written out by hand here for two entries of
// different lengths (so different prefixes and bitmask row strides); as parents and as a packed bitmask in both bit
// orders it gives what the dense mask of those cells gives, and bad trees are named.
TEST(Visibility, aTreeShowsEachNodeItsPrefixAndItsAncestors) {
  const Index B = 2, H = 1, T_q = 3, T_k = 6;
  Tensor<double> q = filled({B, H, T_q, 2}, 0.3), k = filled({B, H, T_k, 2}, 1.1), v = filled({B, H, T_k, 2}, 2.7);
  AttentionOptions o{.alignment = CausalAlignment::BottomRight};
  o.key_lengths = {6, 5};
  o.tree = TokenTree{.form = TokenTree::Form::parents, .B = B, .T_q = T_q, .parents = {-1, 0, 0, -1, -1, 1}};
  // Entry 0 (6 keys, prefix 0..2, nodes at 3, 4, 5): node 1 and node 2 are children of node 0. Entry 1 (5 keys,
  // prefix 0..1, nodes at 2, 3, 4): nodes 0 and 1 are roots, node 2 a child of node 1.
  const std::vector<std::vector<std::vector<Index>>> sees = {{{0, 1, 2, 3}, {0, 1, 2, 3, 4}, {0, 1, 2, 3, 5}},
                                                             {{0, 1, 2}, {0, 1, 3}, {0, 1, 3, 4}}};
  DenseMask cells{.B = B, .H = 1, .T_q = T_q, .T_k = T_k, .cells = std::vector<std::uint8_t>(B * T_q * T_k, 0)};
  for (Index b = 0; b < B; ++b)
    for (Index i = 0; i < T_q; ++i)
      for (const Index j : sees[b][i]) cells.cells[std::size_t((b * T_q + i) * T_k + j)] = 1;
  for (Index b = 0; b < B; ++b) {
    const Visibility vis = visibility(o, b, T_q, T_k, 0);
    for (Index i = 0; i < T_q; ++i)
      for (Index j = 0; j < T_k; ++j) {
        const bool want = std::count(sees[b][i].begin(), sees[b][i].end(), j) > 0;
        EXPECT_EQ(vis.visible(i, j), want) << b << i << j;
        if (!want && j < o.key_lengths[b]) {
          EXPECT_EQ(vis.hidden_by(i, j), j > vis.position(i) ? "causal" : "tree") << b << i << j;
        }
      }
  }
  AttentionOptions dense{.alignment = CausalAlignment::BottomRight};
  dense.key_lengths = o.key_lengths;
  dense.dense_mask = cells;
  Tensor<double> wd({1, 1, 1, 1});
  const Tensor<double> want = attention(q, k, v, dense, &wd);
  for (const int form : {0, 1, 2}) {  // parents, little-endian bits, big-endian bits
    AttentionOptions t = o;
    if (form > 0) t.tree = packed_tree(*o.tree, {6, 5}, form == 2);
    if (form > 0) EXPECT_EQ(t.tree->offsets, (std::vector<Index>{0, 3, 5}));  // 18 bits, then 15, each from a byte
    Tensor<double> w({1, 1, 1, 1});
    EXPECT_EQ(attention(q, k, v, t, &w).values(), want.values()) << form;
    EXPECT_EQ(w.values(), wd.values()) << form;
    EXPECT_LE((attention(q, k, v, t).values() - want.values()).cwiseAbs().maxCoeff(), 1e-14) << form;
  }
  // Entry 1's first byte (byte 3: entry 0 has 18 bits) holds its cells 0-7: row 0's 1 1 1 0 0, row 1's 1 1 0.
  EXPECT_EQ(packed_tree(*o.tree, {6, 5}, false).bits[3], 0b01100111);  // cell c at bit c
  EXPECT_EQ(packed_tree(*o.tree, {6, 5}, true).bits[3], 0b11100110);   // cell c at bit 7 - c
  const auto message = [&](const AttentionOptions& x) { return error_of(q, k, v, x); };
  AttentionOptions bad = o;
  bad.tree->parents[4] = 1;
  EXPECT_NE(message(bad).find("node 1 of batch entry 1 has parent 1; expected -1 (the prefix) or an earlier node"),
            std::string::npos)
      << message(bad);
  bad = o;
  bad.key_lengths = {6, 2};
  EXPECT_NE(message(bad).find("has 3 nodes but the entry holds 2 keys"), std::string::npos) << message(bad);
  bad = o;
  bad.chunk_size = 2;
  EXPECT_NE(message(bad).find("comes with a right window, a chunk or documents"), std::string::npos) << message(bad);
  bad.chunk_size = 0;
  bad.tree = packed_tree(*o.tree, {6, 5}, false);
  bad.tree->bits.pop_back();
  EXPECT_NE(message(bad).find("bitmask of batch entry 1 starts at byte 3 of 4; expected 2 bytes there"),
            std::string::npos)
      << message(bad);
}

// A window and ALiBi read a node's place, the prefix's length plus its depth, not its index: over a prefix of one key,
// node 0 and node 1 roots and node 2 node 1's child sit at places 1, 1 and 2 (keys 1, 2 and 3 at the same places).
// A window of 0 shows each node itself alone; of 1 also what sits one place back (node 1 the prefix, node 2 its
// parent); ALiBi's distance from node 2 to the prefix is -2 (by index it would be -3). Both forms agree.
TEST(Visibility, aTreeNodeSitsAtThePrefixPlusItsDepth) {
  const Index T_q = 3, T_k = 4;
  AttentionOptions o{.alignment = CausalAlignment::BottomRight};
  o.tree = TokenTree{.form = TokenTree::Form::parents, .B = 1, .T_q = T_q, .parents = {-1, -1, 1}};
  const std::vector<std::vector<std::vector<Index>>> sees = {{{1}, {2}, {3}}, {{0, 1}, {0, 2}, {2, 3}}};
  for (const int form : {0, 1}) {
    AttentionOptions t = o;
    if (form == 1) t.tree = packed_tree(*o.tree, {T_k}, false);
    for (const Index w : {0, 1}) {
      t.window = w;
      const Visibility vis = visibility(t, 0, T_q, T_k, 0);
      EXPECT_EQ(vis.place(0), 1);
      EXPECT_EQ(vis.place(1), 1);
      EXPECT_EQ(vis.place(2), 2);
      EXPECT_EQ(vis.key_place(3), 2);
      for (Index i = 0; i < T_q; ++i)
        for (Index j = 0; j < T_k; ++j) {
          const auto& row = sees[std::size_t(w)][std::size_t(i)];
          const bool want = std::count(row.begin(), row.end(), j) > 0;
          EXPECT_EQ(vis.visible(i, j), want) << form << w << i << j;
          if (!want && t.tree->sees(0, i, j, T_k)) {
            EXPECT_EQ(vis.hidden_by(i, j), "window") << form << w << i << j;
          }
        }
    }
    t.window.reset();
    t.alibi_slopes = {0.5};
    const HeadModifiers m = head_modifiers(t, 0, 0, T_q, T_k);
    EXPECT_EQ(m.alibi_distance(2, 0), -2) << form;
    EXPECT_EQ(m.alibi_distance(2, 2), -1) << form;
    EXPECT_EQ(m.alibi_distance(1, 0), -1) << form;
  }
}

}  // namespace
}  // namespace attncheck
