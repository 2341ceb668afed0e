// Kernels that fuse QK-norm into attention (ABI 4's ATTNCHECK_CAP4_QK_NORM: Qwen3's, Gemma 3's and OLMo 2's RMSNorm of
// each head's q and k) and get it wrong: eps on the other side of the root, the weights dropped, k left out, q's
// weights for k, the sum of squares for the mean, or one norm over every head of a token. Each normalises as its bug
// says and then attends as the reference does. And a control that normalises in float and the call's dtype, as an
// RMSNorm layer does.
#include <cmath>
#include <functional>

#include "attncheck/generators.hpp"
#include "parts.hpp"

namespace attncheck::zoo {
namespace {

// What these kernels declare: QK-norm with eps in the root, grouped-query heads and key padding.
Capabilities qk_norm_capabilities() {
  Capabilities c = gqa_capabilities();
  c.features.add({Feature::qk_norm, Feature::key_padding});
  return c;
}

// A kernel whose QK-norm is `edit`ed (the reference's forward and backward of the edited call).
ImplementationPtr norm_edit(const char* name, const char* description, std::function<void(QkNorm&)> edit) {
  const auto read = [edit](const Problem& p) {
    if (!p.qk_norm) return p;
    Problem r = p;
    edit(*r.qk_norm);
    if (r.qk_norm->q_weight.empty() && r.qk_norm->k_weight.empty()) r.qk_norm.reset();
    return r;
  };
  return make_implementation(
      name, description, qk_norm_capabilities(),
      [read](const Problem& p) { return reference_implementation()->forward(read(p)); },
      [read](const Problem& p) { return reference_implementation()->backward(read(p)); });
}

// x [B,H,T,D] normalised as a kernel computes it: `groups` rows of a token normalised together (1: each head alone;
// H: every head of the token at once), the mean of squares over `count` values per group (its D·heads, or 1 for the
// sum of squares), r = sqrt(that + eps), then w ⊙ x / r, each step in float and the result in the dtype.
Tensor<double> kernel_norm(const Tensor<double>& x, const QkNorm& n, const std::vector<double>& w, DType dtype,
                           bool across_heads, bool sum_of_squares) {
  Tensor<double> r = x;
  const Shape& s = x.shape();
  const Index heads = across_heads ? s.H : 1;
  for (Index b = 0; b < s.B; ++b)
    for (Index t = 0; t < s.T; ++t)
      for (Index h0 = 0; h0 < s.H; h0 += heads) {
        float ms = 0;
        for (Index h = h0; h < h0 + heads; ++h)
          for (Index c = 0; c < s.D; ++c) ms += float(x(b, h, t, c)) * float(x(b, h, t, c));
        if (!sum_of_squares) ms /= float(s.D * heads);
        const float rms = n.eps_outside ? std::sqrt(ms) + float(n.eps) : std::sqrt(ms + float(n.eps));
        for (Index h = h0; h < h0 + heads; ++h)
          for (Index c = 0; c < s.D; ++c)
            r(b, h, t, c) =
                round_to(dtype, double(float(x(b, h, t, c)) / rms * float(round_to(dtype, w[std::size_t(c)]))));
      }
  return r;
}

// A forward-only kernel that normalises as kernel_norm does and then attends plainly.
ImplementationPtr norm_kernel(const char* name, const char* description, bool across_heads, bool sum_of_squares,
                              Capabilities caps = qk_norm_capabilities()) {
  return make_implementation(name, description, caps, [=](const Problem& p) {
    if (!p.qk_norm) return reference_implementation()->forward(p);
    Problem r = p;
    const QkNorm& n = *p.qk_norm;
    if (!n.q_weight.empty()) r.q = kernel_norm(p.q, n, n.q_weight, p.dtype, across_heads, sum_of_squares);
    if (!n.k_weight.empty()) r.k = kernel_norm(p.k, n, n.k_weight, p.dtype, across_heads, sum_of_squares);
    r.qk_norm.reset();
    return reference_implementation()->forward(r);
  });
}

}  // namespace

std::vector<Mutant> qk_norm_mutants() {
  std::vector<Mutant> z;
  z.push_back(Mutant{
      .impl = norm_edit("mutant:qk-norm-eps-outside", "eps added outside the square root where inside is declared",
                        [](QkNorm& n) { n.eps_outside = !n.eps_outside; }),
      .bug = "eps on the other side of the root, sqrt(mean x^2) + eps for sqrt(mean x^2 + eps): right where eps is "
             "negligible, wrong for rows whose mean square is near eps",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "one query over two keys, a row whose mean square is near eps",
      .killed_by = {"oracle-agreement", "qk-norm-as-normalised-inputs"},
  });
  z.push_back(Mutant{
      .impl = norm_edit("mutant:qk-norm-weights-ignored", "the norm's weights taken as 1",
                        [](QkNorm& n) {
                          for (double& x : n.q_weight) x = 1;
                          for (double& x : n.k_weight) x = 1;
                        }),
      .bug = "the learned weights of q_norm and k_norm not loaded (all ones): right only for an untrained model",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "one query over two keys, a weight other than 1",
      .killed_by = {"oracle-agreement", "qk-norm-as-normalised-inputs"},
  });
  z.push_back(Mutant{
      .impl = norm_edit("mutant:qk-norm-k-skipped", "q normalised, k not", [](QkNorm& n) { n.k_weight.clear(); }),
      .bug = "k_norm skipped in a fused kernel (q's applied in the prologue, k's expected of the cache writer)",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "one query over two keys whose rows' scales differ",
      .killed_by = {"oracle-agreement", "qk-norm-as-normalised-inputs"},
  });
  z.push_back(Mutant{
      .impl = norm_edit("mutant:qk-norm-q-weights-for-k", "k normalised with q's weights",
                        [](QkNorm& n) {
                          if (!n.q_weight.empty() && !n.k_weight.empty()) n.k_weight = n.q_weight;
                        }),
      .bug = "q_norm's weights applied to k as well (one weight tensor where the checkpoint has two)",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "one query over two keys, q's and k's weights different",
      .killed_by = {"oracle-agreement", "qk-norm-as-normalised-inputs"},
  });
  z.push_back(Mutant{
      .impl = norm_kernel("mutant:qk-norm-sum-of-squares", "the root of the sum of squares, not of their mean", false,
                          true),
      .bug = "r = sqrt(sum x^2 + eps) instead of sqrt(mean x^2 + eps): every normalised row too small by sqrt(D), so "
             "the scores shrink by D (right only at D = 1)",
      .minimal_shape = {1, 1, 1, 2},
      .why_minimal = "D = 2 (at D = 1 the sum is the mean), one query over two keys",
      .killed_by = {"oracle-agreement", "qk-norm-as-normalised-inputs", "qk-norm-scale-invariance"},
  });
  z.push_back(Mutant{
      .impl = norm_kernel("mutant:qk-norm-across-heads", "one norm over every head of a token", true, false),
      .bug = "the root mean square taken over every head of a token at once (a norm over the whole projection, as "
             "OLMo 2 does) where each head is normalised alone (Qwen3, Gemma 3): right for one head",
      .minimal_shape = {1, 2, 1, 1},
      .why_minimal = "two query heads whose rows' scales differ (sharing a kv head, or each with its own: the kv "
                     "heads are normalised together too), one query over two keys",
      .killed_by = {"oracle-agreement", "qk-norm-as-normalised-inputs"},
  });
  {
    Capabilities caps = qk_norm_capabilities();
    caps.features.add({Feature::qk_norm_eps_outside, Feature::lse});
    z.push_back(Mutant{
        .impl = make_implementation("control:qk-norm-in-float",
                                    "correct; the norm in float, its weights and result in the call's dtype", caps,
                                    [](const Problem& p) {
                                      if (!p.qk_norm) return reference_implementation()->forward(p);
                                      Problem r = p;
                                      const QkNorm& n = *p.qk_norm;
                                      if (!n.q_weight.empty())
                                        r.q = kernel_norm(p.q, n, n.q_weight, p.dtype, false, false);
                                      if (!n.k_weight.empty())
                                        r.k = kernel_norm(p.k, n, n.k_weight, p.dtype, false, false);
                                      r.qk_norm.reset();
                                      return reference_implementation()->forward(r);
                                    }),
        .bug = "control: each row's mean square, root and quotient in float, the weights and the result rounded to "
               "the dtype (an RMSNorm layer at the call's dtype), then plain attention: the normalisation's own "
               "rounding, which tolerance.cpp's step 10 bounds, with eps inside and outside the root",
        .control = true,
        .minimal_shape = {},
        .why_minimal = "a control: no case should fail",
        .killed_by = {},
    });
  }
  return z;
}

}  // namespace attncheck::zoo
