// Backward passes under the nan empty-row convention (PyTorch's math path, torch.nn.MultiheadAttention): a row
// that sees no key returns NaN, and its gradient is that convention's business. One control, whose NaN stays in
// that row's dQ, and one mutant, whose NaN reaches dK and dV of keys other rows see (MultiheadAttention's).
#include <cmath>
#include <limits>

#include "parts.hpp"

namespace attncheck::zoo {
namespace {

// The backward as autograd differentiates the math path, dense over [T_q,T_k] per head:
//   P = softmax(S + mask) with -inf on hidden keys (a row that sees no key: exp(-inf - (-inf)) = NaN across it),
//   dV = Pᵀ dO, dP = dO Vᵀ, Δ = rowsum(P ∘ dP), dS = P ∘ (dP - Δ), dQ = scale dS K, dK = scale dSᵀ Q,
//   a shared kv head's dK, dV summed over its group. `leak`: dK and dV take the NaN rows of P as they are
//   (0·NaN = NaN in every key of the head); otherwise they take P with those rows set to 0 first (torch.where on
//   the all-masked rows), and only dQ keeps the NaN.
template <class S>
AttentionGradients<S> math_backward(const Tensor<S>& q, const Tensor<S>& k, const Tensor<S>& v,
                                    const Tensor<S>& d_output, const Problem& p, bool leak) {
  using A = Acc<S>;
  const Shape qs = q.shape(), ks = k.shape();
  const A scale = static_cast<A>(p.scale ? *p.scale : 1.0 / std::sqrt(double(qs.D)));
  const A neg_inf = -std::numeric_limits<A>::infinity();
  AttentionGradients<S> g{Tensor<S>(qs), Tensor<S>(ks), Tensor<S>(ks)};
  for (Index b = 0; b < qs.B; ++b) {
    const Visibility vis = p.visibility(b);
    for (Index kv = 0; kv < ks.H; ++kv) {
      const Matrix<A> K = k.head(b, kv).template cast<A>(), V = v.head(b, kv).template cast<A>();
      Matrix<A> dK = Matrix<A>::Zero(ks.T, qs.D), dV = Matrix<A>::Zero(ks.T, qs.D);
      for (Index h = 0; h < qs.H; ++h) {
        if (kv_head(h, qs.H, ks.H) != kv) continue;
        const Matrix<A> Q = q.head(b, h).template cast<A>(), dO = d_output.head(b, h).template cast<A>();
        Matrix<A> P = Q * K.transpose() * scale;
        for (Index i = 0; i < qs.T; ++i) {
          for (Index j = 0; j < ks.T; ++j)
            if (!vis.visible(i, j)) P(i, j) = neg_inf;
          const A m = P.row(i).maxCoeff();  // -inf for a row that sees no key
          // std::exp, not Eigen's vectorised exp, which returns about 2^-128 for exp(-inf) in float.
          for (Index j = 0; j < ks.T; ++j) P(i, j) = std::exp(P(i, j) - m);
          P.row(i) /= P.row(i).sum();
        }
        const Matrix<A> dP = dO * V.transpose();
        Matrix<A> dS(qs.T, ks.T);
        for (Index i = 0; i < qs.T; ++i) {
          const A delta = P.row(i).cwiseProduct(dP.row(i)).sum();
          dS.row(i) = P.row(i).cwiseProduct((dP.row(i).array() - delta).matrix());
        }
        g.dq.head(b, h) = (scale * (dS * K)).template cast<S>();
        Matrix<A> P_kv = P, dS_kv = dS;
        if (!leak)
          for (Index i = 0; i < qs.T; ++i)
            if (vis.keys(i).empty()) {
              P_kv.row(i).setZero();
              dS_kv.row(i).setZero();
            }
        dV += P_kv.transpose() * dO;
        dK += scale * (dS_kv.transpose() * Q);
      }
      g.dk.head(b, kv) = dK.template cast<S>();
      g.dv.head(b, kv) = dV.template cast<S>();
    }
  }
  return g;
}

// The reference forward with the nan convention (every entry of a row that sees no key is NaN, output and
// weights), and math_backward.
ImplementationPtr nan_convention(std::string name, std::string description, Capabilities caps, bool leak) {
  caps.empty_rows = EmptyRows::nan;
  caps.nonfinite_safe = false;  // the dense math path multiplies hidden values by 0: NaN there would leak
  return make_implementation(
      std::move(name), std::move(description), caps,
      [](const Problem& p) {
        Outcome o = reference_implementation()->forward(p);
        const double nan = std::numeric_limits<double>::quiet_NaN();
        for (Index b = 0; b < p.q.shape().B; ++b) {
          const Visibility vis = p.visibility(b);
          for (Index h = 0; h < p.q.shape().H; ++h)
            for (Index i = 0; i < p.q.shape().T; ++i)
              if (vis.keys(i).empty()) {
                o.output.head(b, h).row(i).setConstant(nan);
                if (o.weights) o.weights->head(b, h).row(i).setConstant(nan);
              }
        }
        return o;
      },
      [leak](const Problem& p) {
        return run_backward_typed(p, [leak](const auto& q, const auto& k, const auto& v, const auto& d_output,
                                            const Problem& pr) { return math_backward(q, k, v, d_output, pr, leak); });
      });
}

}  // namespace

std::vector<Mutant> backward_nan_mutants() {
  std::vector<Mutant> z;
  // Causal attention alone, as SDPA's math path with a lower-right causal mask: no padding, no window, so the
  // only rows that see no key are the first T_q - T_k of a bottom-right call.
  Capabilities causal_only = zoo_capabilities();
  causal_only.nonfinite_safe = false;
  z.push_back(Mutant{
      .impl = nan_convention("mutant:grad-nan-row-leak",
                             "nan convention; the backward's dV = P^T dO and dK = dS^T Q read the NaN rows of P",
                             causal_only, true),
      .bug = "nan empty-row convention: a row that sees no key has NaN weights, and the backward multiplies them "
             "into dV = P^T dO and dK = dS^T Q (0 * NaN = NaN), so every key, seen by other rows or not, gets a "
             "NaN gradient (torch.nn.MultiheadAttention with a fully masked row)",
      .control = false,
      .minimal_shape = {1, 1, 2, 1},
      .why_minimal = "a row that sees no key and a key another row sees: bottom-right with T_q = 2 > T_k = 1 (query "
                     "0 sees nothing, query 1 sees key 0), dO = [0, 1]: dk and dv of key 0 are NaN where the "
                     "oracle says 0 and 1",
      .killed_by = {"grad-oracle", "grad-causality", "grad-key-sum-zero", "grad-dv-weights"},
  });
  Capabilities full = reference_implementation()->capabilities();
  // The math-path backward differentiates plain scores: no softcap, ALiBi, sinks, bias, temperature, rope or QK-norm
  // (and no d_sinks); and with a sink no row is empty in the softmax, so the nan convention does not reach it.
  full.features.remove({Feature::sinks, Feature::softcap, Feature::alibi, Feature::bias, Feature::bias_grad,
                        Feature::temperature, Feature::rope, Feature::rope_interleaved, Feature::qk_norm,
                        Feature::qk_norm_eps_outside, Feature::dropout, Feature::rope_ntk, Feature::rope_llama3});
  full.features.remove(Feature::paged);  // a dense kernel
  // Controls of the empty-row convention, on the contiguous families:
  full.features.remove({Feature::block_mask, Feature::dense_mask, Feature::index_list, Feature::index_list_blocks,
                        Feature::tree, Feature::tree_bitmask});
  full.features.remove(Feature::v_head_dim);  // its backward is written for one head dimension
  z.push_back(Mutant{
      .impl = nan_convention("control:grad-nan-rows",
                             "correct; nan convention, the NaN of a row that sees no key stays in that row's dQ",
                             full, false),
      .bug = "control: nan empty-row convention (NaN output and weights for a row that sees no key) with a dense "
             "math-path backward whose dK and dV leave those rows out (torch.where), so only their dQ is NaN",
      .control = true,
      .minimal_shape = {},
      .why_minimal = "a control: no case should fail",
      .killed_by = {},
  });
  return z;
}

}  // namespace attncheck::zoo
