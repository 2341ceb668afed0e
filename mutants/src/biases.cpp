// Kernels that take an additive score bias (ABI 4's ATTNCHECK_CAP4_BIAS: T5's relative buckets, a learned bias, a
// FlexAttention score_mod written out) and read it wrong: the bias dropped on one path, its extents broadcast from
// the wrong entry, its strides swapped, or multiplied by the softmax scale as if it were part of q·k. Each reads the
// bias as its bug says and then attends as the reference does, forward and backward, so the reading is its only
// bug. And a control that reads it right.
#include <functional>

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
