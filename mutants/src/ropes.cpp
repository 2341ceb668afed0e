// Kernels that fuse rotary position embeddings into attention (ABI 4's ATTNCHECK_CAP4_ROPE: FlashInfer's, vLLM's and
// TensorRT-LLM's fused RoPE) and get them wrong: rotary_dim not passed through, the other pairing, positions from the
// row index or from the keys, K left unrotated, cos applied twice, the scaling factor ignored, or a backward that
// stops before the rotation. Each rotates as its bug says and then attends as the reference does. And
// a control that rotates in its own arithmetic, as Hugging Face's apply_rotary_pos_emb does at the call's dtype.
#include <cmath>
#include <functional>

#include "attncheck/generators.hpp"
#include "parts.hpp"

namespace attncheck::zoo {
namespace {

// What these kernels declare: half-split rotary embeddings (and `more`), grouped-query heads and key padding.
Capabilities rope_capabilities(FeatureSet more = {}) {
  Capabilities c = gqa_capabilities();
  c.features.add({Feature::rope, Feature::key_padding});
  for (std::size_t f = 0; f < kFeatureCount; ++f)
    if (more.has(Feature(f))) c.features.add(Feature(f));
  return c;
}

// The call a kernel effectively makes of p (its rope read as its bug says): the reference's forward and backward.
using AsRead = std::function<Problem(const Problem&)>;
ImplementationPtr rope_impl(const char* name, const char* description, AsRead as_read) {
  const auto read = [as_read](const Problem& p) { return p.rope ? as_read(p) : p; };
  return make_implementation(
      name, description, rope_capabilities(),
      [read](const Problem& p) { return reference_implementation()->forward(read(p)); },
      [read](const Problem& p) { return reference_implementation()->backward(read(p)); });
}

// The same with the rope's fields changed by `edit`.
ImplementationPtr rope_edit(const char* name, const char* description,
                            std::function<void(const Problem&, Rope&)> edit) {
  return rope_impl(name, description, [edit](const Problem& p) {
    Problem r = p;
    edit(p, *r.rope);
    return r;
  });
}

// x [B,H,T,D] rotated as a kernel computes it: the angle in float, cos and sin rounded to the dtype, each product
// and the difference rounded to the dtype (Hugging Face's q·cos + rotate_half(q)·sin at the call's dtype); with
// `cos_twice`, cos applied to x_a twice (x_a·cos·cos - x_b·sin).
Tensor<double> kernel_rotation(const Tensor<double>& x, const Rope& rope, const std::vector<Index>& positions,
                               DType dtype, bool cos_twice = false) {
  Tensor<double> r = x;
  const Shape& s = x.shape();
  const auto d = [&](double v) { return round_to(dtype, v); };
  for (Index b = 0; b < s.B; ++b)
    for (Index t = 0; t < s.T; ++t)
      for (Index m = 0; m < rope.rotary_dim / 2; ++m) {
        const float inv = std::pow(float(rope.base), -2.0f * float(m) / float(rope.rotary_dim));
        const float theta = float(positions[std::size_t(b * s.T + t)]) / float(rope.factor) * inv;
        const double c = d(std::cos(theta)), sn = d(std::sin(theta));
        const auto [a, e] = rope.pair(m);
        for (Index h = 0; h < s.H; ++h) {
          const double xa = x(b, h, t, a), xe = x(b, h, t, e), ca = cos_twice ? d(d(xa * c) * c) : d(xa * c);
          r(b, h, t, a) = d(ca - d(xe * sn));
          r(b, h, t, e) = d(d(xe * c) + d(xa * sn));
        }
      }
  return r;
}

}  // namespace

std::vector<Mutant> rope_mutants() {
  std::vector<Mutant> z;
  z.push_back(Mutant{
      .impl = rope_edit("mutant:rope-dim-ignored", "every head dimension rotated, rotary_dim ignored",
                        [](const Problem& p, Rope& r) { r.rotary_dim = p.q.shape().D - p.q.shape().D % 2; }),
      .bug = "rotary_dim not passed through: the kernel rotates every pair of the head dimension (a partial rotary "
             "model, GPT-J's or Phi's, then scores against the wrong keys; vLLM's out-of-bounds cos/sin)",
      .minimal_shape = {1, 1, 1, 4},
      .why_minimal = "a rotary_dim of 2 below D = 4 (with D = 2 or 3 every pair is rotated anyway), one query over "
                     "two keys at different positions; or, for a case drawn with rotary_dim 4, D = 6 (at D = 5 every "
                     "pair is rotated anyway, and a rotary_dim of 2 pairs other dimensions than the case's values)",
      .killed_by = {"oracle-agreement", "rope-as-rotated-inputs"},
      .also_minimal = {{1, 1, 1, 6}},
  });
  z.push_back(Mutant{
      .impl = rope_edit("mutant:rope-interleaved-for-half-split", "interleaved pairs where half-split is declared",
                        [](const Problem&, Rope& r) {
                          r.variant =
                              r.variant == RopeVariant::half_split ? RopeVariant::interleaved : RopeVariant::half_split;
                        }),
      .bug = "the pairs (2m, 2m+1) of GPT-J where GPT-NeoX's (m, m + r/2) are declared: a checkpoint's heads rotated "
             "in the wrong dims (the classic interleaved/neox mismatch)",
      .minimal_shape = {1, 1, 1, 4},
      .why_minimal = "rotary_dim 4 (with 2 both pairings are (0, 1)), one query over two keys at different positions",
      .killed_by = {"oracle-agreement", "rope-as-rotated-inputs"},
  });
  z.push_back(Mutant{
      .impl = rope_edit("mutant:rope-positions-from-row-index", "each token rotated by its row index",
                        [](const Problem& p, Rope& r) {
                          const Index B = p.q.shape().B, T_q = p.q.shape().T, T_k = p.k.shape().T;
                          for (Index b = 0; b < B; ++b) {
                            for (Index i = 0; i < T_q; ++i) r.q_positions[std::size_t(b * T_q + i)] = i;
                            for (Index j = 0; j < T_k; ++j) r.k_positions[std::size_t(b * T_k + j)] = j;
                          }
                        }),
      .bug = "positions taken from the row index instead of the position ids: right for a prefill from position 0, "
             "wrong for a decode step, a chunk, or packed sequences whose positions restart",
      .minimal_shape = {1, 1, 1, 2},
      .why_minimal = "a decode step (one query at position 1 over keys 0 and 1, bottom-right: its row index is 0); or "
                     "D = 4 for a case drawn with rotary_dim 4 (cutting D to 2 pairs other dimensions)",
      .killed_by = {"oracle-agreement", "rope-as-rotated-inputs"},
      .also_minimal = {{1, 1, 1, 4}},
  });
  z.push_back(Mutant{
      .impl = rope_edit("mutant:rope-q-by-key-positions", "q rotated by the keys' first position ids",
                        [](const Problem& p, Rope& r) {
                          const Index B = p.q.shape().B, T_q = p.q.shape().T, T_k = p.k.shape().T;
                          for (Index b = 0; b < B; ++b)
                            for (Index i = 0; i < T_q; ++i)
                              r.q_positions[std::size_t(b * T_q + i)] =
                                  r.k_positions[std::size_t(b * T_k + std::min(i, T_k - 1))];
                        }),
      .bug = "Q and K cross-wired in a fused kernel: the queries rotated by the key positions' table (right for a "
             "square prefill, wrong for a decode step)",
      .minimal_shape = {1, 1, 1, 2},
      .why_minimal = "a decode step: one query at position 1 rotated by key 0's position 0, over two keys",
      .killed_by = {"oracle-agreement", "rope-as-rotated-inputs"},
  });
  z.push_back(Mutant{
      .impl = rope_edit("mutant:rope-factor-ignored", "linear position scaling ignored",
                        [](const Problem&, Rope& r) { r.factor = 1; }),
      .bug = "the scaling factor of a context-extended model dropped: positions used unscaled",
      .minimal_shape = {1, 1, 1, 2},
      .why_minimal = "a factor other than 1, one query over two keys at different positions",
      .killed_by = {"oracle-agreement", "rope-as-rotated-inputs"},
  });
  z.push_back(Mutant{
      .impl = make_implementation("mutant:rope-keys-unrotated", "q rotated, k not", rope_capabilities(),
                                  [](const Problem& p) {
                                    if (!p.rope) return reference_implementation()->forward(p);
                                    Problem r = p;
                                    r.q = fold_rope(p.q, *p.rope, p.rope->q_positions, "mutant:rope-keys-unrotated");
                                    for (double& x : r.q.values()) x = round_to(p.dtype, x);
                                    r.rope.reset();
                                    return reference_implementation()->forward(r);
                                  }),
      .bug = "K left unrotated (a fused kernel that rotates Q in its prologue and expects the cache to hold rotated "
             "keys, given raw ones): the scores lose their relative-position property",
      .minimal_shape = {1, 1, 1, 2},
      .why_minimal = "one query over two keys (bottom-right), the second at a position other than 0",
      .killed_by = {"oracle-agreement", "rope-relative-positions"},
  });
  z.push_back(Mutant{
      .impl = make_implementation("mutant:rope-cos-twice", "x_a·cos·cos - x_b·sin", rope_capabilities(),
                                  [](const Problem& p) {
                                    if (!p.rope) return reference_implementation()->forward(p);
                                    Problem r = p;
                                    r.q = kernel_rotation(p.q, *p.rope, p.rope->q_positions, p.dtype, true);
                                    r.k = kernel_rotation(p.k, *p.rope, p.rope->k_positions, p.dtype, true);
                                    r.rope.reset();
                                    return reference_implementation()->forward(r);
                                  }),
      .bug =
          "cos applied twice to the first element of each pair (a copy-paste of the cos term): right only at angle 0",
      .minimal_shape = {1, 1, 1, 2},
      .why_minimal = "one query over two keys at positions other than 0",
      .killed_by = {"oracle-agreement", "rope-as-rotated-inputs"},
  });
  z.push_back(Mutant{
      .impl = make_implementation(
          "mutant:rope-grads-not-rotated-back", "dQ and dK of the rotated q and k returned", rope_capabilities(),
          [](const Problem& p) { return reference_implementation()->forward(p); },
          [](const Problem& p) {
            if (!p.rope) return reference_implementation()->backward(p);
            Problem r = p;  // the kernel's prologue, then plain attention's backward, stopped there
            r.q = fold_rope(p.q, *p.rope, p.rope->q_positions, "mutant:rope-grads-not-rotated-back");
            r.k = fold_rope(p.k, *p.rope, p.rope->k_positions, "mutant:rope-grads-not-rotated-back");
            for (Tensor<double>* t : {&r.q, &r.k})
              for (double& x : t->values()) x = round_to(p.dtype, x);
            r.rope.reset();
            return reference_implementation()->backward(r);
          }),
      .bug = "the backward stops before the rotation: dQ and dK returned for the rotated q' and k', not turned back "
             "by R^T (a fused RoPE's backward that forgets its prologue)",
      .minimal_shape = {1, 1, 1, 2},
      .why_minimal = "one query over two keys (bottom-right) at positions other than 0, values that differ",
      .killed_by = {"grad-oracle"},
  });
  {
    Capabilities caps = rope_capabilities({Feature::rope_interleaved, Feature::lse});
    z.push_back(Mutant{
        .impl = make_implementation("control:rope-at-the-dtype",
                                    "correct; the rotation in float and the call's dtype, as Hugging Face's", caps,
                                    [](const Problem& p) {
                                      if (!p.rope) return reference_implementation()->forward(p);
                                      Problem r = p;
                                      r.q = kernel_rotation(p.q, *p.rope, p.rope->q_positions, p.dtype);
                                      r.k = kernel_rotation(p.k, *p.rope, p.rope->k_positions, p.dtype);
                                      r.rope.reset();
                                      return reference_implementation()->forward(r);
                                    }),
        .bug = "control: q and k rotated with the angle in float, cos and sin rounded to the dtype, and each product "
               "and sum rounded to it (apply_rotary_pos_emb at the call's dtype), then plain attention: the "
               "rotation's whole rounding, which tolerance.cpp's step 9 bounds, at positions up to 40000",
        .control = true,
        .minimal_shape = {},
        .why_minimal = "a control: no case should fail",
        .killed_by = {},
    });
  }
  return z;
}

}  // namespace attncheck::zoo
