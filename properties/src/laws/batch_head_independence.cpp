// Law 8, batch-head-independence: changing one (b, kv group) slice changes no other; rotating batches or
// heads rotates the outputs.
#include "registry.hpp"
#include "support.hpp"

namespace attncheck::law_kit {
namespace {
namespace batch_head_independence_law {

const char* kWhy =
    "Each batch entry and each kv group (a kv head and the query heads that read it; one head without grouped "
    "queries) is its own attention problem: changing one must leave every other's output bit-identical "
    "(exact: their arithmetic is the same), and rotating the batches or the kv groups must rotate the outputs "
    "the same way (within both results' derived bounds, since memory alignment may change a kernel's summation "
    "path), each query head taking its ALiBi slope and sink with it. A mask or scale broadcast over the wrong "
    "axis, a [B,T,H,D] layout read as [B,H,T,D], or slopes read in another head order, breaks it. "
    "Needs two slices: not applicable under --max-B 1 --max-H 1.";

// One more kv group (a kv head and its query heads), so that a case with a single slice has two.
Problem with_extra_group(const Problem& p, const Tensor<double>& q, const Tensor<double>& k, const Tensor<double>& v) {
  const Shape qs = p.q.shape(), ks = p.k.shape();
  const Index group = qs.H / ks.H;
  Problem r = p;
  r.q = Tensor<double>({qs.B, qs.H + group, qs.T, qs.D});
  r.k = Tensor<double>({ks.B, ks.H + 1, ks.T, ks.D});
  r.v = Tensor<double>({ks.B, ks.H + 1, ks.T, p.v_dim()});
  for (Index b = 0; b < qs.B; ++b) {
    for (Index h = 0; h < qs.H + group; ++h) r.q.head(b, h) = h < qs.H ? p.q.head(b, h) : q.head(0, 0);
    for (Index g = 0; g < ks.H + 1; ++g) {
      r.k.head(b, g) = g < ks.H ? p.k.head(b, g) : k.head(0, 0);
      r.v.head(b, g) = g < ks.H ? p.v.head(b, g) : v.head(0, 0);
    }
  }
  // The new heads' slopes and sinks: the first group's, reversed (so a kernel that reverses them is seen).
  for (auto* per_head : {&r.alibi_slopes, &r.sinks})
    if (!per_head->empty())
      for (Index h = 0; h < group; ++h) per_head->push_back((*per_head)[std::size_t(group - 1 - h)]);
  return r;
}

rc::Gen<LawCase> gen(const GenConfig& cfg) {
  return rc::gen::exec([cfg] {
    // No block or dense mask: a second kv group and the rotations move heads and batch entries.
    LawCase c = *gen_problem(cfg, outputs_only().no_cell_masks());
    Problem& p = c.problem;
    // Independence needs two slices: a case with one gets a second kv group when the bounds allow another
    // head. Drawn unconditionally, so that shrinking the shape does not shift the draws after it.
    const Index T_q = p.q.shape().T, T_k = p.k.shape().T, D = p.q.shape().D;
    const Tensor<double> extra_q = *gen_tensor({1, 1, T_q, D}, Regime::normal, 1.0, cfg.dtype);
    const Tensor<double> extra_k = *gen_tensor({1, 1, T_k, D}, Regime::normal, 1.0, cfg.dtype);
    const Tensor<double> extra_v = *gen_tensor({1, 1, T_k, p.v_dim()}, Regime::normal, 1.0, cfg.dtype);
    if (p.q.shape().B * p.kv_heads() < 2 && cfg.max_H >= 2 * p.q.shape().H)
      p = with_extra_group(p, extra_q, extra_k, extra_v);
    const Shape s = p.q.shape();
    const Index H_kv = p.kv_heads(), group = s.H / H_kv;
    const Index b = *rc::gen::inRange<Index>(0, s.B), g = *rc::gen::inRange<Index>(0, H_kv);
    Problem v = p;
    const double m = *gen_magnitude();
    for (Index h = g * group; h < (g + 1) * group; ++h)
      v.q.head(b, h) = (*gen_tensor({1, 1, s.T, s.D}, Regime::normal, m, cfg.dtype)).head(0, 0);
    v.k.head(b, g) = (*gen_tensor({1, 1, T_k, s.D}, Regime::normal, m, cfg.dtype)).head(0, 0);
    v.v.head(b, g) = (*gen_tensor({1, 1, T_k, p.v_dim()}, Regime::normal, m, cfg.dtype)).head(0, 0);
    c.variant = v;
    c.params["b"] = double(b);
    c.params["g"] = double(g);
    c.params["rotate_b"] = double(*rc::gen::inRange<Index>(0, s.B));
    c.params["rotate_g"] = double(*rc::gen::inRange<Index>(0, H_kv));
    c.tags = shape_tags(p);
    return c;
  });
}

std::optional<Violation> check(const Implementation& impl, const LawCase& c) {
  const Problem& p = c.problem;
  const Index H = p.q.shape().H, H_kv = p.kv_heads(), group = H / H_kv;
  // Cases stored before kv groups name the changed head "h" (one head per group then).
  const char* law = "batch-head-independence";
  const Index cb = int_param(c, law, "b", 0, p.q.shape().B - 1), cg = int_param(c, law, "g", 0, H_kv - 1, "h");
  if (p.q.shape().B * H_kv < 2) return std::nullopt;  // one slice: nothing to be independent of
  const Outcome a = call(impl, p), b = call(impl, variant_of(c, law));
  auto v = compare(law, "output", a.output, b.output, nullptr,
                   [&](Index bb, Index hh, Index, Index) { return bb != cb || hh / group != cg; });
  if (v) {
    v->message += "; only batch entry " + std::to_string(cb) +
                  (group > 1 ? ", kv head " + std::to_string(cg) + " and the query heads that read it,"
                             : ", head " + std::to_string(cg)) +
                  " was changed";
    v->weights = b.weights;
    return v;
  }
  const Index rb = int_param(c, law, "rotate_b", 0, p.q.shape().B - 1);
  const Index rg = int_param(c, law, "rotate_g", 0, H_kv - 1, "rotate_h");
  if (rb == 0 && rg == 0) return std::nullopt;
  // Rotating kv heads by rg moves their query heads by rg·group, so the mapping h -> h / group is kept.
  Problem r = p;
  r.q = rotated_slices(r.q, rb, rg * group);
  r.k = rotated_slices(r.k, rb, rg);
  r.v = rotated_slices(r.v, rb, rg);
  if (!r.key_lengths.empty())
    for (Index bb = 0; bb < p.q.shape().B; ++bb)
      r.key_lengths[std::size_t((bb + rb) % p.q.shape().B)] = p.key_lengths[std::size_t(bb)];
  if (!r.doc_bounds.empty())  // a batch entry's documents travel with it
    for (Index bb = 0; bb < p.q.shape().B; ++bb)
      r.doc_bounds[std::size_t((bb + rb) % p.q.shape().B)] = p.doc_bounds[std::size_t(bb)];
  if (!r.q_doc_bounds.empty())
    for (Index bb = 0; bb < p.q.shape().B; ++bb)
      r.q_doc_bounds[std::size_t((bb + rb) % p.q.shape().B)] = p.q_doc_bounds[std::size_t(bb)];
  // A query head's ALiBi slope and sink travel with it.
  for (auto [from, to] : {std::pair{&p.alibi_slopes, &r.alibi_slopes}, std::pair{&p.sinks, &r.sinks}})
    if (!from->empty())
      for (Index h = 0; h < H; ++h) (*to)[std::size_t((h + rg * group) % H)] = (*from)[std::size_t(h)];
  const Outcome rot = call(impl, r);
  const OracleRun o = run_oracle(p);
  Tensor<double> tol = rotated_slices(o.tol_out, rb, rg * group);
  tol.values() *= 2;
  v = compare(law, "output", rotated_slices(a.output, rb, rg * group), rot.output, &tol, {});
  if (v) {
    v->message += " after rotating batches by " + std::to_string(rb) + " and " +
                  (group > 1 ? "kv heads by " + std::to_string(rg) + " (query heads by " +
                                   std::to_string(rg * group) + ")"
                             : "heads by " + std::to_string(rg)) +
                  " (the outputs must rotate the same way)";
    v->weights = rot.weights;
  }
  return v;
}

std::string not_applicable(const GenConfig& g) {
  return g.max_B * g.max_H < 2 ? "needs two (batch, head) slices, but --max-B and --max-H are both 1" : "";
}

}  // namespace batch_head_independence_law
}  // namespace

Law batch_head_independence() {
  using namespace batch_head_independence_law;
  return {"batch-head-independence",
          "changing one (b,h) slice changes no other; rotating batches or heads rotates the outputs",
          kWhy,
          LawDoc{"8", "changing one (b,h) slice changes no other; rotating batches/heads rotates outputs",
                 "exact / derived"},
          not_applicable,
          gen,
          check,
          0};
}

}  // namespace attncheck::law_kit
