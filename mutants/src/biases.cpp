// Kernels that take an additive score bias (ABI 4's ATTNCHECK_CAP4_BIAS: T5's relative buckets, a learned bias, a
// FlexAttention score_mod written out) and read it wrong: the bias dropped on one path, its extents broadcast from
// the wrong entry, its strides swapped, or multiplied by the softmax scale as if it were part of q·k. Each reads the
// bias as its bug says and then attends as the reference does, forward and backward, so the reading is its only
// bug. And a control that reads it right.
#include <cmath>
#include <functional>
#include <limits>

#include "parts.hpp"

namespace attncheck::zoo {
namespace {

// How a kernel reads the bias of a call: the bias it effectively adds (empty: none).
using BiasRead = std::function<std::optional<ScoreBias>(const Problem&)>;

// What these kernels declare: the bias, grouped-query heads and key padding (as most kernels that take a bias do).
Capabilities bias_capabilities() {
  Capabilities c = gqa_capabilities();
  c.features.add({Feature::bias, Feature::key_padding, Feature::backward});
  return c;
}

ImplementationPtr bias_impl(const char* name, const char* description, BiasRead read) {
  const auto as_read = [read](const Problem& p) {
    Problem q = p;
    q.bias = p.bias ? read(p) : std::nullopt;
    return q;
  };
  return make_implementation(
      name, description, bias_capabilities(),
      [as_read](const Problem& p) { return reference_implementation()->forward(as_read(p)); },
      [as_read](const Problem& p) { return reference_implementation()->backward(as_read(p)); });
}

// The bias written out for every (b, h), each entry read from (b_of(b), h_of(h)).
ScoreBias every_entry(const Problem& p, const std::function<Index(Index)>& b_of, const std::function<Index(Index)>& h_of) {
  const ScoreBias& in = *p.bias;
  const Index B = p.q.shape().B, H = p.q.shape().H;
  ScoreBias out{.B = B, .H = H, .T_q = in.T_q, .T_k = in.T_k, .values = {}};
  for (Index b = 0; b < B; ++b)
    for (Index h = 0; h < H; ++h) {
      const double* at = in.head(b_of(b), h_of(h));
      out.values.insert(out.values.end(), at, at + in.T_q * in.T_k);
    }
  return out;
}

// A head that takes each row's max over the scores before adding the bias, then weighs exp(s + b - m_raw):
// FlexAttention-style code whose online max runs over q·k and whose score_mod comes after, or a fused kernel
// that keeps the raw max for its LSE. Right in exact arithmetic and for small biases; a bias of +90 overflows
// float's exp, and one of -105 underflows every weight of the row to 0 (0/0).
template <class M>
HeadOut<Scalar<M>> max_before_bias(const M& Q, const M& K, const M& V, const HeadCtx& c) {
  using A = Scalar<M>;
  const Matrix<A> s = scores(Q, K, c.resolved_scale());
  HeadOut<A> r;
  r.weights = Matrix<A>::Zero(s.rows(), s.cols());
  for (Index i = 0; i < s.rows(); ++i) {
    A m = -std::numeric_limits<A>::infinity(), l = 0;
    for (Index j = 0; j < s.cols(); ++j)
      if (c.visible(i, j)) m = std::max(m, s(i, j));
    if (m == -std::numeric_limits<A>::infinity()) continue;
    for (Index j = 0; j < s.cols(); ++j)
      if (c.visible(i, j)) l += (r.weights(i, j) = std::exp(s(i, j) + A(c.bias_at(i, j)) - m));
    r.weights.row(i) /= l;
  }
  r.output = mix_visible(r.weights, V, c);
  return r;
}

// An online softmax over the keys one at a time (a tile of one key), the bias added to each score, the running
// max started at -inf and each step rescaled by exp(m_old - m_new) with no guard for a max that is still -inf:
// FlashAttention-style code whose masked cells never reached the softmax before a score_mod could make one -inf.
template <class M>
HeadOut<Scalar<M>> online_unguarded(const M& Q, const M& K, const M& V, const HeadCtx& c) {
  using A = Scalar<M>;
  const Matrix<A> s = scores(Q, K, c.resolved_scale());
  HeadOut<A> r;
  r.weights = Matrix<A>::Zero(s.rows(), s.cols());
  r.output = Matrix<A>::Zero(s.rows(), V.cols());
  for (Index i = 0; i < s.rows(); ++i) {
    A m = -std::numeric_limits<A>::infinity(), l = 0;
    Matrix<A> acc = Matrix<A>::Zero(1, V.cols());
    bool any = false;
    for (Index j = 0; j < s.cols(); ++j) {
      if (!c.visible(i, j)) continue;
      any = true;
      const A x = s(i, j) + A(c.bias_at(i, j)), m_new = std::max(m, x);
      const A alpha = std::exp(m - m_new), p = std::exp(x - m_new);  // exp(-inf - -inf) = NaN
      l = l * alpha + p;
      acc = acc * alpha + p * V.row(j);
      m = m_new;
    }
    if (!any) continue;
    r.output.row(i) = acc / l;
    for (Index j = 0; j < s.cols(); ++j)
      if (c.visible(i, j)) r.weights(i, j) = std::exp(s(i, j) + A(c.bias_at(i, j)) - m) / l;
  }
  return r;
}

// A kernel with ALiBi and an additive bias whose ALiBi term has its sign flipped, slope (p - j) (its bias path is
// right): the two disagree wherever a row sees two keys and the slope is not 0.
template <class M>
HeadOut<Scalar<M>> alibi_flipped_with_bias(const M& Q, const M& K, const M& V, const HeadCtx& c) {
  using A = Scalar<M>;
  Matrix<A> s = scores(Q, K, c.resolved_scale());
  for (Index i = 0; i < s.rows(); ++i)
    for (Index j = 0; j < s.cols(); ++j) s(i, j) += A(c.alibi_slope) * A(c.position(i) - j) + A(c.bias_at(i, j));
  return attend_where(s, V, VisibleCells(c));
}

// ---- dBias -----------------------------------------------------------------------------------------------------

// The per-(b, h) score gradient dS [B, H, T_q, T_k] of p (its bias written out for every head: the reference's
// dBias of that call), from which each dBias kernel below reduces its own.
Tensor<double> per_head_ds(const Problem& p) {
  Problem w = p;
  w.bias = p.bias->written_out(p.q.shape().B, p.q.shape().H);
  return *reference_implementation()->backward(w).dbias;
}

// A [B, H, T_q, T_k] per-head gradient reduced to p's bias's shape: summed over the axes the bias broadcasts over
// (or, with `first_head_only`, over the batch but taking head 0 alone for a bias shared by the heads).
Tensor<double> reduced(const Problem& p, const Tensor<double>& per_head, bool first_head_only = false) {
  const ScoreBias& sb = *p.bias;
  Tensor<double> d(Shape{sb.B, sb.H, sb.T_q, sb.T_k});
  const Shape& s = per_head.shape();
  for (Index b = 0; b < s.B; ++b)
    for (Index h = 0; h < s.H; ++h)
      if (!(first_head_only && sb.H == 1 && h > 0)) d.head(sb.B == 1 ? 0 : b, sb.H == 1 ? 0 : h) += per_head.head(b, h);
  return d;
}

// dBias computed from the forward's weights P (as returned, at the dtype) and dP = dO·v in double, per head:
// P (dP - Delta), Delta = sum_j P dP; with `without_sink`, P renormalised over the keys (as if no sink took its
// share). Then reduced to the bias's shape.
Tensor<double> from_weights(const Problem& p, bool without_sink) {
  const Index B = p.q.shape().B, H = p.q.shape().H, T_q = p.q.shape().T, T_k = p.k.shape().T;
  Problem fw = p;
  fw.want_weights = true;
  const Tensor<double> P = *reference_implementation()->forward(fw).weights;
  Tensor<double> ds(Shape{B, H, T_q, T_k});
  for (Index b = 0; b < B; ++b)
    for (Index h = 0; h < H; ++h) {
      const Index g = kv_head(h, H, p.k.shape().H);
      Matrix<double> w = P.head(b, h);
      if (without_sink)
        for (Index i = 0; i < T_q; ++i)
          if (const double l = w.row(i).sum(); l > 0) w.row(i) /= l;
      const Matrix<double> dP = Matrix<double>(p.d_output->head(b, h)) * Matrix<double>(p.v.head(b, g)).transpose();
      for (Index i = 0; i < T_q; ++i) {
        const double delta = w.row(i).dot(dP.row(i));
        for (Index j = 0; j < T_k; ++j) ds(b, h, i, j) = w(i, j) * (dP(i, j) - delta);
      }
    }
  return reduced(p, ds);
}

// The reference forward and backward, with dBias as `read` computes it; declaring the bias and its gradient, and
// `more` (a softcap, sinks: where a bug lives, so that its minimal case needs them).
ImplementationPtr dbias_impl(const char* name, const char* description,
                             std::function<Tensor<double>(const Problem&)> read, FeatureSet more = {}) {
  Capabilities caps = bias_capabilities();
  caps.features.add(Feature::bias_grad);
  for (std::size_t f = 0; f < kFeatureCount; ++f)
    if (more.has(Feature(f))) caps.features.add(Feature(f));
  return make_implementation(
      name, description, caps, [](const Problem& p) { return reference_implementation()->forward(p); },
      [read](const Problem& p) {
        Gradients g = reference_implementation()->backward(p);
        if (p.bias) g.dbias = read(p);
        return g;
      });
}

}  // namespace

std::vector<Mutant> bias_mutants() {
  std::vector<Mutant> z;
  z.push_back(Mutant{
      .impl = bias_impl("mutant:bias-ignored", "the bias never added (a fast path that drops it)",
                        [](const Problem&) { return std::nullopt; }),
      .bug = "the additive bias dropped: a path (FlashInfer's ragged wrapper, a score_mod lost in a fused kernel) "
             "attends over the plain scores",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "one query over two keys (a decode step) whose biases differ: the bias moves the weights, unless "
                     "it is dropped",
      .killed_by = {"oracle-agreement"},
  });
  z.push_back(Mutant{
      .impl = bias_impl("mutant:bias-head0-everywhere", "head 0's bias read for every head",
                        [](const Problem& p) {
                          return every_entry(p, [](Index b) { return b; }, [](Index) { return Index{0}; });
                        }),
      .bug = "the bias's head stride taken as 0: every head adds head 0's bias, right only for a bias shared by all "
             "heads",
      .minimal_shape = {1, 2, 1, 1},
      .why_minimal = "two heads with biases of their own (one head, or one bias for all, is read right), sharing a kv "
                     "head, one query over two keys",
      .killed_by = {"oracle-agreement"},
  });
  z.push_back(Mutant{
      .impl = bias_impl("mutant:bias-batch0-everywhere", "batch entry 0's bias read for every entry",
                        [](const Problem& p) {
                          return every_entry(p, [](Index) { return Index{0}; }, [](Index h) { return h; });
                        }),
      .bug = "the bias's batch stride taken as 0: every sequence adds the first one's bias",
      .minimal_shape = {2, 1, 1, 1},
      .why_minimal = "two batch entries with biases of their own, one query over two keys each",
      .killed_by = {"oracle-agreement"},
  });
  z.push_back(Mutant{
      .impl = bias_impl("mutant:bias-strides-swapped", "the [T_q,T_k] bias read as [T_k,T_q]",
                        [](const Problem& p) {
                          ScoreBias b = *p.bias;  // entry (i, j) read at flat i + j·T_q: the row and column strides swapped
                          for (Index e = 0; e < b.B * b.H; ++e) {
                            const double* at = p.bias->values.data() + e * b.T_q * b.T_k;
                            for (Index i = 0; i < b.T_q; ++i)
                              for (Index j = 0; j < b.T_k; ++j)
                                b.values[std::size_t(e * b.T_q * b.T_k + i * b.T_k + j)] = at[j * b.T_q + i];
                          }
                          return b;
                        }),
      .bug = "the bias's row and column strides swapped (a [T_k,T_q] layout read as [T_q,T_k]): right for one query",
      .minimal_shape = {1, 1, 2, 1},
      .why_minimal = "two queries (with one, the swap reads the same row)",
      .killed_by = {"oracle-agreement"},
  });
  z.push_back(Mutant{
      .impl = bias_impl("mutant:bias-scaled", "the bias multiplied by the softmax scale",
                        [](const Problem& p) {
                          ScoreBias b = *p.bias;
                          const double scale = resolve_scale(p.scale, p.q.shape().D, "mutant:bias-scaled");
                          for (double& x : b.values) x *= scale;
                          return b;
                        }),
      .bug = "the bias added before the scale, (q·k + b)·scale, as if it were part of the dot product: right only "
             "at scale 1",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "a scale other than 1 (an explicit one: at D = 1 the default is 1) and two keys whose biases "
                     "differ",
      .killed_by = {"oracle-agreement"},
  });
  {
    Capabilities caps = gqa_capabilities();
    caps.features.add({Feature::bias, Feature::key_padding});
    z.push_back(Mutant{
        .impl = head_impl(
            "mutant:bias-after-the-max", "the row max taken over the scores before the bias is added",
            [](const auto& Q, const auto& K, const auto& V, const HeadCtx& c) { return max_before_bias(Q, K, V, c); },
            caps),
        .bug = "the row max taken before the bias, exp(s + b - max s): exact in exact arithmetic and for the small "
               "biases of ordinary cases, but a row whose biases are all large overflows exp to Inf/Inf, and one "
               "whose biases are all very negative underflows to 0/0",
        .minimal_shape = {1, 1, 1, 1},
        .why_minimal = "one query, one key, a bias large enough to overflow exp (bias-row-shift adds 2^10)",
        .killed_by = {"bias-row-shift"},
    });
  }
  {
    Capabilities caps = bias_capabilities();
    caps.features.add(Feature::lse);
    z.push_back(Mutant{
        .impl = make_implementation(
            "mutant:bias-missing-from-the-lse", "the LSE returned without the bias (the output has it)", caps,
            [](const Problem& p) {
              Outcome o = reference_implementation()->forward(p);
              if (p.want_lse && p.bias) {
                Problem plain = p;
                plain.bias.reset();
                plain.want_weights = false;
                o.lse = reference_implementation()->forward(plain).lse;
              }
              return o;
            },
            [](const Problem& p) { return reference_implementation()->backward(p); }),
        .bug = "the log-sum-exp computed over the scores without the bias while the output has it (an LSE path "
               "that never saw the score_mod): a split-KV merge or a backward reading it weighs the rows wrongly",
        .minimal_shape = {1, 1, 1, 1},
        .why_minimal = "one query, one key with a bias other than 0: its LSE is s + b, returned as s",
        .killed_by = {"lse-oracle", "bias-row-shift"},
    });
  }
  {
    Capabilities caps = gqa_capabilities();
    caps.features.add({Feature::bias, Feature::key_padding});
    z.push_back(Mutant{
        .impl = head_impl(
            "mutant:bias-minus-inf-unguarded", "an online softmax with no guard for a running max of -inf",
            [](const auto& Q, const auto& K, const auto& V, const HeadCtx& c) { return online_unguarded(Q, K, V, c); },
            caps),
        .bug = "an online softmax that rescales by exp(m_old - m_new) with no guard for a running max still at -inf: "
               "a first key whose bias is -inf gives exp(-inf - (-inf)) = NaN for the whole row (FlashAttention's "
               "kernels check for it; a score_mod is what makes such a score)",
        .minimal_shape = {1, 1, 1, 1},
        .why_minimal = "one query over two keys (T_k = 2, bottom-right), the first with a bias of -inf",
        .killed_by = {"bias-minus-inf"},
    });
  }
  z.push_back(Mutant{
      .impl = bias_impl("mutant:bias-minus-inf-as-lowest", "a bias of -inf clamped to float's lowest finite value",
                        [](const Problem& p) {
                          ScoreBias b = *p.bias;
                          for (double& x : b.values)
                            if (x == -std::numeric_limits<double>::infinity()) x = std::numeric_limits<float>::lowest();
                          return b;
                        }),
      .bug = "-inf in the bias replaced by float's lowest finite value (-3.4e38, Hugging Face's finfo.min mask): the "
             "same weights while a row sees a key, but a row whose every key is hidden becomes the uniform average "
             "of values it must not see instead of an empty row",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "one query whose one key has a bias of -inf, its value other than 0",
      .killed_by = {"bias-minus-inf"},
  });
  {
    Capabilities caps = gqa_capabilities();
    caps.features.add({Feature::bias, Feature::alibi, Feature::key_padding});
    z.push_back(Mutant{
        .impl = head_impl(
            "mutant:alibi-flipped-beside-a-bias", "ALiBi's sign flipped in a kernel whose bias path is right",
            [](const auto& Q, const auto& K, const auto& V, const HeadCtx& c) { return alibi_flipped_with_bias(Q, K, V, c); },
            caps),
        .bug = "ALiBi with its sign flipped, slope (p - j), in a kernel that also takes an additive bias whose path is "
               "right: the same scores passed as a bias give other weights than passed as ALiBi",
        .minimal_shape = {1, 1, 1, 1},
        .why_minimal = "one query over two keys (T_k = 2, bottom-right) and a slope: with one key ALiBi adds 0",
        .killed_by = {"oracle-agreement", "alibi-as-bias"},
    });
  }
  z.push_back(Mutant{
      .impl = dbias_impl("mutant:dbias-zero", "dBias never computed (zeros)",
                         [](const Problem& p) {
                           return Tensor<double>(Shape{p.bias->B, p.bias->H, p.bias->T_q, p.bias->T_k});
                         }),
      .bug =
          "dBias left at 0: the score_mod's gradient dropped in the backward (silently wrong gradients for a learned "
          "bias)",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "one query over two keys (T_k = 2, bottom-right) with values that differ: dS is 0 for a row that "
                     "sees one key",
      .killed_by = {"grad-oracle"},
  });
  z.push_back(Mutant{
      .impl = dbias_impl("mutant:dbias-head0-only", "dBias of a bias shared by the heads taken from head 0 alone",
                         [](const Problem& p) { return reduced(p, per_head_ds(p), true); }),
      .bug = "dBias not summed over a broadcast head axis: a bias shared by every head gets head 0's score gradient "
             "alone",
      .minimal_shape = {1, 2, 1, 1},
      .why_minimal = "two query heads sharing one bias (and a kv head), one query over two keys (T_k = 2, "
                     "bottom-right)",
      .killed_by = {"grad-oracle", "grad-bias"},
  });
  z.push_back(Mutant{
      .impl =
          dbias_impl("mutant:dbias-after-softcap", "dBias taken after softcap's derivative (the raw score's gradient)",
                     [](const Problem& p) {
                       Tensor<double> ds = per_head_ds(p);
                       if (p.softcap) {
                         const double cap = *p.softcap,
                                      scale = resolve_scale(p.scale, p.q.shape().D, "mutant:dbias-after-softcap");
                         const Shape& s = ds.shape();
                         for (Index b = 0; b < s.B; ++b)
                           for (Index h = 0; h < s.H; ++h) {
                             const Index g = kv_head(h, s.H, p.k.shape().H);
                             const Matrix<double> raw =
                                 scale * Matrix<double>(p.q.head(b, h)) * Matrix<double>(p.k.head(b, g)).transpose();
                             for (Index i = 0; i < s.T; ++i)
                               for (Index j = 0; j < s.D; ++j) {
                                 const double t = std::tanh(raw(i, j) / cap);
                                 ds(b, h, i, j) *= 1 - t * t;
                               }
                           }
                       }
                       return reduced(p, ds);
                     },
                     {Feature::softcap}),
      .bug = "dBias taken as the gradient of the raw score (after multiplying by softcap's derivative 1 - tanh^2): "
             "the bias is added after the cap, so its gradient is the modified score's",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "a softcap and one query over two keys (T_k = 2, bottom-right) whose scores are not 0",
      .killed_by = {"grad-oracle"},
  });
  z.push_back(Mutant{
      .impl = dbias_impl("mutant:dbias-scaled", "dBias multiplied by the softmax scale",
                         [](const Problem& p) {
                           Tensor<double> d = reduced(p, per_head_ds(p));
                           d.values() *= resolve_scale(p.scale, p.q.shape().D, "mutant:dbias-scaled");
                           return d;
                         }),
      .bug = "dBias multiplied by the softmax scale, as if the bias were inside q·k (the backward of (q·k + b)·scale)",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "a scale other than 1 (an explicit one: at D = 1 the default is 1), one query over two keys",
      .killed_by = {"grad-oracle"},
  });
  z.push_back(Mutant{
      .impl = dbias_impl("mutant:dbias-without-the-sink", "dBias from weights renormalised without the sink",
                         [](const Problem& p) { return from_weights(p, true); }, {Feature::sinks}),
      .bug = "dBias from the weights renormalised over the keys, as if the sink took no share: right without sinks, "
             "wrong for every row whose sink takes weight",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "one query, one key and a sink (which takes a share of the row: the renormalised weight is 1, and "
                     "its dS 0)",
      .killed_by = {"grad-oracle"},
  });
  z.push_back(Mutant{
      .impl = dbias_impl("control:dbias-from-weights", "correct; dBias from the forward's weights and dO·v in double",
                         [](const Problem& p) { return from_weights(p, false); }, {Feature::sinks, Feature::softcap}),
      .bug = "control: dBias = P (dP - Delta) from the forward's weights as returned (rounded to the dtype) and dP = "
             "dO·v in double, summed over the bias's broadcast axes: another arithmetic than the core's",
      .control = true,
      .minimal_shape = {},
      .why_minimal = "a control: no case should fail",
      .killed_by = {},
  });
  z.push_back(Mutant{
      .impl = bias_impl("control:bias-read-through-strides", "correct; the bias read through its strides",
                        [](const Problem& p) {
                          return every_entry(p, [](Index b) { return b; }, [](Index h) { return h; });
                        }),
      .bug = "control: the bias written out for every batch entry and head through its strides (0 over a broadcast "
             "extent), then added where ALiBi is",
      .control = true,
      .minimal_shape = {},
      .why_minimal = "a control: no case should fail",
      .killed_by = {},
  });
  return z;
}

}  // namespace attncheck::zoo
