// Law 46, batch-invariance: for an implementation that declares it, a sequence's outputs are
// bit-identical whatever else is in the batch, whatever the batch size, and whatever number of its queries a call
// holds.
#include "registry.hpp"
#include "support.hpp"

namespace attncheck::law_kit {
namespace {
namespace batch_invariance_law {

const char* kWhy =
    "An implementation that declares batch invariance (ATTNCHECK_CAP3_BATCH_INVARIANT, as vLLM's and SGLang's "
    "batch-invariant modes promise for reproducible inference) computes each sequence's rows the same way "
    "whatever the call around them: the same sequence alone (B = 1), in a batch twice as large with other "
    "sequences after it, and with its queries cut in two calls at a random point (the first over its own keys, the "
    "second over every key under bottom-right alignment, as a prefill followed by a chunk) must give bit-identical "
    "outputs. A kernel chosen by the batch size (flash-decoding's split heuristic) or by the number of queries "
    "(MLX's small-query path at T_q <= 8) rounds differently and breaks it, although each path is within the "
    "derived bound (paths-agree, decode-consistency and chunked-prefill hold every implementation to that bound). "
    "Exact: no tolerance. Rows that see no key are left to empty-row-convention.";

std::string not_applicable(const GenConfig& g) {
  if (!g.caps.declares(Feature::batch_invariant))
    return "declares no batch invariance (ATTNCHECK_CAP3_BATCH_INVARIANT); paths-agree, decode-consistency and "
           "chunked-prefill hold batches and query counts to the derived bound";
  return needs_square_shapes(g);
}

// The batch entries `entries` of t, in that order (repeats allowed).
Tensor<double> entries_of(const Tensor<double>& t, const std::vector<Index>& entries) {
  const Shape& s = t.shape();
  Tensor<double> r(Shape{Index(entries.size()), s.H, s.T, s.D});
  for (std::size_t n = 0; n < entries.size(); ++n)
    for (Index h = 0; h < s.H; ++h)
      for (Index i = 0; i < s.T; ++i)
        for (Index d = 0; d < s.D; ++d) r(Index(n), h, i, d) = t(entries[n], h, i, d);
  return r;
}

// p with the batch entries `entries` (the laws' generator draws no block, dense or paged case here).
Problem batch_of(const Problem& p, const std::vector<Index>& entries) {
  Problem r = p;
  r.q = entries_of(p.q, entries);
  r.k = entries_of(p.k, entries);
  r.v = entries_of(p.v, entries);
  if (!p.key_lengths.empty()) {
    r.key_lengths.clear();
    for (const Index b : entries) r.key_lengths.push_back(p.key_lengths[std::size_t(b)]);
  }
  if (!p.doc_bounds.empty()) {
    r.doc_bounds.clear();
    for (const Index b : entries) r.doc_bounds.push_back(p.doc_bounds[std::size_t(b)]);
  }
  if (!p.q_doc_bounds.empty()) {
    r.q_doc_bounds.clear();
    for (const Index b : entries) r.q_doc_bounds.push_back(p.q_doc_bounds[std::size_t(b)]);
  }
  return r;
}

rc::Gen<LawCase> gen(const GenConfig& cfg) {
  return rc::gen::exec([cfg] {
    // A later key never reaches an earlier row (the cut calls drop keys), positional cells cannot be cut, and
    // paged calls have their own laws.
    ProblemOptions po = outputs_only().causal_rule().no_cell_masks();
    po.allow_cross_lengths = false;  // square; the cut calls are the cross-length ones
    po.allow.remove({Feature::paged});
    LawCase c = *gen_problem(cfg, po);
    c.params["cut"] = double(*rc::gen::inRange<Index>(0, 1 << 20));
    return c;
  });
}

std::optional<Violation> exact(const char* what, const Problem& p, const Tensor<double>& want,
                               const Tensor<double>& got, Index row0 = 0) {
  const auto seen = seen_rows(p, row0);
  auto v = compare("batch-invariance", "output", want, got, nullptr, seen);
  if (v) v->message += ": " + std::string(what);
  return v;
}

std::optional<Violation> check(const Implementation& impl, const LawCase& c) {
  const Problem& p = c.problem;
  const Index B = p.q.shape().B, T = p.q.shape().T;
  const Outcome o = call(impl, p);
  // The batch doubled: every sequence again after the others, in reverse order.
  std::vector<Index> doubled;
  for (Index b = 0; b < B; ++b) doubled.push_back(b);
  for (Index b = B - 1; b >= 0; --b) doubled.push_back(b);
  std::vector<Index> first(doubled.begin(), doubled.begin() + B);
  const Outcome d = call(impl, batch_of(p, doubled));
  if (auto v = exact(("in a batch of " + std::to_string(2 * B) + " (the same sequences again, reversed, after them), "
                      "against the batch of " + std::to_string(B)).c_str(),
                     p, o.output, entries_of(d.output, first)))
    return v;
  // The last sequence alone.
  if (B > 1) {
    const Outcome one = call(impl, batch_of(p, {B - 1}));
    if (auto v = exact(("called alone (B = 1), against entry " + std::to_string(B - 1) + " of the batch of " +
                        std::to_string(B)).c_str(),
                       batch_of(p, {B - 1}), entries_of(o.output, {B - 1}), one.output))
      return v;
  }
  if (T < 2) return std::nullopt;
  // The queries cut at n: rows [0, n) over their own keys (a square call), rows [n, T) over every key,
  // bottom-right, where the implementation takes such calls.
  const Index n = 1 + int_param(c, "batch-invariance", "cut", 0, 1 << 20) % (T - 1);
  Problem head = cached_call(p, 0, n);
  head.alignment = square_alignment(impl.capabilities());
  const Outcome a = call(impl, head);
  if (auto v = exact(("in a call of the first " + std::to_string(n) + " queries, against the call of all " +
                      std::to_string(T)).c_str(),
                     p, first_rows(o.output, n), a.output))
    return v;
  const Capabilities& caps = impl.capabilities();
  if (caps.cross_lengths && caps.q_shorter && caps.supports(CausalAlignment::BottomRight)) {
    const Outcome b = call(impl, cached_call(p, n, T));
    if (auto v = exact(("in a call of queries " + std::to_string(n) + ".." + std::to_string(T - 1) +
                        " over every key (bottom-right), against the call of all " + std::to_string(T)).c_str(),
                       p, rows_of(o.output, n, T), b.output, n))
      return v;
  }
  return std::nullopt;
}

}  // namespace batch_invariance_law
}  // namespace

Law batch_invariance() {
  using namespace batch_invariance_law;
  return {"batch-invariance",
          "declared batch invariant: a sequence's outputs are bit-identical alone, in a larger batch, and with its "
          "queries split across calls",
          kWhy,
          LawDoc{"46",
                 "declared batch invariant: a sequence alone, in a batch twice as large, and with its queries cut across two calls gives bit-identical outputs",
                 "exact (bit-identical)"},
          not_applicable, gen, check, 0};
}

}  // namespace attncheck::law_kit
