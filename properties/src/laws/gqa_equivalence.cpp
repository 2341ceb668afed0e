// Law 17, gqa-equivalence: a call with H_kv kv heads agrees with the same implementation called on K and V
// repeated to H heads, within both results' derived bounds.
#include "registry.hpp"
#include "support.hpp"

namespace attncheck::law_kit {
namespace {
namespace gqa_equivalence_law {

const char* kWhy =
    "Grouped-query attention is defined as ordinary attention on K and V repeated to H heads "
    "(repeat_interleave: query head h reads kv head h / (H / H_kv)). So the implementation's grouped call and "
    "its own call on the repeated K and V must agree. Bit-identity is not required: a kernel may take another "
    "path (and summation order) for grouped heads. Both results are within the derived oracle bound of the "
    "same float64 oracle (the oracle of the repeated problem does the very same arithmetic), so they may "
    "differ by twice that bound (see oracle-agreement for the bound). A kernel that reads the kv head as "
    "h % H_kv, or computes the group size in a way that only works for powers of two, breaks it. Needs an "
    "implementation that declares grouped-query attention.";

std::optional<Violation> check(const Implementation& impl, const LawCase& c) {
  const Problem& p = c.problem;
  const Index H = p.q.shape().H;
  Problem repeated = p;
  repeated.k = repeat_kv_heads(p.k, H);
  repeated.v = repeat_kv_heads(p.v, H);
  const Outcome grouped = call(impl, p), full = call(impl, repeated);
  Tensor<double> tol = run_oracle(p).tol_out;
  tol.values() *= 2;
  // Rows that see no key follow the implementation's empty-row convention, checked by oracle-agreement.
  const auto seen = seen_rows(p);
  auto v = compare("gqa-equivalence", "output", full.output, grouped.output, &tol, seen);
  if (v) {
    v->message += " (K and V with H_kv = " + std::to_string(p.kv_heads()) +
                  " heads vs. the same call with K and V repeated to H = " + std::to_string(H) + " heads)";
    v->weights = grouped.weights;
    const std::array<Index, 4> at{v->worst_index[0], v->worst_index[1], v->worst_index[2], v->worst_index[3]};
    blame_derived_call(*v, p, grouped, repeated, full, at,
                       "the same call with K and V repeated to H = " + std::to_string(H) + " heads");
  }
  return v;
}

std::string not_applicable(const GenConfig& g) {
  return g.caps.declares(Feature::gqa)
             ? ""
             : "needs grouped-query attention (K and V with fewer heads than Q), which this implementation "
               "does not declare";
}

}  // namespace gqa_equivalence_law
}  // namespace

Law gqa_equivalence() {
  using namespace gqa_equivalence_law;
  return {"gqa-equivalence", "a grouped call equals the same call on K and V repeated to H heads, within the bound",
          kWhy,
          LawDoc{"16", "a call with H_kv kv heads = the same call with K and V repeated to H heads",
                 "2 × the derived oracle bound"},
          not_applicable,
          gen_outputs_only, check,
          0};
}

}  // namespace attncheck::law_kit
