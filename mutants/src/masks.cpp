// Mutants whose mistake is in the causal mask: its fill value, direction, extent, broadcast or alignment.
// Kernels with a -inf mask mix values over the keys their own rule lets through (attend_where), so the rule
// is their only bug; the 0-filled and additive ones use the plain product weights·V, as such code does.
#include <limits>

#include "parts.hpp"

namespace attncheck::zoo {
namespace {

// The common tail of the mask mutants: softmax over keys, then the plain product.
template <class A>
HeadOut<A> softmax_then_product(const Matrix<A>& z, const Matrix<A>& V) {
  HeadOut<A> r;
  r.weights = softmax_rows(z);
  r.output = r.weights * V;
  return r;
}

// Causal attention with a [B,H,T_q,T_k] visibility buffer (1 = may look) that starts all-visible and gets
// the [T_q,T_k] causal pattern copied in along one axis only: the author expanded a [B,1,T,T] mask into
// head 0 of every batch, or a [1,H,T,T] mask into every head of batch 0, expecting the rest to broadcast.
enum class FilledAlong { head0_of_each_batch, batch0_each_head };

ImplementationPtr partly_expanded_mask(std::string name, std::string description, FilledAlong along) {
  return make_implementation(std::move(name), std::move(description), zoo_capabilities(), [along](const Problem& p) {
    return run_typed(p, [&](const auto& q, const auto& k, const auto& v, const Problem& pr, auto* w) {
      using A = Acc<typename std::decay_t<decltype(q)>::Scalar>;
      const Index B = q.shape().B, H = q.shape().H, T_q = q.shape().T, T_k = k.shape().T;
      std::vector<char> visible(static_cast<size_t>(B * H * T_q * T_k), 1);
      const auto at = [&](Index b, Index h, Index i, Index j) {
        return static_cast<size_t>(((b * H + h) * T_q + i) * T_k + j);
      };
      const auto fill = [&](Index b, Index h) {
        for (Index i = 0; i < T_q; ++i)
          for (Index j = 0; j < T_k; ++j) visible[at(b, h, i, j)] = j <= last_visible_key(i, T_q, T_k, pr.alignment);
      };
      if (along == FilledAlong::head0_of_each_batch)
        for (Index b = 0; b < B; ++b) fill(b, 0);
      else
        for (Index h = 0; h < H; ++h) fill(0, h);
      return per_head(q, k, v, pr, w,
                      [&](const Matrix<A>& Q, const Matrix<A>& K, const Matrix<A>& V, const HeadCtx& c) {
                        return attend_where(scores(Q, K, c.resolved_scale()), V,
                                            [&](Index i, Index j) { return visible[at(c.b, c.h, i, j)] != 0; });
                      });
    });
  });
}

}  // namespace

std::vector<Mutant> mask_mutants() {
  std::vector<Mutant> z;

  // "Fill the future with 0": the author read "mask out" as "zero out" and zeroed the scores.
  z.push_back(Mutant{
      .impl = head_impl("mutant:mask-zero", "masked scores filled with 0 instead of -inf",
                        [](const auto& Q, const auto& K, const auto& V, const HeadCtx& c) {
                          using A = Scalar<decltype(Q)>;
                          Matrix<A> s = scores(Q, K, c.resolved_scale());
                          for (Index i = 0; i < s.rows(); ++i)
                            for (Index j = 0; j < s.cols(); ++j)
                              if (!c.visible(i, j)) s(i, j) = A(0);
                          return softmax_then_product(s, V);
                        }),
      .bug = "mask filled with 0 instead of -inf: exp(0) gives every future key a weight",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal =
          "one query and one future key: T_q = 1, T_k = 2 (top-left); even all-zero q and k give key 1 weight 1/2",
      .killed_by = {"zero-future-weight", "causal-perturbation", "oracle-agreement"},
  });

  // Upper triangle instead of lower: the author masked j < i (the past) instead of j > i.
  z.push_back(Mutant{
      .impl = head_impl("mutant:anti-causal", "mask direction reversed: each query sees the future, not the past",
                        [](const auto& Q, const auto& K, const auto& V, const HeadCtx& c) {
                          using A = Scalar<decltype(Q)>;
                          return attend_where<A>(scores(Q, K, c.resolved_scale()), V,
                                                 [](Index i, Index j) { return j >= i; });  // should be j <= i
                        }),
      .bug = "mask direction reversed (anti-causal): keys j < i are masked instead of j > i",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "query 0 must have a key after it: T_q = 1, T_k = 2 (top-left); with one key the reversed "
                     "triangle is still the diagonal",
      .killed_by = {"zero-future-weight", "causal-perturbation"},
  });

  // torch.triu(ones, diagonal=0) where diagonal=1 was meant: the diagonal is masked too.
  z.push_back(Mutant{
      .impl = head_impl("mutant:diagonal-masked", "off by one: the diagonal is masked, a query cannot see itself",
                        [](const auto& Q, const auto& K, const auto& V, const HeadCtx& c) {
                          using A = Scalar<decltype(Q)>;
                          const Index offset = c.alignment == CausalAlignment::BottomRight ? c.T_k - c.T_q : 0;
                          return attend_where<A>(scores(Q, K, c.resolved_scale()), V,
                                                 [&](Index i, Index j) { return j < i + offset; });  // should be <=
                        }),
      .bug = "off by one: `j >= i` masked instead of `j > i`, so query 0 sees nothing and gets a zero row",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "already at T = 1 query 0 loses its only key: weights 0 and output 0 instead of v0",
      .killed_by = {"first-position", "row-stochastic", "oracle-agreement"},
  });

  // torch.triu(ones, diagonal=2): one step of look-ahead.
  z.push_back(Mutant{
      .impl = head_impl("mutant:look-ahead", "off by one: each query also sees the next key",
                        [](const auto& Q, const auto& K, const auto& V, const HeadCtx& c) {
                          using A = Scalar<decltype(Q)>;
                          const Index offset = c.alignment == CausalAlignment::BottomRight ? c.T_k - c.T_q : 0;
                          return attend_where<A>(scores(Q, K, c.resolved_scale()), V,
                                                 [&](Index i, Index j) { return j <= i + offset + 1; });
                        }),
      .bug = "off by one: `j > i + 1` masked instead of `j > i`, one step of look-ahead",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "query 0 needs the next key to peek at: T_q = 1, T_k = 2 (top-left)",
      .killed_by = {"zero-future-weight", "causal-perturbation"},
  });

  // BERT's extended attention mask: (1 - visible) * -10000 added to the scores.
  z.push_back(Mutant{
      .impl = head_impl("mutant:mask-minus-1e4", "additive mask with -1e4 instead of -inf (BERT style)",
                        [](const auto& Q, const auto& K, const auto& V, const HeadCtx& c) {
                          using A = Scalar<decltype(Q)>;
                          Matrix<A> s = scores(Q, K, c.resolved_scale());
                          for (Index i = 0; i < s.rows(); ++i)
                            for (Index j = 0; j < s.cols(); ++j) s(i, j) += c.visible(i, j) ? A(0) : A(-1e4);
                          return softmax_then_product(s, V);
                        }),
      .bug = "a finite mask value -1e4 added to the scores: leaks once a future score exceeds a visible one by "
             "~1e4 (easy in half, whose inputs reach 65504), and 0*NaN from a future value reaches the output",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "query 0 and one future key (T_q = 1, T_k = 2, top-left): a NaN in v1 reaches output 0 through "
                     "0*NaN, or a future score 1e4 above the visible one takes the weight",
      .killed_by = {"strict-causality-nonfinite", "causal-perturbation"},
  });

  // masked_fill(~mask, finfo(dtype).min): finite, so a row with nothing visible becomes uniform.
  z.push_back(Mutant{
      .impl = head_impl("mutant:mask-lowest", "masked scores filled with the input dtype's lowest finite value",
                        [](const auto& Q, const auto& K, const auto& V, const HeadCtx& c) {
                          using A = Scalar<decltype(Q)>;
                          // lowest of the *input* dtype, as torch.finfo(q.dtype).min: -65504 for half
                          const A fill = A(-max_finite(c.dtype));
                          Matrix<A> s = scores(Q, K, c.resolved_scale());
                          for (Index i = 0; i < s.rows(); ++i)
                            for (Index j = 0; j < s.cols(); ++j)
                              if (!c.visible(i, j)) s(i, j) = fill;
                          HeadOut<A> r;
                          r.weights = softmax_rows(s);
                          r.output = mix_visible(r.weights, V, c);  // the loop over visible keys is right
                          return r;
                        }),
      .bug = "masked scores filled with the dtype's lowest finite value: a query with no visible key "
             "(bottom-right, T_q > T_k) spreads its weight uniformly over keys it must not see; in half "
             "(-65504) a visible score below the fill loses to the masked ones",
      .minimal_shape = {1, 1, 2, 1},
      .why_minimal =
          "in float32 the fill only shows when a query sees no key at all: bottom-right with T_q = 2 > T_k = 1 (query "
          "0 then puts weight 1 on key 0); in half, T_q = 1, T_k = 2 with a visible score below -65504 also shows it",
      .killed_by = {"zero-future-weight", "empty-row-convention"},
  });

  // The additive -inf mask is right, but weights·V runs over every key, as the reference's additive path.
  z.push_back(Mutant{
      .impl = head_impl("mutant:additive-nan-leak", "additive -inf mask and a plain weights·V over all keys",
                        [](const auto& Q, const auto& K, const auto& V, const HeadCtx& c) {
                          using A = Scalar<decltype(Q)>;
                          Matrix<A> s = scores(Q, K, c.resolved_scale());
                          for (Index i = 0; i < s.rows(); ++i)
                            for (Index j = 0; j < s.cols(); ++j)
                              s(i, j) += c.visible(i, j) ? A(0) : -std::numeric_limits<A>::infinity();
                          return softmax_then_product(s, V);
                        }),
      .bug = "additive -inf mask then a plain weights·V: a NaN/Inf future value reaches earlier outputs "
             "through 0*NaN, and an Inf future score through inf + (-inf)",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal =
          "query 0 and one future key (T_q = 1, T_k = 2, top-left): one NaN or Inf in v1 (or k1) makes output 0 NaN",
      .killed_by = {"strict-causality-nonfinite", "causal-perturbation"},
  });

  // Written against PyTorch's is_causal: the requested alignment is never read.
  z.push_back(Mutant{
      .impl = head_impl("mutant:alignment-ignored", "always top-left causal alignment, whatever was asked",
                        [](const auto& Q, const auto& K, const auto& V, const HeadCtx& c) {
                          using A = Scalar<decltype(Q)>;
                          // c.alignment is never read: query i sees keys j <= i whatever was asked
                          return attend_where<A>(scores(Q, K, c.resolved_scale()), V,
                                                 [](Index i, Index j) { return j <= i; });
                        }),
      .bug = "top-left vs bottom-right mixed up: bottom-right requests get the top-left mask when T_q != T_k",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "the alignments differ only when T_q != T_k: T_q = 1 and T_k = 2 under bottom-right, where query "
                     "0 must see both keys and sees only key 0",
      .killed_by = {"oracle-agreement", "zero-future-weight"},
  });

  z.push_back(Mutant{
      .impl = partly_expanded_mask("mutant:mask-head0-only", "causal mask expanded into head 0 of each batch only",
                                   FilledAlong::head0_of_each_batch),
      .bug = "mask broadcast over the wrong axis: only head 0 (of each batch) is masked, every other head sees "
             "the future",
      .minimal_shape = {1, 2, 1, 1},
      .why_minimal =
          "head 0 is masked correctly, so H = 2; head 1's query 0 needs a future key: T_q = 1, T_k = 2 (top-left)",
      .killed_by = {"zero-future-weight", "causal-perturbation"},
  });

  z.push_back(Mutant{
      .impl = partly_expanded_mask("mutant:mask-batch0-only", "causal mask expanded into batch 0 (every head) only",
                                   FilledAlong::batch0_each_head),
      .bug = "mask broadcast over the wrong axis: only batch 0 is masked, every other batch sees the future",
      .minimal_shape = {2, 1, 1, 1},
      .why_minimal =
          "batch 0 is masked correctly, so B = 2; batch 1's query 0 needs a future key: T_q = 1, T_k = 2 (top-left)",
      .killed_by = {"zero-future-weight", "causal-perturbation"},
  });
  return z;
}

}  // namespace attncheck::zoo
