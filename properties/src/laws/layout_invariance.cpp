// layout-invariance (issue 25): the same problem passed through other memory layouts gives the same result.
#include <string>

#include "registry.hpp"
#include "support.hpp"

namespace attncheck::law_kit {
namespace {
namespace layout_invariance_law {

const char* kWhy =
    "A kernel reads q, k and v through strides, and callers pass them in many layouts: [B,T,H,D] (FlashAttention, "
    "Hugging Face), slices with gaps between rows and heads, K and V broadcast over heads with a stride of 0 "
    "(PyTorch's expand), K and V interleaved in one fused buffer, V the very view K is (MLA). The values are the "
    "same in every layout, so the result must be: within 2 tol of the contiguous call (both are within the "
    "derived oracle bound tol of the same float64 oracle), and bit-identical for an implementation that declares "
    "layout invariance (ATTNCHECK_CAP3_LAYOUT_INVARIANT). A kernel that assumes contiguous inputs, takes the row "
    "stride from D, reads a stride-0 tensor as if it had every head, or reads V with K's strides breaks it; the "
    "gaps hold NaN, so a read between rows shows. Cases for the broadcast layout have every kv head equal, those "
    "for V-is-K have v = k. Applies to implementations that read strided inputs (ATTNCHECK_CAP3_STRIDED).";

// Padded first: shrinking moves toward it, and every one of its strides differs from the contiguous ones (rows,
// heads and batch entries each have a gap), so a case there shows an address bug at its smallest shape.
constexpr InputLayout kLayouts[] = {InputLayout::padded, InputLayout::token_major, InputLayout::kv_broadcast,
                                    InputLayout::kv_interleaved, InputLayout::v_is_k};

rc::Gen<LawCase> gen(const GenConfig& cfg) {
  return rc::gen::exec([cfg] {
    ProblemOptions po;
    po.allow_paged = false;  // paged K and V come as pools, not as strided tensors
    LawCase c = *gen_problem(cfg, po);
    // The layout (shrinking toward padded); the problem made to fit it.
    const InputLayout l = kLayouts[*rc::gen::inRange<std::size_t>(0, std::size(kLayouts))];
    Problem& p = c.problem;
    const Shape& ks = p.k.shape();
    if (l == InputLayout::kv_broadcast)  // one head in memory: every kv head is head 0
      for (Index b = 0; b < ks.B; ++b)
        for (Index g = 1; g < ks.H; ++g) {
          p.k.head(b, g) = p.k.head(b, 0);
          p.v.head(b, g) = p.v.head(b, 0);
        }
    if (l == InputLayout::v_is_k) p.v = p.k;
    Problem v = p;
    v.layout = l;
    c.variant = v;
    c.tags.push_back("layout=" + input_layout_name(l));
    return c;
  });
}

std::optional<Violation> check(const Implementation& impl, const LawCase& c) {
  const char* law = "layout-invariance";
  const Problem& p = c.problem;
  const Problem& laid = variant_of(c, law);
  const Outcome a = call(impl, p), b = call(impl, laid);
  const bool exact = impl.capabilities().layout_invariant;
  std::optional<Tensor<double>> tol;
  if (!exact) {
    tol = run_oracle(p).tol_out;
    tol->values() *= 2;
  }
  const std::string what = "the same problem with its inputs laid out " + input_layout_name(laid.layout);
  auto v = compare(law, "output", a.output, b.output, tol ? &*tol : nullptr, {});
  if (!v && exact && a.weights && b.weights) v = compare(law, "weights", *a.weights, *b.weights, nullptr, {});
  if (v) {
    v->message += " (the contiguous call vs. " + what + (exact ? ", declared bit-identical)" : ")");
    const auto& w = v->worst_index;
    if (v->quantity == "output") blame_derived_call(*v, p, a, laid, b, {w[0], w[1], w[2], w[3]}, what);
    v->weights = b.weights;
  }
  return v;
}

std::string not_applicable(const GenConfig& g) {
  return g.caps.strided ? "" : "the implementation does not read strided inputs (ATTNCHECK_CAP3_STRIDED)";
}

}  // namespace layout_invariance_law
}  // namespace

Law layout_invariance() {
  using namespace layout_invariance_law;
  return {"layout-invariance", "the same inputs in other memory layouts give the same result", kWhy, not_applicable,
          gen, check, 0};
}

}  // namespace attncheck::law_kit
