// Kernels for V with a head dimension of its own (D_v != D, MLA's 576 and 512; Feature::v_head_dim), with
// the mistakes of a kernel written for one head_dim: V read with K's row length, the output's columns counted
// by D, the default scale taken from D_v; and a control that mixes V's columns in two blocks. Each is a correct
// head (the reference's visibility, softmax and weights) but for its one mistake.
#include <algorithm>

#include "parts.hpp"

namespace attncheck::zoo {
namespace {

Capabilities v_head_dim_capabilities() {
  Capabilities c = gqa_capabilities();
  c.features.add(Feature::v_head_dim);
  return c;
}

// A correct head at scale `scale` whose values are mixed by `mix(weights, V, ctx)`.
template <class Mix>
auto head_with(Mix mix, bool scale_from_v = false) {
  return [mix, scale_from_v](const auto& Q, const auto& K, const auto& V, const HeadCtx& c) {
    using A = Scalar<decltype(Q)>;
    const double scale = c.scale ? *c.scale : 1.0 / std::sqrt(double(scale_from_v ? V.cols() : Q.cols()));
    HeadOut<A> r;
    r.weights = softmax_rows<A>(causal_select<A>(scores(Q, K, scale), c));
    r.output = mix(r.weights, V, c);
    return r;
  };
}

// V [T_k,D_v] as a kernel reads it when it takes element (j, c) at j·D + c of V's contiguous buffer (K's row
// length): right for row 0, and for every row when D_v = D. Past the buffer's end it reads 0 (a zeroed arena).
template <class A>
Matrix<A> v_with_k_rows(const Matrix<A>& V, Index D) {
  Matrix<A> r(V.rows(), V.cols());
  const Index n = V.size();
  for (Index j = 0; j < V.rows(); ++j)
    for (Index c = 0; c < V.cols(); ++c) {
      const Index at = j * D + c;
      r(j, c) = at < n ? V.data()[at] : A(0);  // V is row-major: data()[j·D_v + c] is V(j, c)
    }
  return r;
}

}  // namespace

std::vector<Mutant> head_dim_mutants() {
  std::vector<Mutant> z;
  const Capabilities caps = v_head_dim_capabilities();
  z.push_back(Mutant{
      .impl = head_impl("mutant:v-rows-of-k-length", "V's rows read D (K's head dimension) apart instead of D_v",
                        head_with([](const auto& W, const auto& V, const HeadCtx& c) {
                          return mix_visible(W, v_with_k_rows(V, c.D), c);
                        }),
                        caps),
      .bug = "V addressed with K's row length: value row j read at j*D instead of j*D_v, right only when D_v = D",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "row 0 is read right, so two keys a query weighs (one query, bottom-right), and D_v != D: D = 1 "
                     "with D_v = 2, or as small D = 2 with D_v = 1",
      .killed_by = {"oracle-agreement", "convex-hull"},
      .also_minimal = {{1, 1, 1, 2}},
  });
  z.push_back(Mutant{
      .impl = head_impl("mutant:output-columns-of-d", "the output's columns counted by D: columns past D stay 0",
                        head_with([](const auto& W, const auto& V, const HeadCtx& c) {
                          auto out = mix_visible(W, V, c);
                          for (Index col = c.D; col < out.cols(); ++col) out.col(col).setZero();
                          return out;
                        }),
                        caps),
      .bug = "the P·V loop runs over D columns: with D_v > D the output's last D_v - D columns are never written (0)",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "one query, one key, D = 1 and D_v = 2: output column 1 must be v[0][1]",
      .killed_by = {"oracle-agreement", "first-position"},
  });
  z.push_back(Mutant{
      .impl = head_impl("mutant:scale-from-v-head-dim", "default scale 1/sqrt(D_v) instead of 1/sqrt(D)",
                        head_with([](const auto& W, const auto& V, const HeadCtx& c) { return mix_visible(W, V, c); },
                                  /*scale_from_v=*/true),
                        caps),
      .bug = "the default scale from V's head dimension, 1/sqrt(D_v) (MLA's 128) instead of Q's and K's 1/sqrt(D) "
             "(192), right only when D_v = D",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "D_v != D (D = 1 with D_v = 2, or as small D = 2 with D_v = 1), and the scale matters only when "
                     "one query weighs two keys: T_q = 1, T_k = 2 under bottom-right",
      .killed_by = {"oracle-agreement"},
      .also_minimal = {{1, 1, 1, 2}},
  });
  z.push_back(Mutant{
      .impl = head_impl("control:v-columns-in-blocks", "correct; V's columns mixed in two blocks",
                        head_with([](const auto& W, const auto& V, const HeadCtx& c) {
                          using A = Scalar<decltype(W)>;
                          const Index half = V.cols() / 2;
                          Matrix<A> out(W.rows(), V.cols());
                          out.leftCols(half) = mix_visible(W, Matrix<A>(V.leftCols(half)), c);
                          out.rightCols(V.cols() - half) = mix_visible(W, Matrix<A>(V.rightCols(V.cols() - half)), c);
                          return out;
                        }),
                        caps),
      .bug = "none: the output's columns as two products, V's first half and the rest",
      .control = true,
      .minimal_shape = {},
      .why_minimal = "a control: no case should fail",
      .killed_by = {},
  });
  return z;
}

}  // namespace attncheck::zoo
