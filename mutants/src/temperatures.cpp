// Kernels that take a per-query temperature (ABI 4's ATTNCHECK_CAP4_TEMPERATURE: Llama 4's attention temperature
// tuning, a decoding temperature applied inside attention) and get it wrong: dropped on a path, multiplied instead
// of divided, broadcast from the wrong head or query, applied to the keys, applied after the softcap, left out of the
// LSE, or left out of the backward's dQ. Most read the temperature as their bug says and then attend as the reference
// does, so the reading is their only bug. And a control that folds it into the scale instead.
#include <cmath>
#include <functional>

#include "attncheck/generators.hpp"
#include "parts.hpp"

namespace attncheck::zoo {
namespace {

// What these kernels declare: the temperature, grouped-query heads and key padding.
Capabilities temperature_capabilities(FeatureSet more = {}) {
  Capabilities c = gqa_capabilities();
  c.features.add({Feature::temperature, Feature::key_padding});
  for (std::size_t f = 0; f < kFeatureCount; ++f)
    if (more.has(Feature(f))) c.features.add(Feature(f));
  return c;
}

// The call a kernel effectively makes of p (its temperature, or its inputs, read as its bug says): the reference's
// forward and backward of it.
using AsRead = std::function<Problem(const Problem&)>;
ImplementationPtr read_impl(const char* name, const char* description, AsRead as_read, FeatureSet more = {}) {
  const auto read = [as_read](const Problem& p) { return p.temperature ? as_read(p) : p; };
  return make_implementation(
      name, description, temperature_capabilities(more),
      [read](const Problem& p) { return reference_implementation()->forward(read(p)); },
      [read](const Problem& p) { return reference_implementation()->backward(read(p)); });
}

// p's temperature written out for every (b, h, i), each value read at (b_of(b), h_of(h), i_of(i)).
Problem every_query(const Problem& p, const std::function<Index(Index)>& b_of, const std::function<Index(Index)>& h_of,
                    const std::function<Index(Index)>& i_of) {
  const Shape& s = p.q.shape();
  Problem r = p;
  QueryTemperature t{.B = s.B, .H = s.H, .T_q = s.T, .values = {}};
  for (Index b = 0; b < s.B; ++b)
    for (Index h = 0; h < s.H; ++h)
      for (Index i = 0; i < s.T; ++i) t.values.push_back((*p.temperature)(b_of(b), h_of(h), i_of(i)));
  r.temperature = std::move(t);
  return r;
}

// K with each key's row divided by the temperature at the key's own index (the last query's past T_q), for the
// first query head of its group: a fused kernel that applies the temperature while loading K instead of Q.
Problem on_the_keys(const Problem& p) {
  Problem r = p;
  r.temperature.reset();
  const Shape& ks = p.k.shape();
  const Index H = p.q.shape().H, T_q = p.q.shape().T, group = H / ks.H;
  for (Index b = 0; b < ks.B; ++b)
    for (Index g = 0; g < ks.H; ++g)
      for (Index j = 0; j < ks.T; ++j) {
        const double tau = (*p.temperature)(b, g * group, std::min(j, T_q - 1));
        for (Index c = 0; c < ks.D; ++c) r.k(b, g, j, c) = round_to(p.dtype, p.k(b, g, j, c) / tau);
      }
  return r;
}

// A head whose softcap comes before the temperature: cap·tanh(s/cap)/τ_i instead of cap·tanh((s/τ_i)/cap).
template <class M>
HeadOut<Scalar<M>> temperature_after_softcap(const M& Q, const M& K, const M& V, const HeadCtx& c) {
  using A = Scalar<M>;
  Matrix<A> s = scores(Q, K, c.resolved_scale());
  for (Index i = 0; i < s.rows(); ++i)
    for (Index j = 0; j < s.cols(); ++j) s(i, j) = modified_score(s(i, j), c, i, j) / A(c.temperature_at(i));
  return softmax_with_sink(causal_select(s, c), V, c);
}

// The control: each row's scale and temperature folded into one factor, scale/τ_i, rounded to the accumulation type
// and applied to the dot product (where the reference rounds q/τ_i to the dtype first), then the modifiers.
template <class M>
HeadOut<Scalar<M>> temperature_in_the_scale(const M& Q, const M& K, const M& V, const HeadCtx& c) {
  using A = Scalar<M>;
  Matrix<A> s = Q * K.transpose();
  for (Index i = 0; i < s.rows(); ++i) {
    const A row_scale = static_cast<A>(c.resolved_scale() / c.temperature_at(i));
    for (Index j = 0; j < s.cols(); ++j) s(i, j) = modified_score(A(s(i, j) * row_scale), c, i, j);
  }
  return softmax_with_sink(causal_select(s, c), V, c);
}

}  // namespace

std::vector<Mutant> temperature_mutants() {
  std::vector<Mutant> z;
  z.push_back(Mutant{
      .impl = read_impl("mutant:temperature-ignored", "the temperature never applied (a path that drops it)",
                        [](const Problem& p) {
                          Problem r = p;
                          r.temperature.reset();
                          return r;
                        }),
      .bug = "the per-query temperature dropped: a path (a decode kernel, a fallback) attends over the plain scores",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "one query over two keys (a decode step) whose scores differ, and a temperature other than 1",
      .killed_by = {"oracle-agreement", "temperature-as-query-scale"},
  });
  z.push_back(Mutant{
      .impl = read_impl("mutant:temperature-multiplied", "the scores multiplied by the temperature instead of divided",
                        [](const Problem& p) {
                          Problem r = p;
                          for (double& t : r.temperature->values) t = 1 / t;
                          return r;
                        }),
      .bug = "s·τ instead of s/τ: Llama 4's factor (which multiplies q) and a temperature (which divides the "
             "scores) confused; right only where τ = 1",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "one query over two keys whose scores differ, and a temperature other than 1",
      .killed_by = {"oracle-agreement", "temperature-as-query-scale"},
  });
  z.push_back(Mutant{
      .impl = read_impl("mutant:temperature-head0-everywhere", "head 0's temperatures read for every head",
                        [](const Problem& p) {
                          return every_query(
                              p, [](Index b) { return b; }, [](Index) { return Index{0}; }, [](Index i) { return i; });
                        }),
      .bug = "the temperature's head stride taken as 0: every head divides by head 0's, right only for one shared by "
             "the heads",
      .minimal_shape = {1, 2, 1, 1},
      .why_minimal = "two query heads with temperatures of their own (sharing a kv head), one query over two keys",
      .killed_by = {"oracle-agreement", "temperature-as-query-scale"},
  });
  z.push_back(Mutant{
      .impl = read_impl("mutant:temperature-query0-everywhere", "the first query's temperature read for every query",
                        [](const Problem& p) {
                          return every_query(
                              p, [](Index b) { return b; }, [](Index h) { return h; }, [](Index) { return Index{0}; });
                        }),
      .bug = "the temperature's query stride taken as 0 (a decode kernel's one value per sequence used in a prefill): "
             "right for a single query",
      .minimal_shape = {1, 1, 2, 1},
      .why_minimal = "two queries with temperatures that differ, the second seeing two keys",
      .killed_by = {"oracle-agreement", "temperature-as-query-scale"},
  });
  z.push_back(Mutant{
      // Its backward is the exact gradient of its own forward: dK = dK'/τ_j through k' = k/τ_j.
      .impl = make_implementation(
          "mutant:temperature-on-the-keys", "each key divided by the temperature at its own index",
          temperature_capabilities(),
          [](const Problem& p) { return reference_implementation()->forward(p.temperature ? on_the_keys(p) : p); },
          [](const Problem& p) {
            if (!p.temperature) return reference_implementation()->backward(p);
            Gradients g = reference_implementation()->backward(on_the_keys(p));
            const Shape& ks = p.k.shape();
            const Index H = p.q.shape().H, T_q = p.q.shape().T, group = H / ks.H;
            for (Index b = 0; b < ks.B; ++b)
              for (Index kv = 0; kv < ks.H; ++kv)
                for (Index j = 0; j < ks.T; ++j)
                  for (Index c = 0; c < ks.D; ++c)
                    g.dk(b, kv, j, c) /= (*p.temperature)(b, kv * group, std::min(j, T_q - 1));
            return g;
          }),
      .bug = "the temperature applied to K (key j divided by τ_j, the temperature at the key's index) instead of Q: "
             "a fused kernel that scales the tile it loads; right when every temperature is the same",
      .minimal_shape = {1, 1, 2, 1},
      .why_minimal = "two queries with temperatures that differ (the second sees key 0, divided by query 0's)",
      .killed_by = {"oracle-agreement", "temperature-as-query-scale"},
  });
  z.push_back(Mutant{
      .impl = head_impl(
          "mutant:temperature-after-softcap", "the softcap applied before the temperature",
          [](const auto& Q, const auto& K, const auto& V, const HeadCtx& c) {
            return temperature_after_softcap(Q, K, V, c);
          },
          temperature_capabilities({Feature::softcap})),
      .bug = "cap·tanh(s/cap)/τ instead of cap·tanh((s/τ)/cap): the temperature applied to the capped scores, so a "
             "row's scores can leave [-cap, cap]; right without a softcap",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "a softcap, a temperature other than 1 and one query over two keys whose scores differ",
      .killed_by = {"oracle-agreement", "temperature-as-query-scale"},
  });
  {
    Capabilities caps = temperature_capabilities({Feature::lse});
    caps.features.add(Feature::backward);
    z.push_back(Mutant{
        .impl = make_implementation(
            "mutant:temperature-missing-from-the-lse", "the LSE returned without the temperature (the output has it)",
            caps,
            [](const Problem& p) {
              Outcome o = reference_implementation()->forward(p);
              if (p.want_lse && p.temperature) {
                Problem plain = p;
                plain.temperature.reset();
                plain.want_weights = false;
                o.lse = reference_implementation()->forward(plain).lse;
              }
              return o;
            },
            [](const Problem& p) { return reference_implementation()->backward(p); }),
        .bug = "the log-sum-exp of the untempered scores returned beside a tempered output (an LSE path that never "
               "saw the temperature): a split-KV merge or a backward reading it weighs the rows wrongly",
        .minimal_shape = {1, 1, 1, 1},
        .why_minimal = "one query, one key with a score other than 0, and a temperature other than 1",
        .killed_by = {"lse-oracle", "temperature-as-query-scale"},
    });
  }
  {
    Capabilities caps = temperature_capabilities();
    caps.features.add(Feature::backward);
    z.push_back(Mutant{
        .impl = make_implementation(
            "mutant:dq-without-temperature", "dQ returned for q/τ (the prologue's output), not for q", caps,
            [](const Problem& p) { return reference_implementation()->forward(p); },
            [](const Problem& p) {
              if (!p.temperature) return reference_implementation()->backward(p);
              Problem folded = p;  // the kernel's own prologue q' = q/τ, then plain attention
              folded.q = fold_temperature(p.q, p.options());
              for (double& x : folded.q.values()) x = round_to(p.dtype, x);
              folded.temperature.reset();
              return reference_implementation()->backward(folded);
            }),
        .bug = "dQ left as the gradient of the tempered query q/τ (a fused prologue's backward that stops before "
               "the prologue): off by the factor 1/τ",
        .minimal_shape = {1, 1, 1, 1},
        .why_minimal = "one query over two keys (T_k = 2, bottom-right) with values that differ, and a temperature "
                       "other than 1",
        .killed_by = {"grad-oracle"},
    });
  }
  z.push_back(Mutant{
      .impl = head_impl(
          "control:temperature-in-the-scale", "correct; scale/τ_i folded into one factor per row",
          [](const auto& Q, const auto& K, const auto& V, const HeadCtx& c) {
            return temperature_in_the_scale(Q, K, V, c);
          },
          temperature_capabilities({Feature::softcap, Feature::alibi, Feature::sinks, Feature::lse})),
      .bug = "control: each row's scale and temperature folded into one factor scale/τ_i in the accumulation type "
             "and applied to q·k (the reference rounds q/τ_i to the dtype first), then softcap, ALiBi and sinks",
      .control = true,
      .minimal_shape = {},
      .why_minimal = "a control: no case should fail",
      .killed_by = {},
  });
  return z;
}

}  // namespace attncheck::zoo
