// Controls for the laws' exact comparisons: correct kernels that do other arithmetic than the reference where a
// law once demanded bit-identity, as real code does. FlashAttention's test reference returns -0 for a row that sees
// no key (0 times a negative value), and gpt-oss and Hugging Face append the sink as one more softmax column, a
// reduction of another length. No law may fail on them (the paged and strided controls of this kind sit beside
// their families, in paged.cpp and strides.cpp).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "parts.hpp"

namespace attncheck::zoo {
namespace {

// The output as a dense product weights · V over every key, each sum started from its first product (a GEMM's
// accumulator is loaded with it, not with +0): a row whose weights are all 0 sums 0 · v_jc, which is -0 where
// every v_jc is negative, while the reference (and a kernel that starts from +0 or skips hidden keys) returns +0.
struct DenseProductFromFirstTerm {
  template <class A>
  HeadOut<A> operator()(const Matrix<A>& Q, const Matrix<A>& K, const Matrix<A>& V, const HeadCtx& c) const {
    HeadOut<A> r;
    r.weights = softmax_rows(causal_select(scores(Q, K, c.resolved_scale()), c));
    r.output.resize(c.T_q, V.cols());
    for (Index i = 0; i < c.T_q; ++i)
      for (Index d = 0; d < V.cols(); ++d) {
        A acc = r.weights(i, 0) * V(0, d);
        for (Index j = 1; j < c.T_k; ++j) acc += r.weights(i, j) * V(j, d);
        r.output(i, d) = acc;
      }
    return r;
  }
};

// A sum of n terms as a vectorised reduction groups it: halves split at ceil(n/2), recursively, so the grouping of
// the same terms changes with n (five terms, the last 0, are ((x0 + x1) + x2) + x3, where four are
// (x0 + x1) + (x2 + x3)).
template <class A>
A pairwise_sum(const A* x, Index n) {
  if (n <= 0) return A(0);
  if (n == 1) return x[0];
  const Index half = (n + 1) / 2;
  return pairwise_sum(x, half) + pairwise_sum(x + half, n - half);
}

// gpt-oss's and Hugging Face's sink attention: the sink logit appended to every row's scores as one more column
// (T_k + 1 of them), the softmax over all of them, and the sink's column dropped before the product with V. The
// row sum is a pairwise reduction over the row's T_k or T_k + 1 exponentials, so a sink of -inf (an exact 0 in the
// last column) is the plain call mathematically but grouped otherwise: 1 ulp apart for some rows.
struct SinkColumn {
  template <class A>
  HeadOut<A> operator()(const Matrix<A>& Q, const Matrix<A>& K, const Matrix<A>& V, const HeadCtx& c) const {
    const A neg_inf = -std::numeric_limits<A>::infinity();
    const Matrix<A> z = causal_select(scores(Q, K, c.resolved_scale()), c);
    const Index cols = c.T_k + (c.sink ? 1 : 0);
    HeadOut<A> r{Matrix<A>::Zero(c.T_q, c.T_k), Matrix<A>::Zero(c.T_q, V.cols())};
    std::vector<A> row(static_cast<std::size_t>(cols));
    for (Index i = 0; i < c.T_q; ++i) {
      for (Index j = 0; j < c.T_k; ++j) row[std::size_t(j)] = z(i, j);
      if (c.sink) row[std::size_t(c.T_k)] = static_cast<A>(*c.sink);
      const A m = *std::max_element(row.begin(), row.end());
      if (m == neg_inf) continue;  // no key and no (finite) sink: a zero row
      for (A& x : row) x = std::exp(x - m);
      const A l = pairwise_sum(row.data(), cols);
      for (Index j = 0; j < c.T_k; ++j) r.weights(i, j) = row[std::size_t(j)] / l;
    }
    r.output = mix_visible(r.weights, V, c);
    return r;
  }
};

}  // namespace

std::vector<Mutant> exactness_controls() {
  std::vector<Mutant> z;
  // Not select-safe (0 · NaN in a hidden value is NaN, as in FlashAttention's reference), with padding and windows so
  // that rows which see no key come up.
  Capabilities zeros = gqa_capabilities();
  zeros.nonfinite_safe = false;
  zeros.features.add({Feature::key_padding, Feature::window});
  z.push_back(Mutant{
      .impl = head_impl(
          "control:signed-zeros", "correct; output as weights · V over every key, each sum from its first product",
          [](const auto& Q, const auto& K, const auto& V, const HeadCtx& c) {
            return DenseProductFromFirstTerm{}(Q, K, V, c);
          },
          zeros),
      .bug = "control: the output as the dense product weights · V (FlashAttention's attention_ref), each sum started "
             "from its first product: a row that sees no key returns 0 · v, -0 where the values are negative",
      .control = true,
      .minimal_shape = {},
      .why_minimal = "a control: no case should fail",
      .killed_by = {},
  });
  z.push_back(Mutant{
      .impl = head_impl(
          "control:sink-column", "correct; the sink appended as a softmax column, rows summed pairwise",
          [](const auto& Q, const auto& K, const auto& V, const HeadCtx& c) { return SinkColumn{}(Q, K, V, c); },
          abi3_capabilities({.sinks = true})),
      .bug = "control: the sink appended to every row as one more softmax column (gpt-oss, Hugging Face) and the row "
             "summed pairwise, so sinks of -inf reduce T_k + 1 terms where no sinks reduce T_k",
      .control = true,
      .minimal_shape = {},
      .why_minimal = "a control: no case should fail",
      .killed_by = {},
  });
  return z;
}

}  // namespace attncheck::zoo
