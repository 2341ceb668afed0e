// What the laws share (support.hpp).
#include "support.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <iterator>
#include <limits>
#include <memory>
#include <utility>
#include <tuple>

#include "attncheck/cancel.hpp"

namespace attncheck::law_kit {

double scale_of(const Problem& p) { return p.scale ? *p.scale : 1 / std::sqrt(double(p.q.shape().D)); }

KeyRange keys_of(const Problem& p, Index b, Index h, Index i) { return p.visibility(b, h).keys(i); }
bool visible(const Problem& p, Index b, Index h, Index i, Index j) { return p.visibility(b, h).visible(i, j); }

Include seen_rows(const Problem& p, Index row0) {
  const Shape& s = p.q.shape();
  auto sees = std::make_shared<std::vector<char>>(std::size_t(s.B * s.H * s.T));
  for (Index b = 0; b < s.B; ++b)
    for (Index h = 0; h < s.H; ++h) {
      const Visibility vis = p.visibility(b, h);
      for (Index i = 0; i < s.T; ++i) (*sees)[std::size_t((b * s.H + h) * s.T + i)] = !vis.keys(i).empty();
    }
  return [sees, H = s.H, T = s.T, row0](Index b, Index h, Index i, Index) {
    return sees->at(std::size_t((b * H + h) * T + i + row0)) != 0;
  };
}

Include hidden_keys(const Problem& p) {
  struct Row {  // the row asked about last, and its head's visibility
    Index b = -1, h = -1, i = -1;
    Visibility vis;
    KeyRange run;
  };
  return [&p, last = std::make_shared<Row>()](Index b, Index h, Index i, Index j) {
    Row& r = *last;
    if (b != r.b || h != r.h) {
      r.vis = p.visibility(b, h);
      r.b = b;
      r.h = h;
      r.i = -1;
    }
    if (i != r.i) {
      r.run = r.vis.run(i);
      r.i = i;
    }
    return !(r.run.contains(j) && r.vis.cells_allow(i, j));  // Visibility::visible, its run(i) kept
  };
}

Index causal_last_key(const Problem& p, Index i) {
  return last_visible_key(i, p.q.shape().T, p.k.shape().T, p.alignment);
}

std::string why_hidden(const Problem& p, Index b, Index h, Index i, Index j) {
  const Visibility v = p.visibility(b, h);
  const std::string q = "query " + std::to_string(i), family = v.hidden_by(i, j);
  if (family == "causal") return "in the future of " + q;
  if (family == "padding")
    return "padding (key_lengths[" + std::to_string(b) + "] = " + std::to_string(v.key_length) + ")";
  if (family == "window") return "outside the window of " + q + " (window " + std::to_string(*v.window) + ")";
  if (family == "right window")
    return "past the right window of " + q + " (window_right " + std::to_string(*v.window_right) + ")";
  if (family == "chunk")
    return "in another chunk than " + q + " (chunks of " + std::to_string(v.chunk) + ": key " + std::to_string(j) +
           " in chunk " + std::to_string(j / v.chunk) + ")";
  if (family == "document")
    return "in another document than " + q + " (key " + std::to_string(j) + " in document " +
           std::to_string(v.key_document(j)) + ", the query in document " + std::to_string(v.query_document(i)) + ")";
  if (family == "block mask") {
    const BlockKind k = v.block->kind(b, h, i / v.block->block_q, j / v.block->block_k);
    return "hidden from " + q + " by the block mask (block (" + std::to_string(i / v.block->block_q) + "," +
           std::to_string(j / v.block->block_k) + ") of head " + std::to_string(h) + " is " +
           (k == BlockKind::Empty ? "empty" : "partial, its cell hidden") + ")";
  }
  if (family == "dense mask") return "hidden from " + q + " by the dense mask (head " + std::to_string(h) + ")";
  if (family == "bias") return "hidden from " + q + " by a bias of -inf";
  return "hidden from " + q;
}

std::string idx(std::initializer_list<Index> v) {
  std::string s = "[";
  for (auto it = v.begin(); it != v.end(); ++it) s += (it == v.begin() ? "" : ",") + std::to_string(*it);
  return s + "]";
}

bool same_value(double a, double b) {
  if (std::isnan(a) && std::isnan(b)) return true;
  return a == b;  // +0 == -0; every other double has one encoding, so == is bitwise there
}

bool long_context(const Problem& p) {
  const Shape& q = p.q.shape();
  return double(q.B) * double(q.H) * double(q.T) * double(p.k.shape().T) > kMaterialisedWeights;
}

const Problem& variant_of(const LawCase& c, const char* law) {
  if (!c.variant)
    throw std::invalid_argument(std::string(law) + ": this case has no \"variant\" problem, which the law compares "
                                "the first one against (a stored case written by another program?)");
  return *c.variant;
}

Tensor<double> rotated_slices(const Tensor<double>& t, Index rb, Index rh) {
  const Shape& s = t.shape();
  Tensor<double> r(s);
  for (Index b = 0; b < s.B; ++b)
    for (Index h = 0; h < s.H; ++h) r.head((b + rb) % s.B, (h + rh) % s.H) = t.head(b, h);
  return r;
}

Index int_param(const LawCase& c, const char* law, const char* key, Index lo, Index hi, const char* fallback) {
  auto it = c.params.find(key);
  if (it == c.params.end() && fallback) it = c.params.find(fallback);
  const std::string name = it != c.params.end() ? it->first : key;
  const std::string expected = "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  if (it == c.params.end())
    throw std::invalid_argument(std::string(law) + ": this case has no parameter \"" + name + "\" (expected " +
                                expected + "; a stored case written by another program?)");
  // Compared as doubles first: converting a double outside Index's range to Index is undefined.
  const double x = it->second;
  if (!(x >= double(lo) && x <= double(hi)) || x != std::floor(x))
    throw std::invalid_argument(std::string(law) + ": the case's parameter \"" + name + "\" is " +
                                num(x) + ", expected " + expected);
  return Index(x);
}

Outcome call(const Implementation& impl, const Problem& p) {
  if (p.want_weights && long_context(p)) {
    Problem plain = p;
    plain.want_weights = false;
    return call(impl, plain);
  }
  throw_if_cancelled("a law's call");  // a law that makes T calls per case stops between them when asked
  Outcome o = impl.forward(p);
  check_outcome_shape(p, o, impl.name());
  if (p.want_weights && !o.weights)
    throw ImplementationError(ImplementationError::Kind::protocol,
                              impl.name() + ": returned no weights although it declares that it returns them");
  if (p.want_lse && impl.capabilities().declares(Feature::lse) && !o.lse)
    throw ImplementationError(ImplementationError::Kind::protocol,
                              impl.name() + ": returned no log-sum-exp although it declares that it returns it");
  // Rows whose output the implementation declares unspecified are not read by any law.
  return canonical_outcome(p, impl.capabilities(), std::move(o));
}

Problem outputs_first(const Implementation& impl, const Problem& p) {
  Problem first = p;
  if (impl.capabilities().weights_probed) first.want_weights = false;
  return first;
}

std::optional<Tensor<double>> weights_of(const Implementation& impl, const LawCase& c, const Outcome& o) {
  // Probed weights are not asked for: a law that compares whole weights compares outputs of a probed
  // implementation instead (they are what its weights are recovered from), or samples them (samples_weights).
  if (o.weights || !c.problem.want_weights || c.outputs_only || long_context(c.problem) ||
      impl.capabilities().weights_probed)
    return o.weights;
  return call(impl, c.problem).weights;
}

std::string needs_weights(const GenConfig& g) {
  return g.caps.returns_weights ? "" : "needs the attention weights, which this implementation does not return";
}

namespace {


// The streamed oracle of a long context: outputs and their bound in O(T·D), weights on demand.
OracleRun run_streamed_oracle(const Problem& p, const AttentionOptions& opts_in) {
  const AttentionOptions opts = folded_options(opts_in);  // the bound's modifiers (the oracle folds it itself)
  OracleRun r;
  r.streamed = true;
  r.out = streaming_oracle<double>(p.q, p.k, p.v, opts_in, &r.stats);
  r.tol_out = Tensor<double>(r.out.shape());
  const Shape& s = p.q.shape();
  r.rho_w = Tensor<double>({s.B, s.H, s.T, 1});
  r.lse = Tensor<double>({s.B, s.H, s.T, 1});
  r.tol_lse = Tensor<double>({s.B, s.H, s.T, 1});
  Eigen::VectorXd abs_dot(s.T), abs_score(s.T), rho;
  for (Index b = 0; b < s.B; ++b) {
    for (Index h = 0; h < s.H; ++h) {
      const Visibility vis = p.visibility(b, h);
      for (Index i = 0; i < s.T; ++i) {
        abs_dot(i) = r.stats.abs_dot(b, h, i);
        abs_score(i) = r.stats.abs_score(b, h, i);
      }
      r.tol_out.head(b, h) = streamed_output_tolerance(p.dtype, p.q.shape().D, p.v.head(b, kv_of(p, h)), vis, abs_dot, abs_score,
                                                       r.out.head(b, h), &rho, kSafety,
                                                       head_modifiers(opts, b, h, s.T, p.k.shape().T));
      r.rho_w.head(b, h) = rho;
      for (Index i = 0; i < s.T; ++i) {
        r.lse(b, h, i, 0) = r.stats.lse(b, h, i);
        r.tol_lse(b, h, i, 0) = lse_tolerance(p.dtype, rho(i), r.lse(b, h, i, 0), kSafety);
      }
    }
  }
  return r;
}

}  // namespace

double OracleRun::weight(const Problem& p, Index b, Index h, Index i, Index j) const {
  return streamed ? streamed_weight(p.q, p.k, p.options(), stats, b, h, i, j) : w(b, h, i, j);
}

double OracleRun::weight_tol(const Problem& p, Index b, Index h, Index i, Index j) const {
  if (!streamed) return tol_w(b, h, i, j);
  return visible(p, b, h, i, j) ? weight_tolerance(p.dtype, weight(p, b, h, i, j), rho_w(b, h, i, 0), kSafety) : 0.0;
}

std::vector<Index> sample_keys(Index T_k, std::size_t max_keys) {
  std::vector<Index> keys;
  const auto add = [&](Index j) {
    if (j >= 0 && j < T_k && keys.size() < max_keys && std::find(keys.begin(), keys.end(), j) == keys.end())
      keys.push_back(j);
  };
  // Most telling first: the last key and key 1 are each in the future of other rows (key 0 of none).
  for (const Index j : {T_k - 1, Index{1}, T_k / 2 + 1, Index{0}, T_k / 2, T_k - 2}) add(j);
  for (Index t = 16; t < T_k; t *= 2)
    for (const Index j : {t, t - 1, t + 1}) add(j);
  std::sort(keys.begin(), keys.end());
  return keys;
}

std::vector<Index> sampled_keys(const Problem& p) {
  return sample_keys(p.k.shape().T, std::min(kSampledKeys, kProbeCalls * std::size_t(p.k.shape().D)));
}

bool samples_weights(const Implementation& impl, const Problem& p) {
  return long_context(p) || impl.capabilities().weights_probed;
}

std::vector<Index> sampled_keys(const Implementation&, const Problem& p) {
  if (long_context(p)) return sampled_keys(p);
  return sample_keys(p.k.shape().T, std::min(kSampledKeys, kProbedCalls * std::size_t(p.v_dim())));
}

WeightSample sample_weights(const Implementation& impl, const Problem& p, const std::vector<Index>& keys) {
  const Shape qs = p.q.shape(), ks = p.v.shape();  // one-hot V columns: D_v keys a call
  WeightSample s;
  s.keys = keys;
  s.w = Tensor<double>({qs.B, qs.H, qs.T, Index(keys.size())});
  Problem probe = probe_layout(p);  // never through a layout whose V the probe cannot reach (V-is-K)
  probe.want_weights = false;
  for (std::size_t start = 0; start < keys.size(); start += std::size_t(ks.D)) {
    const Index width = std::min<Index>(ks.D, Index(keys.size() - start));
    probe.v = Tensor<double>(ks);
    for (Index b = 0; b < ks.B; ++b)
      for (Index g = 0; g < ks.H; ++g)
        for (Index c = 0; c < width; ++c) probe.v(b, g, keys[start + std::size_t(c)], c) = 1;
    const Outcome o = call(impl, probe);
    ++s.calls;
    for (Index b = 0; b < qs.B; ++b)
      for (Index h = 0; h < qs.H; ++h)
        for (Index i = 0; i < qs.T; ++i)
          for (Index c = 0; c < width; ++c) s.w(b, h, i, Index(start) + c) = o.output(b, h, i, c);
  }
  return s;
}

std::string describe_sample(const WeightSample& s, const Problem& p) {
  std::string keys;
  for (const Index j : s.keys) keys += (keys.empty() ? "" : ",") + std::to_string(j);
  return std::string(long_context(p) ? "long context (B*H*T_q*T_k > 2^22)" : "weights probed from outputs") +
         ": weights sampled at keys {" + keys + "} (" +
         std::to_string(s.keys.size()) + " of " + std::to_string(p.k.shape().T) + ") for all " +
         std::to_string(p.q.shape().T) + " query rows, by " + std::to_string(s.calls) + " one-hot calls";
}

Verdict on_sample(std::optional<Violation> v, const WeightSample& s, const Problem& p) {
  const std::string what = describe_sample(s, p);
  if (!v) return {std::nullopt, what};
  if (v->worst_index.size() == 4) v->worst_index[3] = s.keys[std::size_t(v->worst_index[3])];
  v->expected.reset();
  v->actual.reset();
  v->tolerances.reset();
  v->message += " [" + what + "]";
  return {std::move(v), what};
}

// The core streams its backward exactly where the laws call a case a long context.
static_assert(kStreamedBackwardWeights == kMaterialisedWeights);

std::string needs_backward(const GenConfig& g) {
  if (!g.caps.declares(Feature::backward))
    return "needs a backward pass (dQ, dK, dV from dO), which this implementation does not have";
  // Any length: a long context's float64 oracle backward and its bound are streamed (streamed_gradient_check).
  return "";
}

Gradients call_backward(const Implementation& impl, const Problem& p) {
  throw_if_cancelled("a law's backward call");
  Gradients g = impl.backward(p);
  check_gradients_shape(p, g, impl.name(), impl.capabilities());
  // dBias only from an implementation that declares it (one built on another's backward may return another's).
  if (!impl.capabilities().declares(Feature::bias_grad) || !p.bias) g.dbias.reset();
  return g;
}

rc::Gen<LawCase> gen_gradients(const GenConfig& cfg) { return gen_gradients_with(cfg, outputs_only()); }

rc::Gen<LawCase> gen_gradients_with(const GenConfig& cfg, const ProblemOptions& po) {
  return rc::gen::map(gen_gradient_case(cfg, po), [cfg](LawCase c) { return zero_empty_row_d_output(cfg, std::move(c)); });
}

LawCase zero_empty_row_d_output(const GenConfig& cfg, LawCase c) {
  Problem& p = c.problem;
  if (cfg.caps.empty_rows == EmptyRows::zero || !p.d_output) return c;
  bool zeroed = false;
  for (Index b = 0; b < p.q.shape().B; ++b)
    for (Index h = 0; h < p.q.shape().H; ++h)
      for (Index i = 0; i < p.q.shape().T; ++i)
        if (sees_none(p, b, h, i) && !p.d_output->head(b, h).row(i).isZero(0)) {
          p.d_output->head(b, h).row(i).setZero();
          zeroed = true;
        }
  if (zeroed) c.tags.push_back("dO=0-on-empty-rows");
  return c;
}

Gradients accept_nan_empty_rows(const Implementation& impl, const Problem& p, Gradients g) {
  if (impl.capabilities().empty_rows == EmptyRows::zero) return g;
  for (Index b = 0; b < g.dq.shape().B; ++b)
    for (Index h = 0; h < g.dq.shape().H; ++h) {
      auto dq = g.dq.head(b, h);
      for (Index i = 0; i < g.dq.shape().T; ++i)
        // Under the any convention (unspecified output) the row's dQ is unspecified too.
        if (sees_none(p, b, h, i) &&
            (impl.capabilities().empty_rows == EmptyRows::any || dq.row(i).array().isNaN().all()))
          dq.row(i).setZero();
    }
  return g;
}

GradientCheck run_gradient_oracle(const Problem& p, const GradientRows* only) {
  // A long context: the same oracle and bound streamed, in O(T·D) memory (attention/src/backward_streamed.cpp).
  if (long_context(p) || only)
    return streamed_gradient_check(p.dtype, p.q, p.k, p.v, *p.d_output, p.options(), kSafety, only);
  return gradient_check(p.dtype, p.q, p.k, p.v, *p.d_output, p.options(), kSafety);
}

std::vector<Index> sample_row_blocks(Index T, Index rows, Index blocks) {
  const Index count = (T + rows - 1) / rows;
  std::vector<Index> out;
  Index last = -1;
  for (Index n = 0; n < std::min(count, blocks); ++n) {
    const Index blk = blocks >= count ? n : n * (count - 1) / (blocks - 1);
    if (blk == last) continue;
    last = blk;
    for (Index i = blk * rows; i < std::min(T, (blk + 1) * rows); ++i) out.push_back(i);
  }
  return out;
}

std::optional<Violation> compare_gradients(const std::string& what, const Gradients& expected, const Gradients& actual,
                                           const Gradients* tol, const Include& include, const Include& key_include) {
  const Include& keys = key_include ? key_include : include;
  for (const auto& [name, e, a, t, in] :
       {std::tuple{"dq", &expected.dq, &actual.dq, tol ? &tol->dq : nullptr, &include},
        std::tuple{"dk", &expected.dk, &actual.dk, tol ? &tol->dk : nullptr, &keys},
        std::tuple{"dv", &expected.dv, &actual.dv, tol ? &tol->dv : nullptr, &keys}})
    if (auto v = compare(what, name, *e, *a, t, *in)) return v;
  // The sinks' gradients, one per query head, as a [1,H,1,1] tensor.
  if (!expected.dsinks.empty() && actual.dsinks.size() == expected.dsinks.size()) {
    const Index H = Index(expected.dsinks.size());
    Tensor<double> e({1, H, 1, 1}), a({1, H, 1, 1}), t({1, H, 1, 1});
    for (Index h = 0; h < H; ++h) {
      e(0, h, 0, 0) = expected.dsinks[std::size_t(h)];
      a(0, h, 0, 0) = actual.dsinks[std::size_t(h)];
      if (tol) t(0, h, 0, 0) = tol->dsinks[std::size_t(h)];
    }
    if (auto v = compare(what, "d_sinks", e, a, tol ? &t : nullptr, {})) return v;
  }
  // dBias, in the bias's shape (present only where the implementation declares it: call_backward).
  if (expected.dbias && actual.dbias && actual.dbias->shape() == expected.dbias->shape())
    if (auto v =
            compare(what, "d_bias", *expected.dbias, *actual.dbias, tol && tol->dbias ? &*tol->dbias : nullptr, {}))
      return v;
  return std::nullopt;
}

Eigen::VectorXd row_abs_score_bound(const Problem& p, Index b, Index h) {
  const Visibility vis = p.visibility(b, h);
  Eigen::VectorXd s = row_score_bound(p.q.head(b, h), p.k.head(b, kv_of(p, h)), vis, scale_of(p));
  const double slope = p.alibi_slopes.empty() ? 0.0 : std::abs(p.alibi_slopes[std::size_t(h)]);
  const double sink = p.sinks.empty() || !std::isfinite(p.sinks[std::size_t(h)]) ? 0.0 : std::abs(p.sinks[std::size_t(h)]);
  const double* bias = p.bias ? p.bias->head(b, h) : nullptr;
  for (Index i = 0; i < s.size(); ++i) {
    const KeyRange r = vis.keys(i);
    if (r.empty()) continue;
    if (p.temperature) s(i) /= (*p.temperature)(b, h, i);  // the raw score divided, before the softcap
    const Index pos = vis.position(i);
    s(i) += slope * double(std::max(std::abs(r.begin - pos), std::abs(r.end - 1 - pos)));
    if (bias) {  // a -inf hides its cell: only finite values add
      double most = 0;
      for (Index j = 0; j < p.bias->T_k; ++j)
        if (const double x = bias[i * p.bias->T_k + j]; std::isfinite(x)) most = std::max(most, std::abs(x));
      s(i) += most;
    }
    s(i) = std::max(s(i), sink);
  }
  return s;
}

OracleRun run_oracle(const Problem& p) {
  OracleRun r;
  AttentionOptions opts = p.options();
  opts.scale = scale_of(p);
  if (long_context(p)) return run_streamed_oracle(p, opts);
  // Dropout: the mask the problem holds (a law reads it off the kernel's weights), or the core's own draw.
  opts = with_dropout_mask(opts, p.q.shape().B, p.q.shape().H, p.q.shape().T, p.k.shape().T);
  r.out = attention<double>(p.q, p.k, p.v, opts, &r.w, &r.lse);
  // The bound is taken on the call with its prologue folded into q and k (tolerance.cpp steps 8 and 9).
  const Tensor<double> q = fold_queries(p.q, opts, "oracle"), k = fold_keys(p.k, opts, "oracle");
  const AttentionOptions folded = folded_options(opts);
  r.tol_out = Tensor<double>(r.out.shape());
  r.tol_w = Tensor<double>(r.w.shape());
  r.tol_lse = Tensor<double>(r.lse.shape());
  const Shape& s = p.q.shape();
  for (Index b = 0; b < s.B; ++b) {
    for (Index h = 0; h < s.H; ++h) {
      const BoolMask mask = BoolMask::of(p.visibility(b, h));  // (per head: a block or dense mask may differ)
      const Index g = kv_of(p, h);
      const HeadModifiers mods = head_modifiers(folded, b, h, s.T, p.k.shape().T);
      const HeadTolerance t = head_tolerance(p.dtype, q.head(b, h), k.head(b, g), p.v.head(b, g), mask, *opts.scale,
                                             r.out.head(b, h), r.w.head(b, h), kSafety, mods);
      r.tol_out.head(b, h) = t.output;
      r.tol_w.head(b, h) = t.weights;
      Eigen::VectorXd x;
      const Eigen::VectorXd rho =
          weight_relative_error(p.dtype, q.head(b, h), k.head(b, g), mask, *opts.scale, mods, &x);
      for (Index i = 0; i < s.T; ++i)
        r.tol_lse(b, h, i, 0) = lse_tolerance(p.dtype, rho(i), r.lse(b, h, i, 0), kSafety, x(i));
    }
  }
  return r;
}

Tensor<double> lse_bound(const Problem& p, const OracleRun& r) {
  Problem mine = p;
  mine.want_weights = false;
  mine.want_lse = true;
  const Outcome ref = reference_implementation()->forward(mine);
  Tensor<double> tol = r.tol_lse;
  const double u_a = accumulation_roundoff(p.dtype);
  for (Index n = 0; n < tol.size(); ++n) {
    const double want = r.lse.values()[n];
    if (!std::isfinite(want)) continue;  // exactly -inf
    tol.values()[n] =
        std::max(tol.values()[n], 2 * std::abs(ref.lse->values()[n] - want) + u_a * std::max(1.0, std::abs(want)));
  }
  return tol;
}

std::optional<Violation> calls_agree(const char* law, const Implementation& impl, const Problem& p, const Problem& q,
                                     const std::string& what, const std::string& why) {
  const Outcome a = call(impl, p), b = call(impl, q);
  const OracleRun ra = run_oracle(p), rb = run_oracle(q);
  const auto seen = seen_rows(p);
  Tensor<double> tol = ra.tol_out;
  tol.values() += rb.tol_out.values() + (ra.out.values() - rb.out.values()).cwiseAbs();
  std::optional<Violation> v = compare(law, "output", a.output, b.output, &tol, seen);
  if (!v && p.want_lse && a.lse && b.lse) {
    Tensor<double> tl = lse_bound(p, ra);
    const Tensor<double> tb = lse_bound(q, rb);
    for (Index n = 0; n < tl.size(); ++n) {
      const double gap = std::abs(ra.lse.values()[n] - rb.lse.values()[n]);
      tl.values()[n] += tb.values()[n] + (std::isfinite(gap) ? gap : 0.0);
    }
    v = compare(law, "lse", *a.lse, *b.lse, &tl, seen);
  }
  if (v) {
    v->message += "; " + why + " (" + what + " vs. the case as drawn)";
    v->call = q;
    v->call_what = what;
  }
  return v;
}

std::optional<Violation> compare(const std::string& what, const std::string& quantity, const Tensor<double>& expected,
                                 const Tensor<double>& actual, const Tensor<double>* tol, const Include& include) {
  constexpr double kExactTolerance = std::numeric_limits<float>::denorm_min();
  const Shape& s = expected.shape();
  if (actual.shape() != s || (tol && tol->shape() != s))
    throw std::logic_error("compare (" + what + ", " + quantity + "): expected " + to_string(s) + ", actual " +
                           to_string(actual.shape()) + (tol ? ", tolerance " + to_string(tol->shape()) : std::string()));
  std::optional<std::array<Index, 4>> worst;
  double worst_ratio = 0, worst_diff = 0, worst_tol = 0;
  bool nonfinite = false;
  for (Index b = 0; b < s.B; ++b)
    for (Index h = 0; h < s.H; ++h)
      for (Index i = 0; i < s.T; ++i)
        for (Index j = 0; j < s.D; ++j) {
          if (include && !include(b, h, i, j)) continue;
          const double e = expected(b, h, i, j), a = actual(b, h, i, j);
          if (!tol) {
            if (same_value(e, a)) continue;
            const double diff = std::isfinite(a - e) ? std::abs(a - e) : std::numeric_limits<double>::infinity();
            if (!worst || diff > worst_diff || std::isnan(a)) {
              worst = {b, h, i, j};
              worst_diff = std::isnan(a - e) ? std::numeric_limits<double>::quiet_NaN() : diff;
              if (std::isnan(a)) goto done;
            }
            continue;
          }
          if (!std::isfinite(e) && same_value(e, a)) continue;  // the same Inf or NaN: nothing to measure
          if (!std::isfinite(e) || !std::isfinite(a)) {
            worst = {b, h, i, j};
            worst_diff = std::abs(a - e);
            worst_tol = (*tol)(b, h, i, j);
            nonfinite = true;
            goto done;
          }
          // A tolerance no larger than float's smallest subnormal allows no rounding at all (every difference of
          // float32 values is a multiple of it): the law is exact at that entry, and says so.
          const double t0 = (*tol)(b, h, i, j), diff = std::abs(a - e);
          if (diff <= t0) continue;
          const double t = t0 <= kExactTolerance ? 0.0 : t0;
          const double ratio = t > 0 ? diff / t : std::numeric_limits<double>::infinity();
          if (!worst || ratio > worst_ratio) {
            worst = {b, h, i, j};
            worst_ratio = ratio;
            worst_diff = diff;
            worst_tol = t;
          }
        }
done:
  if (!worst) return std::nullopt;
  const auto [b, h, i, j] = *worst;
  Violation v;
  v.quantity = quantity;
  v.worst_index = {b, h, i, j};
  v.magnitude = worst_diff;
  v.tolerance = tol ? worst_tol : 0;
  v.expected = expected;
  v.actual = actual;
  if (tol) {
    v.tolerances = *tol;  // for the report's error map; an entry the law does not compare may differ by anything
    if (include)
      for (Index b2 = 0; b2 < s.B; ++b2)
        for (Index h2 = 0; h2 < s.H; ++h2)
          for (Index i2 = 0; i2 < s.T; ++i2)
            for (Index j2 = 0; j2 < s.D; ++j2)
              if (!include(b2, h2, i2, j2)) (*v.tolerances)(b2, h2, i2, j2) = std::numeric_limits<double>::infinity();
  }
  const std::string at = quantity + idx({b, h, i, j});
  if (!tol)
    v.message = what + ": " + at + " is " + num(actual(b, h, i, j)) + " but was " + num(expected(b, h, i, j)) +
                " (must be bit-identical)";
  else if (nonfinite)
    v.message = what + ": " + at + " is " + num(actual(b, h, i, j)) + " where " + num(expected(b, h, i, j)) +
                " is expected";
  else if (worst_tol <= 0)  // an entry where the law allows no rounding (one visible key: a weight of exactly 1)
    v.message = what + ": " + at + " is " + num(actual(b, h, i, j)) + " but should be exactly " +
                num(expected(b, h, i, j)) + " (off by " + num(worst_diff) + "; exact at this entry)";
  else
    v.message = what + ": " + at + " is " + num(actual(b, h, i, j)) + " but should be " +
                num(expected(b, h, i, j)) + " (off by " + num(worst_diff) + ", tolerance " + num(worst_tol) + ")";
  return v;
}

void replace_rows(Tensor<double>& t, const Tensor<double>& other, Index from) {
  const Shape& s = t.shape();
  for (Index b = 0; b < s.B; ++b)
    for (Index h = 0; h < s.H; ++h)
      for (Index i = std::max<Index>(from, 0); i < s.T; ++i) t.head(b, h).row(i) = other.head(b, h).row(i);
}

Tensor<double> rows_of(const Tensor<double>& t, Index begin, Index end) {
  const Shape& s = t.shape();
  Tensor<double> r({s.B, s.H, end - begin, s.D});
  for (Index b = 0; b < s.B; ++b)
    for (Index h = 0; h < s.H; ++h) r.head(b, h) = t.head(b, h).middleRows(begin, end - begin);
  return r;
}

Tensor<double> slice(const Tensor<double>& t, Index b, Index h) {
  const Shape& s = t.shape();
  Tensor<double> r({1, 1, s.T, s.D});
  r.head(0, 0) = t.head(b, h);
  return r;
}

namespace {
// The (b, h) entry of a mask broadcast or not over batch and heads, as a [1,1,T_q,T_k] mask.
DenseMask dense_entry(const DenseMask& m, Index b, Index h) {
  if (m.cells.empty()) return m;
  DenseMask one{.B = 1, .H = 1, .T_q = m.T_q, .T_k = m.T_k, .cells = {}};
  for (Index i = 0; i < m.T_q; ++i)
    for (Index j = 0; j < m.T_k; ++j) one.cells.push_back(m.visible(b, h, i, j));
  return one;
}
}  // namespace

Problem slice_problem(const Problem& p, Index b, Index h) {
  Problem one = p;
  if (p.dense_mask) one.dense_mask = dense_entry(*p.dense_mask, b, h);
  if (p.bias) {  // the (b, h) entry, broadcast or not, as a [1,1,T_q,T_k] bias
    const ScoreBias& bias = *p.bias;
    const double* at = bias.head(b, h);
    one.bias = ScoreBias{.B = 1, .H = 1, .T_q = bias.T_q, .T_k = bias.T_k,
                         .values = {at, at + bias.T_q * bias.T_k}};
  }
  if (p.rope) {  // batch entry b's positions
    const Index T_q = p.q.shape().T, T_k = p.k.shape().T;
    one.rope->q_positions.assign(p.rope->q_positions.begin() + b * T_q, p.rope->q_positions.begin() + (b + 1) * T_q);
    one.rope->k_positions.assign(p.rope->k_positions.begin() + b * T_k, p.rope->k_positions.begin() + (b + 1) * T_k);
  }
  if (p.temperature) {  // the (b, h) entry's T_q values, as a [1,1,T_q] temperature
    const double* at = p.temperature->head(b, h);
    one.temperature =
        QueryTemperature{.B = 1, .H = 1, .T_q = p.temperature->T_q, .values = {at, at + p.temperature->T_q}};
  }
  if (p.block_mask) {
    BlockMask& m = *one.block_mask;
    m.B = m.H = 1;
    m.kinds.clear();
    for (Index x = 0; x < m.q_blocks; ++x)
      for (Index y = 0; y < m.k_blocks; ++y) m.kinds.push_back(std::uint8_t(p.block_mask->kind(b, h, x, y)));
    m.partial = dense_entry(p.block_mask->partial, b, h);
  }
  one.q = slice(p.q, b, h);
  one.k = slice(p.k, b, kv_of(p, h));
  one.v = slice(p.v, b, kv_of(p, h));
  if (!p.key_lengths.empty()) one.key_lengths = {p.key_lengths[std::size_t(b)]};
  if (!p.doc_bounds.empty()) one.doc_bounds = {p.doc_bounds[std::size_t(b)]};
  if (!p.q_doc_bounds.empty()) one.q_doc_bounds = {p.q_doc_bounds[std::size_t(b)]};
  if (!p.alibi_slopes.empty()) one.alibi_slopes = {p.alibi_slopes[std::size_t(h)]};
  if (!p.sinks.empty()) one.sinks = {p.sinks[std::size_t(h)]};
  if (p.d_output) one.d_output = slice(*p.d_output, b, h);
  return one;
}

Problem perturb_future(const Problem& p, Index t, const Tensor<double>& q2, const Tensor<double>& k2,
                       const Tensor<double>& v2) {
  Problem v = p;
  replace_rows(v.q, q2, t + 1);
  replace_rows(v.k, k2, causal_last_key(p, t) + 1);
  replace_rows(v.v, v2, causal_last_key(p, t) + 1);
  return v;
}

rc::Gen<double> gen_replacement_magnitude(DType dtype) {
  return rc::gen::join(
      weighted_choice<rc::Gen<double>>({{1, gen_magnitude()}, {1, rc::gen::just(max_finite(dtype) / 4)}}));
}

double cap_replacement_magnitude(const GenConfig& cfg, const Problem& p, double m) {
  if (cfg.caps.nonfinite_safe) return m;
  // Keep every score of a row that meets a replaced key finite in the accumulation type: |s| <= D·max|q|·m·scale,
  // with the replacement's logistic tail below 12·m. float16 kernels may keep QKᵀ in the dtype, where 65504
  // is the largest score.
  const double acc_max = cfg.dtype == DType::f64   ? max_finite(DType::f64)
                         : cfg.dtype == DType::f16 ? max_finite(DType::f16)
                                                   : max_finite(DType::f32);
  const double qmax = std::max(1.0, p.q.values().cwiseAbs().maxCoeff());
  const double D = double(p.q.shape().D);
  return std::min(m, acc_max / (16 * 12 * D * qmax * std::max(scale_of(p), 1.0)));
}

rc::Gen<HiddenValues> gen_hidden_values(const GenConfig& cfg, const Problem& p) {
  return rc::gen::exec([cfg, p] {
    // Drawn unconditionally (see gen_shape): 0 finite, 1 NaN, 2 +Inf, 3 -Inf; shrinks toward finite.
    const int kind = *weighted_choice<int>({{3, 0}, {1, 1}, {1, 2}, {1, 3}});
    const double m = cap_replacement_magnitude(cfg, p, *gen_replacement_magnitude(cfg.dtype));
    HiddenValues h;
    h.k = *gen_tensor(p.k.shape(), Regime::normal, m, cfg.dtype);
    h.v = *gen_tensor(p.v.shape(), Regime::normal, m, cfg.dtype);
    h.tag = m >= 1e6 ? "hidden=extreme" : "hidden=ordinary";
    if (cfg.caps.nonfinite_safe && kind > 0) {
      const double inf = std::numeric_limits<double>::infinity();
      const double bad = kind == 1 ? std::numeric_limits<double>::quiet_NaN() : kind == 2 ? inf : -inf;
      h.k.values().setConstant(bad);
      h.v.values().setConstant(bad);
      h.tag = kind == 1 ? "hidden=NaN" : "hidden=Inf";
    }
    return h;
  });
}

std::optional<Violation> nonzero_hidden_weight(const std::string& law, const Implementation& impl, const Problem& p,
                                               const Tensor<double>& w,
                                               const std::function<bool(Index, Index, Index, Index)>& hidden,
                                               const std::vector<Index>* keys) {
  const auto key_of = [&](Index c) { return keys ? (*keys)[std::size_t(c)] : c; };
  const Tensor<double> zeros(w.shape());
  const bool nan_allowed = impl.capabilities().empty_rows != EmptyRows::zero;
  const Include sees = seen_rows(p);
  auto v = compare(law, "weights", zeros, w, nullptr, [&](Index b, Index h, Index i, Index c) {
    if (!hidden(b, h, i, key_of(c))) return false;
    return !(nan_allowed && !sees(b, h, i, c) && std::isnan(w(b, h, i, c)));
  });
  if (!v) return v;
  const auto& ix = v->worst_index;
  const Index j = key_of(ix[3]);
  v->message = law + ": weights" + idx({ix[0], ix[1], ix[2], j}) + " = " + num(w(ix[0], ix[1], ix[2], ix[3])) +
               ", but key " + std::to_string(j) + " is " + why_hidden(p, ix[0], ix[1], ix[2], j) +
               " and its weight must be exactly 0";
  if (!keys) v->weights = w;
  v->expected.reset();
  return v;
}

Verdict hidden_weights_are_zero(const std::string& law, const Implementation& impl, const Problem& p,
                                const std::function<bool(Index, Index, Index, Index)>& hidden) {
  if (samples_weights(impl, p)) {  // every query row against the sampled keys, each hidden from many rows
    const WeightSample s = sample_weights(impl, p, sampled_keys(impl, p));
    return on_sample(nonzero_hidden_weight(law, impl, p, s.w, hidden, &s.keys), s, p);
  }
  Problem q = p;
  q.want_weights = true;  // a stored case may ask for none (a replayed or hostile file): this check reads them
  const Outcome o = call(impl, q);
  if (!o.weights) return std::nullopt;  // an implementation that returns none, which such a law never draws for
  return nonzero_hidden_weight(law, impl, p, *o.weights, hidden);
}

ProblemOptions outputs_only() {
  ProblemOptions po;
  po.want_weights = false;
  return po;
}

rc::Gen<LawCase> gen_outputs_only(const GenConfig& cfg) { return gen_problem(cfg, outputs_only()); }
rc::Gen<LawCase> gen_plain(const GenConfig& cfg) { return gen_problem(cfg); }

void with_pages_moved(LawCase& c) {
  Problem v = c.problem;
  PagedPlan& plan = *v.paged;
  const int to = *weighted_choice<int>({{1, 0}, {1, 1}, {2, 2}});  // contiguous, reversed, shuffled
  plan.order = to == 0   ? PagedPlan::Order::contiguous
               : to == 1 ? PagedPlan::Order::reversed
                         : PagedPlan::Order::shuffled;
  plan.shuffle_seed = plan.order == PagedPlan::Order::shuffled
                          ? *rc::gen::noShrink(rc::gen::inRange<std::uint64_t>(0, std::uint64_t(1) << 32))
                          : 0;
  if (plan == *c.problem.paged) {  // the same order: reverse it instead
    plan.order = plan.order == PagedPlan::Order::reversed ? PagedPlan::Order::contiguous : PagedPlan::Order::reversed;
    plan.shuffle_seed = 0;
  }
  c.tags.push_back("pages=" + page_order_name(c.problem.paged->order) + "->" + page_order_name(plan.order));
  c.variant = std::move(v);
}

GenConfig within_materialised(const GenConfig& config) {
  constexpr Index kMaxT = 128;  // 4·4·128·128 = 2^18
  GenConfig cfg = config;
  cfg.max_T = std::min(cfg.max_T, kMaxT);
  cfg.max_T_tail = std::min(cfg.max_T_tail, kMaxT);
  cfg.max_B = std::min<Index>(cfg.max_B, 4);
  cfg.max_H = std::min<Index>(cfg.max_H, 4);
  cfg.long_lengths.clear();
  return cfg;
}

std::string pinned_past_materialised(const GenConfig& g, const std::string& what) {
  if (!g.shape) return "";
  const auto& s = *g.shape;  // {B, H, T_q, T_k, D}
  const double weights = double(s[0]) * double(s[1]) * double(s[2]) * double(s[3]);
  if (weights <= double(1 << 18)) return "";
  return what + " is checked up to 2^18 weights (B·H·T_q·T_k: its bound is materialised); the pinned shape has " +
         format_number(weights);
}

std::optional<Violation> check_earlier_outputs_unchanged(const char* law, const char* what_changed,
                                                          const Implementation& impl, const LawCase& c) {
  const Index t = int_param(c, law, "t", 0, c.problem.q.shape().T - 1);
  const Outcome a = call(impl, c.problem), b = call(impl, variant_of(c, law));
  auto v = compare(law, "output", a.output, b.output, nullptr, [t](Index, Index, Index i, Index) { return i <= t; });
  if (v) {
    v->message += "; only positions after " + std::to_string(t) + " were " + what_changed;
    v->weights = b.weights;
  }
  return v;
}

Problem cached_call(const Problem& p, Index begin, Index end) {
  if (p.has_cell_masks())  // positional cells: the laws that call chunks draw none (ProblemOptions::no_cell_masks)
    throw std::logic_error("cached_call: a problem with a block or dense mask cannot be cut into cached calls");
  Problem c = p;
  c.q = rows_of(p.q, begin, end);
  c.k = first_rows(p.k, end);
  c.v = first_rows(p.v, end);
  c.alignment = CausalAlignment::BottomRight;  // query i - begin sits at position (i - begin) + end - (end - begin) = i
  for (Index& len : c.key_lengths) len = std::min(len, end);
  return c;
}

std::string needs_square_shapes(const GenConfig& g) {
  if (g.shape && (*g.shape)[2] != (*g.shape)[3])
    return "draws square cases (T_q = T_k) only, but --shape pins T_q = " + std::to_string((*g.shape)[2]) +
           " and T_k = " + std::to_string((*g.shape)[3]);
  return "";
}

std::string needs_cached_calls(const GenConfig& g) {
  if (std::string why = needs_square_shapes(g); !why.empty()) return why;
  if (!g.caps.cross_lengths || !g.caps.q_shorter)
    return "needs calls with fewer queries than keys (T_q < T_k, a KV cache), which this implementation does not "
           "accept";
  if (!g.caps.supports(CausalAlignment::BottomRight))
    return "needs bottom-right causal alignment (the new queries at the end of the cached keys), which this "
           "implementation does not support";
  return "";
}

Verdict check_cached_chunks(const char* law, const Implementation& impl, const Problem& p,
                            const std::vector<Index>& starts, const std::vector<Index>& only) {
  const Index T = p.q.shape().T;
  const Outcome full = call(impl, p);
  const OracleRun of = run_oracle(p);
  Tensor<double> chunked(full.output.shape()), tol = of.tol_out;
  // A long context calls only the chunks that hold a sampled position (both ends, the middle, both sides of
  // every power of two): T calls of O(T·D) each would cost as much as materialising [T,T].
  std::vector<char> called(starts.size(), 1);
  if (!only.empty())
    for (std::size_t n = 0; n < starts.size(); ++n)
      called[n] = std::find(only.begin(), only.end(), starts[n]) != only.end();
  std::string note;  // what a long context called
  if (long_context(p)) {
    std::fill(called.begin(), called.end(), 0);
    for (const Index t : sample_keys(T, kSampledKeys))
      called[std::size_t(std::prev(std::upper_bound(starts.begin(), starts.end(), t)) - starts.begin())] = 1;
    std::string at;
    for (std::size_t n = 0; n < starts.size(); ++n)
      if (called[n]) at += (at.empty() ? "" : ",") + std::to_string(starts[n]);
    note = "long context (B*H*T_q*T_k > 2^22): " + std::to_string(std::count(called.begin(), called.end(), 1)) +
           " of " + std::to_string(starts.size()) + " chunks called, those starting at {" + at +
           "} (they hold both ends, the middle and both sides of every power of two)";
  }
  std::vector<char> row_called(std::size_t(T), 0);
  // Per chunk: whether its call's output is outside its own oracle bound somewhere it sees a key (then it, not
  // the full forward, computed wrongly there: the two cannot differ by more than the sum of both bounds
  // otherwise).
  std::vector<char> chunk_off(starts.size(), 0);
  for (std::size_t n = 0; n < starts.size(); ++n) {
    const Index begin = starts[n], end = n + 1 < starts.size() ? starts[n + 1] : T;
    if (!called[n]) continue;
    std::fill(row_called.begin() + begin, row_called.begin() + end, 1);
    const Problem one = cached_call(p, begin, end);
    const Outcome o = call(impl, one);
    const OracleRun oc = run_oracle(one);
    // Both results are within their derived bounds of their oracles, and the two oracles differ by what they
    // differ (the same rows, another call shape: usually 0).
    for (Index b = 0; b < p.q.shape().B && !chunk_off[n]; ++b)
      for (Index h = 0; h < p.q.shape().H && !chunk_off[n]; ++h)
        for (Index r = 0; r < end - begin && !chunk_off[n]; ++r) {
          if (sees_none(one, b, h, r)) continue;
          for (Index d = 0; d < p.v_dim(); ++d) {
            const double got = o.output(b, h, r, d), want = oc.out(b, h, r, d);
            if (!(std::abs(got - want) <= oc.tol_out(b, h, r, d)) && !same_value(got, want)) chunk_off[n] = 1;
          }
        }
    const Tensor<double> extra(
        oc.tol_out.shape(),
        Eigen::VectorXd(oc.tol_out.values() + (rows_of(of.out, begin, end).values() - oc.out.values()).cwiseAbs()));
    for (Index b = 0; b < p.q.shape().B; ++b)
      for (Index h = 0; h < p.q.shape().H; ++h) {
        chunked.head(b, h).middleRows(begin, end - begin) = o.output.head(b, h);
        tol.head(b, h).middleRows(begin, end - begin) += extra.head(b, h);
      }
  }
  // Rows that see no key follow the implementation's empty-row convention, checked by oracle-agreement.
  const auto sees = seen_rows(p);
  const auto seen = [&](Index b, Index h, Index i, Index j) { return row_called[std::size_t(i)] && sees(b, h, i, j); };
  auto v = compare(law, "output", full.output, chunked, &tol, seen);
  if (v) {
    const Index i = v->worst_index[2];
    const Index begin = *std::prev(std::upper_bound(starts.begin(), starts.end(), i));
    const auto next = std::upper_bound(starts.begin(), starts.end(), i);
    const Index end = next == starts.end() ? T : *next;
    // Neither result is known to be the right one: say where each came from.
    const auto [b, h, r, d] = std::array{v->worst_index[0], v->worst_index[1], i, v->worst_index[3]};
    v->message = std::string(law) + ": output" + idx({b, h, r, d}) + " is " + num(full.output(b, h, r, d)) +
                 " in the full forward but " + num(chunked(b, h, r, d)) + " when " +
                 (end - begin == 1 ? "query " + std::to_string(i) + " is called alone"
                                   : "queries " + std::to_string(begin) + ".." + std::to_string(end - 1) +
                                         " are called together") +
                 " over keys 0.." + std::to_string(end - 1) + ", bottom-right (off by " + num(v->magnitude) +
                 ", tolerance " + num(v->tolerance) + ")";
    v->weights = full.weights;
    const std::size_t n = std::size_t(std::prev(std::upper_bound(starts.begin(), starts.end(), i)) - starts.begin());
    if (chunk_off[n]) {  // the derived call computed wrongly: report it, with the case it came from
      v->call = cached_call(p, begin, end);
      v->call_what = std::string(end - begin == 1 ? "decode step: query " + std::to_string(i) + " alone"
                                                  : "prefill chunk: queries " + std::to_string(begin) + ".." +
                                                        std::to_string(end - 1)) +
                     " over keys 0.." + std::to_string(end - 1) + ", bottom-right; it is outside its own oracle bound";
      v->message += "; the " + std::string(end - begin == 1 ? "decode" : "chunk") +
                    " call is the one that is wrong (outside its own oracle bound)";
    }
  }
  return {std::move(v), std::move(note)};
}

void blame_derived_call(Violation& v, const Problem& p, const Outcome& mine, const Problem& derived,
                        const Outcome& theirs, const std::array<Index, 4>& derived_at, const std::string& what) {
  if (v.worst_index.size() != 4) return;
  const auto [b, h, i, d] = std::array{v.worst_index[0], v.worst_index[1], v.worst_index[2], v.worst_index[3]};
  const auto [db, dh, di, dd] = derived_at;
  const OracleRun own = run_oracle(p), other = run_oracle(derived);
  const auto within = [](double got, double want, double tol) { return std::abs(got - want) <= tol || same_value(got, want); };
  if (within(mine.output(b, h, i, d), own.out(b, h, i, d), own.tol_out(b, h, i, d)) &&
      !within(theirs.output(db, dh, di, dd), other.out(db, dh, di, dd), other.tol_out(db, dh, di, dd))) {
    v.call = derived;
    v.call_what = what + "; it is outside its own oracle bound";
    v.message += "; the derived call is the one that is wrong (outside its own oracle bound)";
  }
}

CausalAlignment square_alignment(const Capabilities& caps) {
  return caps.supports(kDefaultAlignment) || caps.alignments.empty() ? kDefaultAlignment : caps.alignments.front();
}

std::optional<Violation> hull_violation(const std::string& law, const Implementation& impl, const Problem& p) {
  const Outcome o = call(impl, p);
  const Shape s = p.output_shape();  // [B,H,T_q,D_v]
  const double u_a = accumulation_roundoff(p.dtype), u_s = unit_roundoff(p.dtype);
  const double n_a = smallest_normal(p.dtype == DType::f64 ? DType::f64 : DType::f32);
  Tensor<double> hi(s), tol(s);
  const Include include = seen_rows(p);
  for (Index b = 0; b < s.B; ++b)
    for (Index h = 0; h < s.H; ++h) {
      // O(T·D) whatever T: the visible runs only move right as i grows.
      const Visibility vis = p.visibility(b, h);
      const VisibleRange range = visible_value_range(p.v.head(b, kv_of(p, h)), vis);
      const Eigen::VectorXd s_max = row_abs_score_bound(p, b, h);
      const bool sink = !p.sinks.empty();
      for (Index i = 0; i < s.T; ++i) {
        const Index n_vis = vis.count(i);
        if (n_vis == 0) continue;
        const double lse = std::expm1(lse_exponent_error(p.dtype, s_max(i), n_vis + (sink ? 1 : 0)));
        for (Index d = 0; d < s.D; ++d) {
          // With a sink the weights sum to 1 - p_sink: the hull of the visible values and 0.
          const double vmin = sink ? std::min(range.min(i, d), 0.0) : range.min(i, d);
          const double vmax = sink ? std::max(range.max(i, d), 0.0) : range.max(i, d);
          const double x = o.output(b, h, i, d), v_abs = std::max(std::abs(vmin), std::abs(vmax));
          // All-zero values keep the output 0 however unresolved the weights are (no 0·inf).
          const double lse_v = v_abs > 0 ? lse * v_abs : 0.0;
          const double slack = kSafety * ((2 * gamma(n_vis, u_a) + u_a + u_s) * v_abs + lse_v +
                                          u_s * std::abs(x) + double(n_vis) * n_a * (v_abs + 2)) +
                               storage_floor(p.dtype);
          // Expected: the nearest point of [vmin, vmax]; tolerance: the slack.
          hi(b, h, i, d) = std::clamp(x, vmin, vmax);
          tol(b, h, i, d) = slack;
          if (std::isnan(x)) hi(b, h, i, d) = vmin;
        }
      }
    }
  auto v = compare(law, "output", hi, o.output, &tol, include);
  if (v) {
    const auto& ix = v->worst_index;
    const Visibility vis = p.visibility(ix[0], ix[1]);
    const VisibleRange range = visible_value_range(p.v.head(ix[0], kv_of(p, ix[1])), vis);
    const double lo = range.min(ix[2], ix[3]), hi_v = range.max(ix[2], ix[3]);
    const bool sink = !p.sinks.empty();
    v->message = law + ": output" + idx({ix[0], ix[1], ix[2], ix[3]}) + " = " +
                 num(o.output(ix[0], ix[1], ix[2], ix[3])) + " lies outside [" +
                 num(sink ? std::min(lo, 0.0) : lo) + ", " + num(sink ? std::max(hi_v, 0.0) : hi_v) +
                 "], the range of the " + std::to_string(vis.count(ix[2])) + " value rows query " + std::to_string(ix[2]) + " can see" +
                 (sink ? " and 0 (the sink takes the rest of the weight)" : "");
    v->weights = o.weights;
  }
  return v;
}


Outcome widen_by_reference_error(const Problem& p, OracleRun& r) {
  // FlashAttention's rule, merged into the derived bound by taking the larger of the two per element.
  Problem with_w = p;
  with_w.want_weights = !r.streamed;
  Outcome mine = reference_implementation()->forward(with_w);
  const double floor_out = unit_roundoff(p.dtype) * p.v.values().cwiseAbs().maxCoeff();
  r.tol_out.values() = r.tol_out.values().cwiseMax(2 * (mine.output.values() - r.out.values()).cwiseAbs() +
                                                   Eigen::VectorXd::Constant(r.out.size(), floor_out));
  return mine;
}

std::optional<Violation> agrees_with_oracle(const char* law, const Implementation& impl, const LawCase& c,
                                            const std::string& note) {
  const Problem& p = c.problem;
  Outcome o = call(impl, outputs_first(impl, p));
  OracleRun r = run_oracle(p);
  const Outcome mine = widen_by_reference_error(p, r);
  const auto seen = seen_rows(p);
  const auto said = [&](std::optional<Violation> v) {
    if (v) {
      v->message += "; " + note;
      v->weights = o.weights;
    }
    return v;
  };
  if (auto v = said(compare(law, "output", r.out, o.output, &r.tol_out, seen))) return v;
  if (p.want_lse && o.lse) {
    const Tensor<double> tl = lse_bound(p, r);
    if (auto v = said(compare(law, "lse", r.lse, *o.lse, &tl, seen))) return v;
  }
  if (c.outputs_only) return std::nullopt;
  r.tol_w.values() = r.tol_w.values().cwiseMax(2 * (mine.weights->values() - r.w.values()).cwiseAbs() +
                                               Eigen::VectorXd::Constant(r.w.size(), unit_roundoff(p.dtype)));
  o.weights = weights_of(impl, c, o);
  if (!o.weights) return std::nullopt;
  const Include hidden = hidden_keys(p);  // a hidden weight stays exactly 0
  for (Index b = 0; b < r.tol_w.shape().B; ++b)
    for (Index h = 0; h < r.tol_w.shape().H; ++h)
      for (Index i = 0; i < r.tol_w.shape().T; ++i)
        for (Index j = 0; j < r.tol_w.shape().D; ++j)
          if (hidden(b, h, i, j)) r.tol_w(b, h, i, j) = 0;
  return said(compare(law, "weights", r.w, *o.weights, &r.tol_w, seen));
}

}  // namespace attncheck::law_kit
