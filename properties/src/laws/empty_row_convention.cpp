// empty-row-convention: a row that sees no key returns all 0 (the zero convention) or all NaN (nan), the same
// one in every call and at every dtype, never a mix inside one row, and the declared one when there is one.
#include "registry.hpp"
#include "support.hpp"

namespace attncheck::law_kit {
namespace {
namespace empty_row_convention_law {

const char* kWhy =
    "A query that sees no key (all its keys padding, or in its future under bottom-right alignment with "
    "T_q > T_k) has no softmax: libraries disagree on what it returns. FlashAttention returns 0 (output and "
    "weights: the zero convention, attncheck's core), PyTorch's math path NaN (the softmax of an all -inf row: "
    "the nan convention). Either is a choice; what a caller cannot live with is a choice that changes: the "
    "whole row (output and weights) must follow one convention, the same in every call and at every dtype, "
    "and the declared one (Capabilities::empty_rows) when the implementation declares one. Each case's rows "
    "that see no key are compared with each other and with a probe case (one query whose only key is padding, "
    "or T_q = 2 > T_k = 1 bottom-right) at every dtype the implementation accepts. A finite mask constant (the row becomes a uniform average of "
    "values it must not see) breaks it too. Exact: every entry is 0 or NaN. Needs rows that see no key: key "
    "lengths, or T_q > T_k under bottom-right alignment.";

struct RowConvention {
  std::optional<EmptyRows> kind;  ///< what the row follows, when it follows one
  std::optional<Violation> bad;   ///< neither convention, or a mix of both
};

Violation at(const std::string& quantity, std::vector<Index> index, double value, std::string message,
             const Outcome& o) {
  Violation v;
  v.quantity = quantity;
  v.worst_index = std::move(index);
  v.magnitude = value;
  v.message = "empty-row-convention: " + std::move(message);
  v.actual = quantity == "weights" ? *o.weights : o.output;
  v.weights = o.weights;
  return v;
}

// Row (b, h, i) of the output, then of the weights: all 0 is zero, all NaN is nan, anything else is a violation.
RowConvention row_convention(const Outcome& o, Index b, Index h, Index i, const std::string& where) {
  RowConvention r;
  std::string first;
  for (const auto& [name, t] : {std::pair{"output", &o.output}, std::pair{"weights", o.weights ? &*o.weights : nullptr}}) {
    if (!t) continue;
    for (Index c = 0; c < t->shape().D; ++c) {
      const double x = (*t)(b, h, i, c);
      const std::string here = std::string(name) + idx({b, h, i, c});
      if (x != 0 && !std::isnan(x)) {
        r.bad = at(name, {b, h, i, c}, x,
                   here + " = " + num(x) + " in a row that sees no key" + where +
                       ": neither 0 (the zero convention) nor NaN (the nan convention)",
                   o);
        return r;
      }
      const EmptyRows k = x == 0 ? EmptyRows::zero : EmptyRows::nan;
      if (!r.kind) {
        r.kind = k;
        first = here;
      } else if (*r.kind != k) {
        r.bad = at(name, {b, h, i, c}, x,
                   "a row that sees no key" + where + " mixes the conventions: " + first + " is " +
                       (*r.kind == EmptyRows::nan ? "NaN" : "0") + " but " + here + " is " + num(x),
                   o);
        return r;
      }
    }
  }
  return r;
}

// The probe case: one query that sees no key, the simplest the implementation can be asked.
Problem probe_case(const Capabilities& caps, DType dtype) {
  Problem p;
  p.dtype = dtype;
  const Index T_q = caps.declares(Feature::key_padding) ? 1 : 2, D = std::max<Index>(caps.smallest_head_dim(), 1);
  p.q = Tensor<double>({1, 1, T_q, D});
  p.k = Tensor<double>({1, 1, 1, D});
  p.v = Tensor<double>({1, 1, 1, D});
  p.q.values().setOnes();
  p.k.values().setOnes();
  p.v.values().setOnes();
  if (caps.declares(Feature::key_padding)) {
    p.key_lengths = {0};
    p.alignment = square_alignment(caps);
  } else {
    p.alignment = CausalAlignment::BottomRight;  // query 0 sits at position -1
  }
  p.want_weights = caps.returns_weights && !caps.weights_probed;  // a probed row's outputs say it all
  return p;
}

// The convention of the probe case at `dtype`.
RowConvention probe(const Implementation& impl, DType dtype) {
  const Outcome o = call(impl, probe_case(impl.capabilities(), dtype));
  return row_convention(o, 0, 0, 0, " (the probe case at " + std::string(dtype_name(dtype)) + ")");
}

std::string kind_word(EmptyRows e) { return e == EmptyRows::nan ? "NaN (nan)" : "0 (zero)"; }

rc::Gen<LawCase> gen(const GenConfig& cfg) {
  ProblemOptions po;
  po.allow.remove({Feature::sinks});  // a sink gives such a row a softmax term: 0 under either convention
  // Padded cases often have a sequence of length 0; without key padding, T_q > T_k bottom-right gives every case
  // such rows.
  if (cfg.caps.declares(Feature::key_padding)) po.require.add(Feature::key_padding);
  po.require_empty_row = !cfg.caps.declares(Feature::key_padding);
  return rc::gen::exec([cfg, po] {
    LawCase c = *gen_problem(cfg, po);
    // Every other case also calls the probe case at every dtype (one call each): the same fixed call in
    // every case, so 100 cases would repeat it 100 times (400 of the law's 500 calls) for no more evidence
    // than a few dozen; even a run of 10 cases (the sanitizer builds') misses it with probability 2^-10.
    // Shrinks toward not probing.
    c.params["probe_dtypes"] = double(*weighted_choice<int>({{1, 0}, {1, 1}}));
    return c;
  });
}

std::optional<Violation> check(const Implementation& impl, const LawCase& c) {
  const Problem& p = c.problem;
  const Capabilities& caps = impl.capabilities();
  std::optional<EmptyRows> expected = caps.empty_rows;
  std::string source = "the implementation declares it";
  // The case's own rows that see no key first, so that a failing case shows the row that broke the law.
  const Outcome o = call(impl, outputs_first(impl, p));
  const Shape& s = p.q.shape();
  for (Index b = 0; b < s.B; ++b)
    for (Index i = 0; i < s.T; ++i) {
      for (Index h = 0; h < s.H; ++h) {
        if (!sees_none(p, b, h, i)) continue;
        const std::string where = " (query " + std::to_string(i) + " of batch entry " + std::to_string(b) + ")";
        RowConvention r = row_convention(o, b, h, i, where);
        if (r.bad) return r.bad;
        if (!expected) {
          expected = r.kind;
          source = "the first row that sees no key" + where + " returns it";
        } else if (*r.kind != *expected) {
          return at("output", {b, h, i, 0}, o.output(b, h, i, 0),
                    "output" + idx({b, h, i, 0}) + " = " + num(o.output(b, h, i, 0)) + " in a row that sees no key" +
                        where + ": " + kind_word(*r.kind) + ", but expected " + kind_word(*expected) + " (" + source +
                        ")",
                    o);
        }
      }
    }
  if (!expected) return std::nullopt;  // no row that sees no key, nothing declared: nothing to compare
  // Cases stored before the probe was drawn always probed.
  if (c.params.count("probe_dtypes") && int_param(c, "empty-row-convention", "probe_dtypes", 0, 1) == 0)
    return std::nullopt;
  // The same convention in other calls and at every dtype: the probe case at each dtype the implementation
  // accepts. (A probe row that follows neither convention is left to the cases that contain one.)
  for (const DType t : caps.dtypes) {
    const RowConvention r = probe(impl, t);
    if (r.kind && !r.bad && *r.kind != *expected) {
      Violation v = at("output", {0, 0, 0, 0}, 0,
                       "at " + std::string(dtype_name(t)) + " the probe case's row that sees no key returns " +
                           kind_word(*r.kind) + ", but expected " + kind_word(*expected) + " (" + source +
                           "): the convention must not change across calls or dtypes",
                       o);
      return v;
    }
  }
  return std::nullopt;
}

std::string not_applicable(const GenConfig& g) {
  if (g.caps.empty_rows == EmptyRows::any)
    return "the implementation declares the output of a row that sees no key unspecified (every law skips those "
           "rows)";
  if (g.caps.declares(Feature::key_padding) ||
      (g.caps.cross_lengths && g.caps.q_longer && g.caps.supports(CausalAlignment::BottomRight)))
    return "";
  return "the implementation cannot be asked for a row that sees no key (that needs key lengths, or T_q > T_k "
         "under bottom-right alignment)";
}

// Which convention a run that held found.
std::string finding(const Implementation& impl, const GenConfig& g) {
  const RowConvention r = probe(impl, g.dtype);
  if (!r.kind) return "";
  const std::string name(empty_rows_name(*r.kind));
  return "rows that see no key follow the " + name + " convention (" +
         (impl.capabilities().empty_rows ? "declared" : "not declared; observed") + ")";
}

}  // namespace empty_row_convention_law
}  // namespace

Law empty_row_convention() {
  using namespace empty_row_convention_law;
  Law l{"empty-row-convention",
        "a row that sees no key returns all 0 or all NaN, the same in every call and dtype (the declared one, if any)",
        kWhy,
        LawDoc{"21",
               "a row that sees no key is all 0 or all NaN (output and weights), the same in every call and at every dtype, and the declared one if any",
               "exact"},
        not_applicable,
        gen,
        check,
        0};
  l.finding = finding;
  return l;
}

}  // namespace attncheck::law_kit
