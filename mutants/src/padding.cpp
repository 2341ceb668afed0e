// Mutants whose mistake is in key padding or the sliding window, the equivalent controls, and correct kernels
// that return NaN for rows that see no key (the nan convention, declared and undeclared).
#include <algorithm>
#include <limits>

#include "parts.hpp"

namespace attncheck::zoo {
namespace {

// What these kernels declare: the zoo's contract plus key lengths, and the window when `window`.
Capabilities padding_capabilities(bool window) {
  Capabilities c = zoo_capabilities();
  c.features.add(Feature::key_padding);
  c.features.set(Feature::window, window);
  return c;
}

// A length read from the wrong place: batch entry b uses the next entry's length, as a loop over cu_seqlens
// that reads cu[b + 2] - cu[b + 1] does.
ImplementationPtr length_from_next_entry() {
  return make_implementation(
      "mutant:padding-wrong-entry", "each batch entry's key length read from the next entry",
      padding_capabilities(false), [](const Problem& p) {
        return run_typed(p, [&](const auto& q, const auto& k, const auto& v, const Problem& pr, auto* w) {
          using A = Acc<typename std::decay_t<decltype(q)>::Scalar>;
          return per_head(q, k, v, pr, w,
                          [&](const Matrix<A>& Q, const Matrix<A>& K, const Matrix<A>& V, const HeadCtx& c) {
                            HeadCtx wrong = c;
                            if (!pr.key_lengths.empty())
                              wrong.key_length = pr.key_lengths[std::size_t((c.b + 1) % c.B)];  // should be c.b
                            const Visibility vis = wrong.visibility();
                            return attend_where<A>(scores(Q, K, c.resolved_scale()), V,
                                                   [&](Index i, Index j) { return vis.visible(i, j); });
                          });
        });
      });
}

// The window rule of a tiled kernel that masks only inside the diagonal tile (the key tile that holds the
// query's own position) and treats every earlier tile as fully visible, as a causal-only kernel may.
constexpr Index kWindowTile = 2;  // small, so that short sequences already have a tile before the diagonal one

// Varlen packing done right, written apart from the reference: each sequence's keys cut to its length, and
// each query's key range [max(0, p - w), min(p, len - 1)] computed directly, with matrix products over it.
struct PackedRange {
  template <class A>
  HeadOut<A> operator()(const Matrix<A>& Q, const Matrix<A>& K, const Matrix<A>& V, const HeadCtx& c) const {
    const Index len = c.key_length < 0 ? c.T_k : c.key_length;
    const Index shift = c.alignment == CausalAlignment::BottomRight ? c.T_k - c.T_q : 0;
    HeadOut<A> r{Matrix<A>::Zero(c.T_q, c.T_k), Matrix<A>::Zero(c.T_q, c.D)};
    for (Index i = 0; i < c.T_q; ++i) {
      const Index p = i + shift, hi = std::min(p, len - 1);
      const Index lo = c.window ? std::max<Index>(0, p - *c.window) : 0;
      if (hi < lo) continue;  // nothing visible: zero weights, zero output
      const Index n = hi - lo + 1;
      Eigen::Matrix<A, 1, Eigen::Dynamic> s = Q.row(i) * K.middleRows(lo, n).transpose();
      s *= static_cast<A>(c.resolved_scale());
      const Eigen::Matrix<A, 1, Eigen::Dynamic> e = (s.array() - s.maxCoeff()).exp().matrix();
      const Eigen::Matrix<A, 1, Eigen::Dynamic> wt = e / e.sum();
      r.weights.row(i).segment(lo, n) = wt;
      r.output.row(i) = wt * V.middleRows(lo, n);
    }
    return r;
  }
};

// The reference, except that a row that sees no key returns NaN (output and weights), as PyTorch's math path
// does: correct under the nan convention, whether it declares it or not.
ImplementationPtr nan_for_empty_rows(std::string name, std::string description, std::optional<EmptyRows> declared) {
  Capabilities caps = reference_implementation()->capabilities();
  // No sinks: a row with a sink always has a softmax term (its output is 0, the sink takes every weight), so
  // the nan convention does not reach it; this control turns every row without a key into NaN.
  caps.features.remove(Feature::sinks);
  caps.features.remove(Feature::paged);  // a dense kernel
  caps.features.remove(Feature::dropout);  // a control of rows without keys, not of dropout
  // A control of the empty-row convention, on the contiguous families:
  caps.features.remove({Feature::block_mask, Feature::dense_mask});
  caps.features.remove(Feature::v_head_dim);  // as the zoo's other controls: one head dimension
  caps.empty_rows = declared;
  caps.features.remove(Feature::backward);  // a forward-only control
  return make_implementation(std::move(name), std::move(description), caps, [](const Problem& p) {
    Outcome o = reference_implementation()->forward(p);
    const double nan = std::numeric_limits<double>::quiet_NaN();
    const Shape& s = p.q.shape();
    for (Index b = 0; b < s.B; ++b) {
      for (Index h = 0; h < s.H; ++h)
        for (Index i = 0; i < s.T; ++i)
          if (p.visibility(b, h).keys(i).empty()) {
            o.output.head(b, h).row(i).setConstant(nan);
            if (o.weights) o.weights->head(b, h).row(i).setConstant(nan);
          }
    }
    return o;
  });
}

}  // namespace

std::vector<Mutant> padding_mutants() {
  std::vector<Mutant> z;

  // A padding mask built from key_padding_mask but applied along the query axis (the [B,T] mask broadcast as
  // [B,1,T,1] instead of [B,1,1,T]).
  z.push_back(Mutant{
      .impl = head_impl(
          "mutant:padding-on-queries", "key padding applied to the queries instead of the keys",
          [](const auto& Q, const auto& K, const auto& V, const HeadCtx& c) {
            using A = Scalar<decltype(Q)>;
            HeadCtx causal = c;
            causal.key_length = -1;
            const Visibility vis = causal.visibility();
            return attend_where<A>(scores(Q, K, c.resolved_scale()), V, [&](Index i, Index j) {
              return vis.visible(i, j) && (c.key_length < 0 || i < c.key_length);  // should be j < key_length
            });
          },
          padding_capabilities(false)),
      .bug = "the padding mask is applied to the queries instead of the keys: padded keys keep their weight, and "
             "queries past the length get a zero row",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "query 0 must see a padded key and keep its own row: T_q = 1, T_k = 2 bottom-right (query 0 "
                     "sits at position 1) with length 1, so key 1 is padding but query 0 < 1 is not masked",
      .killed_by = {"key-padding-invariance", "zero-future-weight", "varlen-equivalence"},
  });

  z.push_back(Mutant{
      .impl = length_from_next_entry(),
      .bug = "a sequence's length is read from the wrong batch entry (the next one): it sees the other sequence's "
             "padding as real keys, or loses real keys",
      .minimal_shape = {2, 1, 1, 1},
      .why_minimal = "two batch entries with different lengths (B = 2), one query and one key each: entry 0 of "
                     "length 0 reads entry 1's length 1 and gives padded key 0 weight 1",
      .killed_by = {"key-padding-invariance", "zero-future-weight", "varlen-equivalence"},
  });

  // BERT's extended attention mask for padding, (1 - mask) * -10000, with a correct -inf causal mask; values
  // are mixed over the causally visible keys, padded ones included.
  z.push_back(Mutant{
      .impl = head_impl(
          "mutant:padding-minus-1e4", "padded keys masked with a finite -1e4 (BERT style)",
          [](const auto& Q, const auto& K, const auto& V, const HeadCtx& c) {
            using A = Scalar<decltype(Q)>;
            HeadCtx causal = c;
            causal.key_length = -1;
            const Visibility vis = causal.visibility();
            Matrix<A> s = scores(Q, K, c.resolved_scale());
            for (Index i = 0; i < s.rows(); ++i)
              for (Index j = 0; j < s.cols(); ++j)
                if (!vis.visible(i, j))
                  s(i, j) = -std::numeric_limits<A>::infinity();
                else if (c.key_length >= 0 && j >= c.key_length)
                  s(i, j) += A(-1e4);  // should be -inf
            return attend_where<A>(s, V, [&](Index i, Index j) { return vis.visible(i, j); });
          },
          padding_capabilities(false)),
      .bug = "padded keys masked with a finite -1e4: a sequence of length 0 spreads its weight over its padding, "
             "and a NaN in a padded value reaches the output through its tiny weight",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "one query and one key that is padding (length 0): the query should see nothing, and puts "
                     "weight 1 on the padded key",
      .killed_by = {"key-padding-invariance", "zero-future-weight", "empty-row-convention"},
  });

  // `j >= p - w - 1` where `j >= p - w` was meant (FlashAttention's window_size counts the keys besides the
  // query's own).
  z.push_back(Mutant{
      .impl = head_impl(
          "mutant:window-too-wide", "the sliding window lets one key too many in",
          [](const auto& Q, const auto& K, const auto& V, const HeadCtx& c) {
            using A = Scalar<decltype(Q)>;
            HeadCtx wide = c;
            if (wide.window) ++*wide.window;  // off by one
            const Visibility vis = wide.visibility();
            return attend_where<A>(scores(Q, K, c.resolved_scale()), V,
                                   [&](Index i, Index j) { return vis.visible(i, j); });
          },
          padding_capabilities(true)),
      .bug = "the window is one key too wide: the query at position p also sees key p - w - 1",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "window 0 and one key before the query's position: T_q = 1, T_k = 2 bottom-right (query 0 "
                     "at position 1 must see only key 1 and sees key 0 too)",
      .killed_by = {"window-zero-weight", "window-perturbation", "oracle-agreement"},
  });

  // The window measured from the query's row index, which is its position only under top-left alignment.
  z.push_back(Mutant{
      .impl = head_impl(
          "mutant:window-from-query-index", "the window measured from the query index, not its aligned position",
          [](const auto& Q, const auto& K, const auto& V, const HeadCtx& c) {
            using A = Scalar<decltype(Q)>;
            HeadCtx unwindowed = c;
            unwindowed.window.reset();
            const Visibility vis = unwindowed.visibility();
            return attend_where<A>(scores(Q, K, c.resolved_scale()), V, [&](Index i, Index j) {
              return vis.visible(i, j) && (!c.window || j >= i - *c.window);  // should be vis.position(i) - w
            });
          },
          padding_capabilities(true)),
      .bug = "when T_q != T_k, the window is measured from the query index i instead of its aligned position "
             "i + T_k - T_q (bottom-right): too wide when T_k > T_q, too narrow when T_q > T_k",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "index and position differ only under bottom-right with T_q != T_k: T_q = 1, T_k = 2, window "
                     "0, where query 0 at position 1 must see only key 1 and sees key 0 too",
      .killed_by = {"window-zero-weight", "window-perturbation", "oracle-agreement"},
  });

  z.push_back(Mutant{
      .impl = head_impl(
          "mutant:window-diagonal-tile-only", "the window applied only inside the diagonal tile of a tiled kernel",
          [](const auto& Q, const auto& K, const auto& V, const HeadCtx& c) {
            using A = Scalar<decltype(Q)>;
            const Visibility vis = c.visibility();
            HeadCtx unwindowed = c;
            unwindowed.window.reset();
            const Visibility causal = unwindowed.visibility();
            return attend_where<A>(scores(Q, K, c.resolved_scale()), V, [&](Index i, Index j) {
              const Index p = vis.position(i);
              // the diagonal tile is masked in full; tiles before it only for causality and padding
              return p >= 0 && j / kWindowTile == p / kWindowTile ? vis.visible(i, j) : causal.visible(i, j);
            });
          },
          padding_capabilities(true)),
      .bug = "the window is applied only inside the diagonal tile (key tiles of 2): keys older than the window in "
             "earlier tiles keep their weight",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "a key older than the window in a tile before the query's: T_q = 1, T_k = 3 bottom-right, "
                     "window 0 (query 0 at position 2, in the second tile, sees keys 0 and 1 too)",
      .killed_by = {"window-zero-weight", "window-perturbation", "oracle-agreement"},
  });

  z.push_back(Mutant{
      .impl = head_impl("control:varlen-packed",
                        "each sequence cut to its length, each query's key range computed directly (varlen packing)",
                        PackedRange{}, padding_capabilities(true)),
      .bug = "control: varlen packing: keys cut to each sequence's length, a query's window range computed "
             "directly and reduced with matrix products",
      .control = true,
      .minimal_shape = {},
      .why_minimal = "a control: no case should fail",
      .killed_by = {},
  });

  z.push_back(Mutant{
      .impl = nan_for_empty_rows("control:empty-rows-nan",
                                 "the reference, but a row that sees no key returns NaN (declares the nan convention)",
                                 EmptyRows::nan),
      .bug = "control: rows that see no key return NaN, output and weights, as PyTorch's math path; declared",
      .control = true,
      .minimal_shape = {},
      .why_minimal = "a control: no case should fail",
      .killed_by = {},
  });

  z.push_back(Mutant{
      .impl = nan_for_empty_rows("control:empty-rows-nan-undeclared",
                                 "the reference, but a row that sees no key returns NaN (declares no convention)",
                                 std::nullopt),
      .bug = "control: rows that see no key return NaN, and no convention is declared: either is accepted, and "
             "the empty-row-convention result says which one it follows",
      .control = true,
      .minimal_shape = {},
      .why_minimal = "a control: no case should fail",
      .killed_by = {},
  });
  return z;
}

}  // namespace attncheck::zoo
