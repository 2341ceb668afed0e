// layout-invariance: the same problem passed through other memory layouts gives the same result.
#include <algorithm>
#include <string>

#include "registry.hpp"
#include "support.hpp"

namespace attncheck::law_kit {
namespace {
namespace layout_invariance_law {

// The first n columns of every row of t ([B,H,T,D] to [B,H,T,n], n <= D).
Tensor<double> first_columns(const Tensor<double>& t, Index n) {
  const Shape& s = t.shape();
  Tensor<double> r(Shape{s.B, s.H, s.T, n});
  for (Index b = 0; b < s.B; ++b)
    for (Index h = 0; h < s.H; ++h) r.head(b, h) = t.head(b, h).leftCols(n);
  return r;
}

const char* kWhy =
    "A kernel reads q, k and v through strides, and callers pass them in many layouts: [B,T,H,D] (FlashAttention, "
    "Hugging Face), slices with gaps between rows and heads, K and V broadcast over heads with a stride of 0 "
    "(PyTorch's expand), K and V interleaved in one fused buffer, V the very view K is (MLA). The values are the "
    "same in every layout, so the result must be: within 2 tol of the contiguous call (both are within the "
    "derived oracle bound tol of the same float64 oracle), and bit-identical for an implementation that declares "
    "layout invariance (ATTNCHECK_CAP3_LAYOUT_INVARIANT), weights included where it returns its own (weights "
    "recovered by one-hot V probes are outputs of other calls, and a probe cannot reach V when V is K's memory). A kernel that assumes contiguous inputs, takes the row "
    "stride from D, reads a stride-0 tensor as if it had every head, or reads V with K's strides breaks it; the "
    "gaps hold NaN, so a read between rows shows. Cases for the broadcast layout have every kv head equal, those "
    "for V-is-K have v = k (or K's first D_v columns, MLA's V inside its latent K). For an implementation with a "
    "backward, half the cases carry an upstream gradient dO and the backward is called in both layouts too: its "
    "dQ, dK and dV (and d_sinks) within 2 tol of the contiguous call's (tol: grad-oracle's derived bound), "
    "bit-identical where declared (a zero's sign aside, as in every exact law), so a backward kernel that reads its inputs with other strides than its forward "
    "does (FlashAttention's backward takes strides of its own) breaks it too. Applies to implementations that "
    "read strided inputs (ATTNCHECK_CAP3_STRIDED).";

// Padded first: shrinking moves toward it, and every one of its strides differs from the contiguous ones (rows,
// heads and batch entries each have a gap), so a case there shows an address bug at its smallest shape.
constexpr InputLayout kLayouts[] = {InputLayout::padded, InputLayout::token_major, InputLayout::kv_broadcast,
                                    InputLayout::kv_interleaved, InputLayout::v_is_k};

rc::Gen<LawCase> gen(const GenConfig& cfg) {
  return rc::gen::exec([cfg] {
    ProblemOptions po;
    po.allow.remove({Feature::paged});  // paged K and V come as pools, not as strided tensors
    // The layout (shrinking toward padded) and, with a backward, whether the case carries dO (half of them;
    // shrinking toward none: a forward case, unless the backward is what fails), both drawn before the case:
    // RapidCheck shrinks the picks of a generator in order and fixes every earlier pick once it shrinks a later
    // one, so a case drawn first would stay at its smallest shape for the layout it was found in (two heads,
    // two queries for an interleaved buffer) once the layout moved on to padded.
    const InputLayout l = kLayouts[*rc::gen::inRange<std::size_t>(0, std::size(kLayouts))];
    const bool grads = cfg.caps.declares(Feature::backward) && *rc::gen::inRange(0, 2) == 1;
    LawCase c = grads ? *gen_gradients_with(cfg, po) : *gen_problem(cfg, po);
    // The problem made to fit the layout.
    Problem& p = c.problem;
    const Shape& ks = p.k.shape();
    if (l == InputLayout::kv_broadcast)  // one head in memory: every kv head is head 0
      for (Index b = 0; b < ks.B; ++b)
        for (Index g = 1; g < ks.H; ++g) {
          p.k.head(b, g) = p.k.head(b, 0);
          p.v.head(b, g) = p.v.head(b, 0);
        }
    if (l == InputLayout::v_is_k) {  // V the view K is, or its first D_v columns (lay_out's view for D_v < D)
      const Index dv = std::min(p.v_dim(), ks.D);
      p.v = first_columns(p.k, dv);
      if (p.d_output && p.d_output->shape().D != dv) *p.d_output = first_columns(*p.d_output, dv);
    }
    Problem v = p;
    v.layout = l;
    c.variant = v;
    c.tags.push_back("layout=" + input_layout_name(l));
    if (grads) c.tags.push_back("layout-backward");
    return c;
  });
}

std::optional<Violation> check(const Implementation& impl, const LawCase& c) {
  const char* law = "layout-invariance";
  const Problem& p = c.problem;
  const Problem& laid = variant_of(c, law);
  // Weights only where the implementation returns its own: probed weights are outputs of other calls (one-hot V,
  // through a layout the probe reaches, never V-is-K), so they say nothing the outputs compared here do not.
  const Outcome a = call(impl, outputs_first(impl, p)), b = call(impl, outputs_first(impl, laid));
  const bool exact = impl.capabilities().declares(Feature::layout_invariant);
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
    return v;
  }
  if (!p.d_output) return std::nullopt;
  // The backward in both layouts (dO is the same contiguous tensor in both calls).
  const Gradients ga = accept_nan_empty_rows(impl, p, call_backward(impl, p));
  const Gradients gb = accept_nan_empty_rows(impl, laid, call_backward(impl, laid));
  std::optional<Gradients> gtol;
  if (!exact) {  // each within tol of the float64 oracle's gradients, so within 2 tol of each other
    gtol = run_gradient_oracle(p).tolerance;
    for (Tensor<double>* t : {&gtol->dq, &gtol->dk, &gtol->dv}) t->values() *= 2;
    if (gtol->dbias) gtol->dbias->values() *= 2;
    for (double& t : gtol->dsinks) t *= 2;
  }
  auto g = compare_gradients(law, ga, gb, gtol ? &*gtol : nullptr);
  if (g) g->message += " (the contiguous backward vs. the backward of " + what + (exact ? ", declared bit-identical)" : ")");
  return g;
}

std::string not_applicable(const GenConfig& g) {
  return g.caps.declares(Feature::strided) ? ""
                                           : "the implementation does not read strided inputs (ATTNCHECK_CAP3_STRIDED)";
}

}  // namespace layout_invariance_law
}  // namespace

Law layout_invariance() {
  using namespace layout_invariance_law;
  return {"layout-invariance", "the same inputs in other memory layouts give the same result", kWhy,
          LawDoc{"48",
                 "the same q, k, v passed padded, [B,T,H,D], K and V broadcast over heads (stride 0), interleaved in one buffer, or V the view K is, give the contiguous call's result",
                 "2 tol; exact (bit-identical) where declared layout invariant"},
          not_applicable,
          gen, check, 0};
}

}  // namespace attncheck::law_kit
