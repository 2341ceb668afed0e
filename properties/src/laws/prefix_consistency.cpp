// Law 3b, prefix-consistency: attention over the first t+1 positions equals the first t+1 rows of attention
// over all T, within both results' derived bounds.
#include "registry.hpp"
#include "support.hpp"

namespace attncheck::law_kit {
namespace {
namespace prefix_consistency_law {

const char* kWhy =
    "Attention over the first t+1 positions equals the first t+1 rows of attention over all T: a causal "
    "model's output at a position cannot depend on how long the sequence is afterwards (what KV-cache "
    "decoding relies on). Changing T may change blocking and summation order, so this compares within the sum "
    "of both results' derived oracle bounds plus the oracle's own difference between the two. Key lengths are "
    "cut to the prefix (min(len, t+1)); a window stays as it is.";

rc::Gen<LawCase> gen(const GenConfig& cfg) {
  return rc::gen::exec([cfg] {
    // A later token must never reach an earlier row; the prefix calls cut the sequence (no block or dense mask:
    // their cells are positional).
    ProblemOptions po = outputs_only().causal_rule().no_cell_masks();
    po.allow_cross_lengths = false;
    LawCase c = *gen_problem(cfg, po);
    const Index T = c.problem.q.shape().T;
    const Index t = *rc::gen::inRange<Index>(0, std::max<Index>(T - 1, 1));
    Problem pre = c.problem;
    pre.q = first_rows(c.problem.q, t + 1);
    pre.k = first_rows(c.problem.k, t + 1);
    pre.v = first_rows(c.problem.v, t + 1);
    for (Index& len : pre.key_lengths) len = std::min(len, t + 1);
    c.variant = pre;
    c.params["t"] = double(t);
    return c;
  });
}

std::optional<Violation> check(const Implementation& impl, const LawCase& c) {
  const Problem& prefix = variant_of(c, "prefix-consistency");
  const Index n = prefix.q.shape().T;
  const Outcome full = call(impl, c.problem), pre = call(impl, prefix);
  const OracleRun of = run_oracle(c.problem), op = run_oracle(prefix);
  const Tensor<double> full_rows = first_rows(full.output, n);
  Tensor<double> tol = first_rows(of.tol_out, n);
  tol.values() += op.tol_out.values() + (first_rows(of.out, n).values() - op.out.values()).cwiseAbs();
  auto v = compare("prefix-consistency", "output", full_rows, pre.output, &tol, {});
  if (v) v->message += " (attention over the first " + std::to_string(n) + " positions vs. the first rows of all)";
  return v;
}

}  // namespace prefix_consistency_law
}  // namespace

Law prefix_consistency() {
  using namespace prefix_consistency_law;
  return {"prefix-consistency", "attention over the first t+1 positions equals the first t+1 rows of all", kWhy,
          LawDoc{"3b", "attention over the first t+1 positions = first t+1 rows of attention over all T",
                 "both results' derived bounds"},
          needs_square_shapes, gen, check, 0};
}

}  // namespace attncheck::law_kit
