// What the laws share: calling an implementation, the float64 oracle with its derived tolerance, the
// element-wise comparison that turns a difference into a Violation, and the problem surgery relational laws
// do (perturbing the future, taking a prefix, slicing one head). Each law lives in its own file beside this.
#pragma once

#include <array>
#include <functional>
#include <cstdint>
#include <optional>
#include <string>

#include "attncheck/backward.hpp"
#include "attncheck/format.hpp"
#include "attncheck/generators.hpp"
#include "attncheck/law.hpp"
#include "attncheck/tolerance.hpp"

namespace attncheck::law_kit {

/// Multiplies first-order bounds (see attention/src/tolerance.cpp).
inline constexpr double kSafety = 2.0;

/// The scale the problem asks for (1/√D unless overridden).
double scale_of(const Problem& p);
/// The span of the keys query i of batch entry b, query head h, sees (Visibility::keys): exactly the keys it
/// sees unless a block or dense mask hides some inside it (visible() tells each key; count_of how many).
KeyRange keys_of(const Problem& p, Index b, Index h, Index i);
bool visible(const Problem& p, Index b, Index h, Index i, Index j);
/// Whether query i of (b, h) sees no key.
inline bool sees_none(const Problem& p, Index b, Index h, Index i) { return keys_of(p, b, h, i).empty(); }
/// The last key query i may see under the causal rule alone (padding and windows only hide more keys), so
/// keys after it are in i's future whatever else holds.
Index causal_last_key(const Problem& p, Index i);
/// Why key j is hidden from query i of batch entry b, head h: "in the future of query i", "padding (...)", or
/// "outside query i's window (...)".
std::string why_hidden(const Problem& p, Index b, Index h, Index i, Index j);
/// Per query row of head (b, h), an upper bound on the largest |score| it meets after the modifiers, over the
/// keys it sees and its sink: Cauchy-Schwarz on the raw score (a softcap only shrinks it), plus the largest ALiBi
/// bias |slope|·|j - p| over its visible run, and at least |sink| (for the LSE rounding of tolerance.cpp step 2b).
Eigen::VectorXd row_abs_score_bound(const Problem& p, Index b, Index h);
/// The kv head query head h reads.
inline Index kv_of(const Problem& p, Index h) { return kv_head(h, p.q.shape().H, p.kv_heads()); }

/// "[1,2,3]".
std::string idx(std::initializer_list<Index> v);
/// A number as messages print it (9 significant digits).
inline std::string num(double x) { return format_number(x, 9); }
/// What every exact law compares: two values widened from the same dtype are the same number. +0 and -0 are equal
/// (0 times a negative value is -0 in IEEE arithmetic: a row whose weights are all 0 returns -0 from one correct
/// kernel and +0 from another, and no law here is about a zero's sign), any NaN equals any NaN, and otherwise the
/// bits must agree (for doubles, == is then bitwise: the same value has one encoding).
bool same_value(double a, double b);

/// Whether p is a long context (see kMaterialisedWeights, generators.hpp).
bool long_context(const Problem& p);

/// Calls the implementation and insists on weights when the law needs them and the implementation says it
/// returns them. A long context is called without weights (want_weights cleared).
Outcome call(const Implementation& impl, const Problem& p);

/// Weights at sampled key columns, recovered from outputs alone: with V's column c one-hot at key keys[c]
/// (every other value 0), output[i,c] = weight[i, keys[c]] exactly, so one call gives D key columns for every
/// query row. Works for any implementation, weights or not, at any T.
struct WeightSample {
  std::vector<Index> keys;     ///< the sampled keys
  Tensor<double> w{Shape{}};   ///< [B,H,T_q,keys]: every query's weight on each sampled key
  int calls = 0;               ///< implementation calls it took
};
/// The keys a long-context law samples: both ends, the middle, and both sides of every power of two from 16
/// (where tiled kernels change tile), at most `max_keys`, the most telling first.
std::vector<Index> sample_keys(Index T_k, std::size_t max_keys);
/// How many keys the long-context weight laws sample (both ends, the middle, 16..2^k ± 1: 36 at T = 16384),
/// and in at most how many probing calls (each a whole forward): at D = 1, 8 keys.
inline constexpr std::size_t kSampledKeys = 48, kProbeCalls = 8;
/// The keys a long-context law samples for p: sample_keys within kSampledKeys and kProbeCalls calls.
std::vector<Index> sampled_keys(const Problem& p);
/// Whether a weight law reads the weights at sampled keys (sample_weights) instead of in full: for a long
/// context, and for an implementation whose weights are probed (Capabilities::weights_probed), where the full
/// weights cost a call per D keys (64 calls at T_k = 64, D = 1) but a sample of 2·D keys only kProbedCalls.
bool samples_weights(const Implementation& impl, const Problem& p);
/// The probing calls a weight law of an ordinary (not long) case makes on an implementation whose weights are
/// probed: 2, so 2·D sampled keys, among them the last key and key 1 (each in the future of other rows).
inline constexpr std::size_t kProbedCalls = 2;
/// The keys a law samples for p when samples_weights(impl, p): sampled_keys(p) for a long context, else
/// sample_keys within kProbedCalls calls.
std::vector<Index> sampled_keys(const Implementation& impl, const Problem& p);
/// Probes the weights of p at `keys` (ceil(keys / D) calls).
WeightSample sample_weights(const Implementation& impl, const Problem& p, const std::vector<Index>& keys);
/// "weights sampled at keys 0, 1, ... (n of T_k) for all T_q query rows", for reports.
std::string describe_sample(const WeightSample& s, const Problem& p);
/// A violation found on a WeightSample, re-indexed to the real key ([b,h,i,keys[c]]), its sampled tensors
/// dropped (they are [.., keys], not [.., T_k]) and the sample described in its message; the verdict's note
/// describes the sample (run_law puts it in the result's note).
Verdict on_sample(std::optional<Violation> v, const WeightSample& s, const Problem& p);
/// The case's second problem, which `law` compares against the first. A stored case (a corpus entry, a
/// --replay file) may lack it: std::invalid_argument naming the law then, never a read of an empty optional.
const Problem& variant_of(const LawCase& c, const char* law);
/// The largest seed parameter a law draws (below 2^53, so a double holds it exactly), and the largest extent
/// (B, H, D) a run may ask for, as the CLI's --max-B/H/D allow.
constexpr Index kMaxSeed = Index{1} << 52, kMaxExtent = Index{1} << 16;
/// The case's parameter `key` (a position, a head, a seed) as an integer in [lo, hi]. A stored case may hold
/// anything there (a hand-edited file, 1e300, NaN, -1): std::invalid_argument naming the law, the parameter,
/// what came and what was expected, never an out-of-range index or a float-to-integer conversion that
/// overflows. `fallback` names an older spelling of the key, read when `key` is absent.
Index int_param(const LawCase& c, const char* law, const char* key, Index lo, Index hi, const char* fallback = nullptr);
/// t [B,H,T,D] with its batch entries moved by rb and its heads by rh (cyclically): slice (b, h) to (b + rb, h + rh).
Tensor<double> rotated_slices(const Tensor<double>& t, Index rb, Index rh);

/// Which entries a comparison looks at: include(b, h, i, j).
using Include = std::function<bool(Index, Index, Index, Index)>;
/// The entries of an output [B,H,T_q,·] whose query row sees at least one key (a row that sees none follows the
/// implementation's empty-row convention, empty-row-convention's business), offset by row0 when the compared
/// tensor starts at query row0: each row's keys are found once, not once for each entry compare asks about.
Include seen_rows(const Problem& p, Index row0 = 0);
/// The entries (b, h, i, j) of the weights [B,H,T_q,T_k] whose key j is hidden from query i (!visible): each row's
/// visible run found once for the entries of that row that compare asks about in order, not once an entry.
Include hidden_keys(const Problem& p);
/// The problem for a law's first call: p without its request for weights when they are costly (probed, see
/// Capabilities::weights_probed), so the outputs are checked in one call and weights asked for only if needed.
Problem outputs_first(const Implementation& impl, const Problem& p);
/// The weights of a call on c.problem that returned `o`: o's own, or (costly weights) those of a second call
/// asking for them; none while the runner shrinks a failure on the outputs (LawCase::outputs_only).
std::optional<Tensor<double>> weights_of(const Implementation& impl, const LawCase& c, const Outcome& o);

/// not_applicable for laws that read the weights.
std::string needs_weights(const GenConfig& g);
/// not_applicable for laws that always apply.
inline std::string always_applies(const GenConfig&) { return ""; }
/// For laws whose cases are square (their generators set allow_cross_lengths = false): why not, when a pinned
/// --shape has T_q != T_k (the law's reasoning, position 0 sees key 0 alone or a prefix is a square call,
/// would not hold), else "".
std::string needs_square_shapes(const GenConfig& g);

/// not_applicable for the gradient laws: they need Implementation::backward.
std::string needs_backward(const GenConfig& g);
/// Calls the backward pass on p (which carries d_output) and checks the gradients' shapes.
Gradients call_backward(const Implementation& impl, const Problem& p);
/// Cases for the gradient laws that read no weights: gen_gradient_case with outputs_only(), through
/// zero_empty_row_d_output.
rc::Gen<LawCase> gen_gradients(const GenConfig& cfg);
rc::Gen<LawCase> gen_gradients_with(const GenConfig& cfg, const ProblemOptions& po);  // the same, under these options
/// For an implementation that may follow the nan empty-row convention (declared, or none declared): dO set to
/// 0 on every query row that sees no key, so that the NaN such a row's output holds never enters the loss
/// sum(dO * O), and a correct backward's gradients are finite everywhere except, at most, those rows' dQ.
LawCase zero_empty_row_d_output(const GenConfig& cfg, LawCase c);
/// The gradients with every all-NaN dQ row of a query that sees no key set to 0 (what the oracle says), when
/// the implementation may follow the nan convention: the gradient of a NaN output is that convention's, and
/// every other NaN (in dK, dV, or a row that sees keys) is still the laws' to flag.
Gradients accept_nan_empty_rows(const Implementation& impl, const Problem& p, Gradients g);
/// The float64 oracle's gradients and their derived tolerances (attention/src/backward.cpp) for p's dO; for a
/// long context streamed (streamed_gradient_check: the same bound, O(T·D) memory), every element still derived.
/// With `only`, the rows it names alone (GradientRows: every other row of the oracle and its bound is NaN).
GradientCheck run_gradient_oracle(const Problem& p, const GradientRows* only = nullptr);
/// A long context's sample of rows: `blocks` blocks of `rows` consecutive rows of [0, T) (the first, the last and
/// evenly between), every row when they cover T; in order.
std::vector<Index> sample_row_blocks(Index T, Index rows = 64, Index blocks = 16);
/// compare() on dQ, dK and dV in turn (quantities "dq", "dk", "dv"); `tol` null means exact. The first
/// gradient that breaks the law is the violation. include(b, h, i, c) sees kv heads for dK and dV; `key_include`,
/// when given, replaces it for dK and dV (whose rows are keys).
std::optional<Violation> compare_gradients(const std::string& what, const Gradients& expected, const Gradients& actual,
                                           const Gradients* tol, const Include& include = {},
                                           const Include& key_include = {});

/// The case's output, LSE (where asked for and returned) and weights (unless outputs only) against the float64 oracle:
/// within the derived bound widened by FlashAttention's rule for the weights, a hidden weight exactly 0. A violation
/// ends with "; " + `note`.
std::optional<Violation> agrees_with_oracle(const char* law, const Implementation& impl, const LawCase& c,
                                            const std::string& note);

/// For a law whose derived call q computes what the case p computes another way: both calls' outputs (and LSEs, where
/// p asks for them and both return them) agree within both calls' derived bounds plus what their float64 oracles
/// differ by. A violation says "; <why> (<what> vs. the case as drawn)" and names q as the call, `what` its words.
std::optional<Violation> calls_agree(const char* law, const Implementation& impl, const Problem& p, const Problem& q,
                                     const std::string& what, const std::string& why);

/// The float64 oracle on the problem's (already rounded) inputs, with the derived tolerance per element.
/// For a long context the oracle is streamed: w and tol_w stay empty, and weights come from weight() and
/// weight_tolerance() at the entries a law samples.
struct OracleRun {
  Tensor<double> out{Shape{}}, w{Shape{}}, tol_out{Shape{}}, tol_w{Shape{}};
  /// [B,H,T_q,1]: each row's log-sum-exp (-inf: no key and no sink) and its allowed error (tolerance.cpp step 6;
  /// 0 where the LSE must be exactly -inf).
  Tensor<double> lse{Shape{}}, tol_lse{Shape{}};
  bool streamed = false;
  RowStats stats;                  ///< streamed only: each row's m, l, max|s|, max scale·Σ|q·k|
  Tensor<double> rho_w{Shape{}};   ///< streamed only: [B,H,T_q,1] each row's relative weight error
  /// The oracle weight (b,h,i,j) and its allowed error, materialised or streamed.
  double weight(const Problem& p, Index b, Index h, Index i, Index j) const;
  double weight_tol(const Problem& p, Index b, Index h, Index i, Index j) const;
};
OracleRun run_oracle(const Problem& p);
/// The oracle's LSE bound for p (r = run_oracle(p)), widened by FlashAttention's rule as oracle-agreement does:
/// twice the reference's own error at the dtype on the same inputs, plus u_a·max(1, |lse|); 0 where the LSE is
/// exactly -inf.
Tensor<double> lse_bound(const Problem& p, const OracleRun& r);

/// Compares actual with expected element by element: first any non-finite value where the expected one is
/// finite (NaN and Inf come before error metrics), then the largest |actual - expected| / tol. `tol` null
/// means exact (same_value: bit-identical, a zero's sign aside). Only entries for which include(b,h,i,j) holds are compared. The violation carries
/// expected, actual and (with a tolerance) the tolerances in full, +Inf where an entry is not compared.
std::optional<Violation> compare(const std::string& what, const std::string& quantity, const Tensor<double>& expected,
                                 const Tensor<double>& actual, const Tensor<double>* tol, const Include& include);

/// For a law that compares the case's call with a derived one (a slice, the repeated-kv or unpadded call) and
/// found them apart at the case's entry `at` = (b,h,i,d), which the derived call holds at `derived_at`: when the
/// derived result is outside its own derived oracle bound there and the case's result is within its own, the
/// derived call is the one that computed wrongly, and `v` names it (Violation::call, `what`) so that reports show
/// that call with the case it came from. Otherwise `v` is left as it is.
void blame_derived_call(Violation& v, const Problem& p, const Outcome& mine, const Problem& derived,
                        const Outcome& theirs, const std::array<Index, 4>& derived_at, const std::string& what);

/// Rows [from, T) of every head of t replaced by the same rows of `other`.
void replace_rows(Tensor<double>& t, const Tensor<double>& other, Index from);
/// Rows [begin, end) of every head.
Tensor<double> rows_of(const Tensor<double>& t, Index begin, Index end);
/// Rows [0, n) of every head.
inline Tensor<double> first_rows(const Tensor<double>& t, Index n) { return rows_of(t, 0, n); }
/// Head (b, h) alone, as a [1,1,T,D] tensor.
Tensor<double> slice(const Tensor<double>& t, Index b, Index h);
/// Query head h of batch entry b alone, with its kv head and its key length: a one-head problem.
Problem slice_problem(const Problem& p, Index b, Index h);

/// A copy of p whose queries after t, and keys and values after the last key query t can see, come from
/// q2, k2, v2: "the future of t".
Problem perturb_future(const Problem& p, Index t, const Tensor<double>& q2, const Tensor<double>& k2,
                       const Tensor<double>& v2);
/// A replacement magnitude: ordinary, or a quarter of the dtype's largest finite value.
rc::Gen<double> gen_replacement_magnitude(DType dtype);

/// `m` capped, for a kernel that does not claim select semantics, so that no score a replaced row enters can
/// overflow the accumulation type: such a kernel may add its -inf mask to a score that overflowed to +inf
/// (NaN), which is strict-causality-nonfinite's business, not a perturbation law's.
double cap_replacement_magnitude(const GenConfig& cfg, const Problem& p, double m);

/// Keys and values to put where a correct kernel never looks (padded keys, keys older than the window):
/// ordinary or extreme finite values (capped as above), and, for a kernel that claims select semantics,
/// NaN, +Inf or -Inf too. Shrinks toward finite values.
struct HiddenValues {
  Tensor<double> k{Shape{}}, v{Shape{}};  ///< k's shape
  std::string tag;                         ///< "hidden=NaN", "hidden=Inf", "hidden=extreme", "hidden=ordinary"
};
rc::Gen<HiddenValues> gen_hidden_values(const GenConfig& cfg, const Problem& p);

/// The first weight on a key for which hidden(b, h, i, j) holds that is not exactly 0, as a violation of `law`
/// naming why the key is hidden. In a row that sees no key a NaN weight is the nan convention, allowed unless
/// the implementation declares zero. With `keys`, w holds sampled columns (a WeightSample's): column c is
/// key (*keys)[c]; the violation's index stays the column, for on_sample.
std::optional<Violation> nonzero_hidden_weight(const std::string& law, const Implementation& impl, const Problem& p,
                                               const Tensor<double>& w,
                                               const std::function<bool(Index, Index, Index, Index)>& hidden,
                                               const std::vector<Index>* keys = nullptr);
/// Calls impl on p and checks that every weight on a key for which hidden(b, h, i, j) holds is exactly 0
/// (nonzero_hidden_weight); for a long context, at the sampled keys of every query row (sample_weights).
Verdict hidden_weights_are_zero(const std::string& law, const Implementation& impl, const Problem& p,
                                const std::function<bool(Index, Index, Index, Index)>& hidden);

/// Problem options for the laws that read only outputs.
ProblemOptions outputs_only();
/// cfg with B and H at most 4, T at most 128 and no long contexts: every case within the 2^18 weights (B·H·T_q·T_k)
/// that a feature whose bound is materialised only (dropout, a quantised cache) is drawn at.
GenConfig within_materialised(const GenConfig& cfg);
/// Why a pinned shape past those 2^18 weights cannot be checked ("<what> is checked up to 2^18 weights ..."), or
/// "" when none is pinned or it is within them.
std::string pinned_past_materialised(const GenConfig& g, const std::string& what);
rc::Gen<LawCase> gen_outputs_only(const GenConfig& cfg);
rc::Gen<LawCase> gen_plain(const GenConfig& cfg);

/// A paged case (c.problem.paged set) with its variant the same pages in another physical order (contiguous, reversed,
/// or shuffled; never the case's own) and a tag naming both: page-permutation's and index-list-pages' cases. Drawn
/// inside rc::gen::exec.
void with_pages_moved(LawCase& c);

/// The shared body of causal-perturbation and strict-causality-nonfinite: the variant changed only the
/// future of position t ("params.t"), so every output at positions <= t must be bit-identical.
std::optional<Violation> check_earlier_outputs_unchanged(const char* law, const char* what_changed,
                                                          const Implementation& impl, const LawCase& c);

/// Queries [begin, end) of a square problem as an inference engine calls them against its KV cache: alone,
/// over keys 0..end-1, bottom-right aligned (so query i keeps its position i), key lengths cut to end.
Problem cached_call(const Problem& p, Index begin, Index end);
/// not_applicable for the laws that make such calls: they need T_q < T_k and bottom-right alignment.
std::string needs_cached_calls(const GenConfig& g);
/// The shared body of decode-consistency and chunked-prefill: the square problem's queries, cut into the
/// contiguous chunks that start at `starts` (ascending, starts[0] == 0), each called by cached_call, must
/// reproduce the rows of the full forward within both results' derived oracle bounds plus the oracle's own
/// difference between the two. With `only` (a subset of `starts`), only the chunks starting there are called
/// and their rows compared.
Verdict check_cached_chunks(const char* law, const Implementation& impl, const Problem& p,
                            const std::vector<Index>& starts, const std::vector<Index>& only = {});

/// FlashAttention's rule for an implementation other than the reference: widens r.tol_out to at least twice the
/// reference's own output error on p plus u_s·max|v| (a valid kernel summing in another order can be off by about
/// as much as the plain one in the other direction). Returns the reference's outcome (with weights unless
/// streamed).
Outcome widen_by_reference_error(const Problem& p, OracleRun& r);

/// The body of convex-hull: calls impl on p and checks that every output of a row that sees a key lies within
/// the range of the visible value rows (and 0, with a sink), within convex-hull's derived slack; `law` names it.
std::optional<Violation> hull_violation(const std::string& law, const Implementation& impl, const Problem& p);

/// With T_q == T_k both alignments give the same mask: the one to ask in that the implementation accepts.
CausalAlignment square_alignment(const Capabilities& caps);

}  // namespace attncheck::law_kit
