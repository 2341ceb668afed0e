// Kernels that fuse dropout into attention (ABI 4's ATTNCHECK_CAP4_DROPOUT: training kernels draw a keep mask from a
// counter-based RNG) and get it wrong: the offset or the seed never reaching the RNG, a mask seeded by the data or
// numbered from the batch's end, kept weights scaled by p or not at all, the comparison the wrong way round, the
// kept weights renormalised, the undropped weights returned, the LSE over the kept cells, a backward that draws a
// fresh mask or forgets 1/(1 - p) in dV. Each is the reference with its bug. And a control with an RNG of its own
// that scales the output, not the weights.
#include <cmath>
#include <cstring>
#include <functional>

#include "attncheck/generators.hpp"
#include "kernel_kit.hpp"
#include "parts.hpp"

namespace attncheck::zoo {
namespace {

// What these kernels declare: dropout, grouped-query heads, key padding and the LSE (with a backward where they
// have one).
Capabilities dropout_capabilities() {
  Capabilities c = gqa_capabilities();
  c.features.add({Feature::dropout, Feature::key_padding, Feature::lse});
  return c;
}

// The reference's keep mask of p, as its core draws it.
std::vector<std::uint8_t> drawn_mask(const Problem& p) {
  const Shape& s = p.q.shape();
  return dropout_keep_mask(*p.dropout, s.B, s.H, s.T, p.k.shape().T);
}

// p with the keep mask `keep` ([B,H,T_q,T_k]) given explicitly.
Problem with_keep(const Problem& p, std::vector<std::uint8_t> keep) {
  Problem r = p;
  r.dropout->keep = std::move(keep);
  r.dropout->H = p.q.shape().H;
  r.dropout->T_q = p.q.shape().T;
  r.dropout->T_k = p.k.shape().T;
  return r;
}

// A kernel whose dropout is `edit`ed before the reference runs it, forward and backward (`backward_edit`, when
// given, edits the backward's call instead).
ImplementationPtr dropout_edit(const char* name, const char* description, std::function<Problem(const Problem&)> edit,
                               std::function<Problem(const Problem&)> backward_edit = {}) {
  const auto fwd = [edit](const Problem& p) { return p.dropout ? edit(p) : p; };
  const auto bwd = [edit, backward_edit](const Problem& p) {
    return p.dropout ? (backward_edit ? backward_edit(p) : edit(p)) : p;
  };
  return make_implementation(
      name, description, dropout_capabilities(),
      [fwd](const Problem& p) { return reference_implementation()->forward(fwd(p)); },
      [bwd](const Problem& p) { return reference_implementation()->backward(bwd(p)); });
}

// A forward-only kernel that computes what the reference does with dropout and then `change`s the outcome: its
// weights (the dropped ones, [B,H,T_q,T_k]), output and LSE, given the problem and the reference's undropped weights.
using Change = std::function<void(const Problem&, const Tensor<double>& undropped, Outcome&)>;
ImplementationPtr dropout_outcome(const char* name, const char* description, Change change) {
  return make_implementation(name, description, dropout_capabilities(), [change](const Problem& p) {
    if (!p.dropout) return reference_implementation()->forward(p);
    Problem full = p;
    full.want_weights = true;
    full.want_lse = true;
    Outcome o = reference_implementation()->forward(full);
    Problem plain = full;
    plain.dropout.reset();
    const Tensor<double> undropped = *reference_implementation()->forward(plain).weights;
    change(p, undropped, o);
    for (Tensor<double>* t : {&o.output, &*o.weights, &*o.lse})
      for (double& x : t->values()) x = std::isfinite(x) ? round_to(p.dtype, x) : x;
    if (!p.want_weights) o.weights.reset();
    if (!p.want_lse) o.lse.reset();
    return o;
  });
}

// Each row of the dropped weights and of the output multiplied by f(b, h, i) (f = 0 where nothing is kept).
void scale_rows(Outcome& o, const std::function<double(Index, Index, Index)>& f) {
  const Shape& s = o.output.shape();
  for (Index b = 0; b < s.B; ++b)
    for (Index h = 0; h < s.H; ++h)
      for (Index i = 0; i < s.T; ++i) {
        const double x = f(b, h, i);
        o.output.head(b, h).row(i) *= x;
        o.weights->head(b, h).row(i) *= x;
      }
}

double kept_sum(const Outcome& o, Index b, Index h, Index i) { return o.weights->head(b, h).row(i).sum(); }

// The control's own RNG: splitmix64's finaliser of the seed, the offset and the cell's coordinates, a 53-bit uniform.
double own_uniform(const Dropout& d, Index b, Index h, Index i, Index j) {
  const std::uint64_t x = coordinate_hash(d.seed ^ 0xD20F0u, {Index(d.offset & 0x7fffffffffffffffu), b, h, i, j});
  return double(x >> 11) * 0x1.0p-53;
}

}  // namespace

std::vector<Mutant> dropout_mutants() {
  std::vector<Mutant> z;
  z.push_back(Mutant{
      .impl = dropout_edit("mutant:dropout-offset-ignored", "the offset never reaches the RNG",
                           [](const Problem& p) {
                             Problem r = p;
                             r.dropout->offset = 0;
                             return r;
                           }),
      .bug = "the Philox offset not passed to the kernel (a constant 0): every step of training draws the same mask",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "one query over one key: the law tries enough other offsets that an equal mask under all of "
                     "them has a chance below 2^-40",
      .killed_by = {"dropout-mask-determinism"},
  });
  z.push_back(Mutant{
      .impl = dropout_edit("mutant:dropout-seed-ignored", "the seed never reaches the RNG",
                           [](const Problem& p) {
                             Problem r = p;
                             r.dropout->seed = 0;
                             return r;
                           }),
      .bug = "a constant Philox seed (the generator's seed not read): every run and every rank draws the same masks",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "one query over one key: the law tries enough other seeds that an equal mask under all of them "
                     "has a chance below 2^-40",
      .killed_by = {"dropout-mask-determinism"},
  });
  z.push_back(Mutant{
      .impl = dropout_edit(
          "mutant:dropout-backward-fresh-mask", "the backward draws its mask at the next offset",
          [](const Problem& p) { return p; },
          [](const Problem& p) {
            Problem r = p;
            r.dropout->offset += 1;
            return r;
          }),
      .bug = "the backward draws a fresh mask (the generator's offset advanced between forward and backward, or not "
             "saved): dV, dQ and dK of another dropout than the forward's",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "one query over one key (the law tries other offsets until a mask of one cell differs)",
      .killed_by = {"grad-dropout-mask"},
  });
  z.push_back(Mutant{
      .impl = dropout_outcome("mutant:dropout-scaled-by-p", "kept weights times p instead of over 1 - p",
                              [](const Problem& p, const Tensor<double>&, Outcome& o) {
                                const double f = p.dropout->p * (1 - p.dropout->p);
                                scale_rows(o, [f](Index, Index, Index) { return f; });
                              }),
      .bug = "the keep mask scaled by p instead of 1/(1 - p): outputs shrink by p(1 - p) in training",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "one query over one key",
      .killed_by = {"dropout-as-its-mask"},
  });
  z.push_back(Mutant{
      .impl = dropout_outcome("mutant:dropout-unscaled", "kept weights not divided by 1 - p",
                              [](const Problem& p, const Tensor<double>&, Outcome& o) {
                                const double f = 1 - p.dropout->p;
                                scale_rows(o, [f](Index, Index, Index) { return f; });
                              }),
      .bug = "dropout without the 1/(1 - p) rescale: the expected output shrinks by 1 - p in training and not at "
             "inference",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "one query over one key",
      .killed_by = {"dropout-as-its-mask"},
  });
  z.push_back(Mutant{
      .impl = dropout_edit("mutant:dropout-inverted", "keeps a cell when its uniform is below p",
                           [](const Problem& p) {
                             std::vector<std::uint8_t> keep = drawn_mask(p);
                             for (std::uint8_t& k : keep) k = 1 - k;
                             return with_keep(p, std::move(keep));
                           }),
      .bug = "the comparison the wrong way round (keep where u < p): a cell is kept with probability p, so p = 0.1 "
             "drops 90% of the weights",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "at p = 0 one query over one key is dropped; at p != 1/2 the kept fraction is off once enough "
                     "cells show it",
      .killed_by = {"dropout-as-its-mask", "dropout-keep-rate"},
  });
  z.push_back(Mutant{
      .impl = dropout_edit("mutant:dropout-seeded-by-data", "the seed mixed with q's first value",
                           [](const Problem& p) {
                             Problem r = p;
                             double first = p.q.values().size() > 0 ? p.q.values()[0] : 0.0;
                             std::uint64_t bits = 0;
                             std::memcpy(&bits, &first, sizeof bits);
                             r.dropout->seed ^= bits;
                             return r;
                           }),
      .bug = "the RNG seeded from a data-dependent value (a pointer or the first element read as the seed): the "
             "mask changes with the inputs, and a backward on recomputed activations draws another",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "one query over one key whose keep bit differs under the two seeds",
      .killed_by = {"dropout-mask-determinism"},
  });
  z.push_back(Mutant{
      .impl = dropout_edit("mutant:dropout-batch-from-end", "cells numbered from the batch's last entry",
                           [](const Problem& p) {
                             const std::vector<std::uint8_t> drawn = drawn_mask(p);
                             std::vector<std::uint8_t> keep(drawn.size());
                             const Index B = p.q.shape().B, per = Index(drawn.size()) / std::max<Index>(B, 1);
                             for (Index b = 0; b < B; ++b)
                               std::copy_n(drawn.begin() + (B - 1 - b) * per, per, keep.begin() + b * per);
                             return with_keep(p, std::move(keep));
                           }),
      .bug = "the RNG's counter counts batch entries from the end (B - 1 - b): a sequence's mask depends on how many "
             "others are in the batch",
      .minimal_shape = {2, 1, 1, 1},
      .why_minimal = "two batch entries, one query over one key whose keep bits differ",
      .killed_by = {"dropout-mask-determinism"},
  });
  z.push_back(Mutant{
      .impl = dropout_outcome("mutant:dropout-renormalised", "the kept weights renormalised to sum to 1",
                              [](const Problem&, const Tensor<double>&, Outcome& o) {
                                const Outcome before = o;
                                scale_rows(o, [&](Index b, Index h, Index i) {
                                  const double s = kept_sum(before, b, h, i);
                                  return s > 0 ? 1 / s : 0.0;
                                });
                              }),
      .bug = "the dropped cells masked before the softmax (a -inf score) instead of after it: the kept weights are "
             "renormalised, right only where nothing is dropped",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "one query over one key, kept: renormalised to 1 where 1/(1 - p) is due",
      .killed_by = {"dropout-as-its-mask"},
  });
  z.push_back(Mutant{
      .impl =
          dropout_outcome("mutant:dropout-weights-undropped", "returns the softmax's weights, not the dropped ones",
                          [](const Problem&, const Tensor<double>& undropped, Outcome& o) { o.weights = undropped; }),
      .bug = "the attention probabilities returned before dropout while the output used the dropped ones: the "
             "weights and the output disagree (attn_weights of a fused kernel's debug path)",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "one query over one key, dropped",
      .killed_by = {"dropout-as-its-mask"},
  });
  z.push_back(Mutant{
      .impl = dropout_outcome("mutant:dropout-lse-after", "the LSE over the kept cells only",
                              [](const Problem& p, const Tensor<double>&, Outcome& o) {
                                const Shape& s = o.output.shape();
                                for (Index b = 0; b < s.B; ++b)
                                  for (Index h = 0; h < s.H; ++h)
                                    for (Index i = 0; i < s.T; ++i) {
                                      const double kept = kept_sum(o, b, h, i) * (1 - p.dropout->p);
                                      (*o.lse)(b, h, i, 0) +=
                                          kept > 0 ? std::log(kept) : -std::numeric_limits<double>::infinity();
                                    }
                              }),
      .bug = "the log-sum-exp taken after dropout (over the kept cells): a split-KV merge or the backward's "
             "recomputed weights are then off by the dropped share",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "one query over one key, dropped: the LSE over no kept cell is -inf",
      .killed_by = {"dropout-as-its-mask"},
  });
  z.push_back(Mutant{
      .impl = make_implementation(
          "mutant:dropout-dv-unscaled", "dV without 1/(1 - p)", dropout_capabilities(),
          [](const Problem& p) { return reference_implementation()->forward(p); },
          [](const Problem& p) {
            Gradients g = reference_implementation()->backward(p);
            if (p.dropout)
              for (double& x : g.dv.values()) x = round_to(p.dtype, x * (1 - p.dropout->p));
            return g;
          }),
      .bug = "dV from the kept weights without their 1/(1 - p) (the mask applied, the rescale forgotten in the "
             "backward): dV too small by 1 - p",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "one query over one key, kept",
      .killed_by = {"grad-dropout-mask"},
  });
  {
    Capabilities caps = dropout_capabilities();
    caps.features.remove(Feature::lse);
    z.push_back(Mutant{
        .impl = make_implementation(
            "control:dropout-own-rng", "correct; its own RNG, the output scaled after the product", caps,
            [](const Problem& p) {
              if (!p.dropout) return reference_implementation()->forward(p);
              const Dropout d = *p.dropout;
              return run_typed(p, [&](const auto& q, const auto& k, const auto& v, const Problem& pr, auto* w) {
                using S = typename std::decay_t<decltype(q)>::Scalar;
                using A = Acc<S>;
                const A keep_scale = A(1) / (A(1) - A(d.p));
                return per_head_in<A>(
                    q, k, v, pr, w, [&](const Matrix<A>& Q, const Matrix<A>& K, const Matrix<A>& V, const HeadCtx& c) {
                      HeadOut<A> r;
                      const Matrix<A> s = causal_select(scores(Q, K, c.resolved_scale()), c);
                      const Matrix<A> soft = softmax_rows(s);
                      r.weights = Matrix<A>::Zero(soft.rows(), soft.cols());
                      r.output = Matrix<A>::Zero(soft.rows(), V.cols());
                      for (Index i = 0; i < soft.rows(); ++i) {
                        for (Index j = 0; j < soft.cols(); ++j)
                          if (c.visible(i, j) && own_uniform(d, c.b, c.h, i, j) >= d.p) {
                            r.output.row(i) += soft(i, j) * V.row(j);
                            r.weights(i, j) = soft(i, j) * keep_scale;
                          }
                        r.output.row(i) *= keep_scale;  // once, after the product
                      }
                      return r;
                    });
              });
            }),
        .bug = "control: a keep mask from an RNG of its own (splitmix64 of the seed, the offset and the cell), the "
               "kept softmax weights times V and the sum divided by 1 - p at the end: another mask and another order "
               "of the same dropout, which tolerance.cpp's step 11 bounds",
        .control = true,
        .minimal_shape = {},
        .why_minimal = "a control: no case should fail",
        .killed_by = {},
    });
  }
  return z;
}

}  // namespace attncheck::zoo
