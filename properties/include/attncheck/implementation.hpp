// The one interface every attention implementation is checked through: the reference core, the mutant zoo,
// C plug-ins and subprocesses all become an `Implementation`, so there is one harness, not several.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "attncheck/attention.hpp"
#include "attncheck/backward.hpp"
#include "attncheck/feature_set.hpp"
#include "attncheck/format.hpp"
#include "attncheck/paged.hpp"

namespace attncheck {

/// How a problem's K and V are laid out in pages (Feature::paged): the plan its block table is
/// derived from (Problem::paged_kv), deterministically for the problem's B and sequence lengths, so a law that
/// slices a problem or changes its lengths keeps its paging. The problem's meaning is still its dense k and v.
struct PagedPlan {
  Index page_size = 16;
  PageLayout layout = PageLayout::token_major;
  /// The physical order of the pages: sequence by sequence in pages 0, 1, 2, ...; from the last page down; or
  /// shuffled (a Fisher-Yates shuffle driven by splitmix64(shuffle_seed), the same on every platform).
  enum class Order { contiguous, reversed, shuffled };
  Order order = Order::contiguous;
  std::uint64_t shuffle_seed = 0;
  Index spare_pages = 0;    ///< pool pages no sequence references (placed by the order, among the others)
  Index spare_columns = 0;  ///< table columns past the longest sequence's pages
  /// false: a table entry past a sequence's last page is -1; true: such entries cycle through -1, num_pages,
  /// INT32_MAX, INT32_MIN and a live page of another sequence (a kernel that reads one reads garbage or crashes).
  bool junk_entries = false;
  PageFill fill = PageFill::zero;  ///< what every slot no live key occupies holds
  /// Prefix caching: sequences b >= 1 reference sequence 0's first shared_pages pages (as far as both have that
  /// many full pages) instead of private copies. Their dense keys and values there must equal sequence 0's.
  Index shared_pages = 0;
  /// An explicit layout instead of a derived one (a paged call decoded from the exec: protocol, whose table came
  /// as it is): when block_table is not empty, Problem::paged_kv() returns it, B·max_pages entries over num_pages
  /// pages, with page_size, layout and fill above; order, spare pages and columns, junk entries and shared pages
  /// are then ignored. Empty (every plan the generators draw): the table is derived.
  std::vector<std::int32_t> block_table{};
  Index num_pages = 0, max_pages = 0;
  friend bool operator==(const PagedPlan&, const PagedPlan&) = default;
};

/// "contiguous", "reversed", "shuffled".
std::string page_order_name(PagedPlan::Order o);

/// How q, k and v lie in memory when a call crosses the C ABI: the values are the problem's, only the
/// strides and the buffers differ (attncheck/layouts.hpp lays them out). Outputs stay contiguous.
enum class InputLayout : std::uint8_t {
  contiguous,     ///< [B,H,T,D] row-major, each tensor its own buffer
  token_major,    ///< [B,T,H,D] in memory (FlashAttention's and Hugging Face's layout), read through the strides
  padded,         ///< gaps between rows, heads and batch entries (row stride D + 3, ...), filled with NaN
  kv_broadcast,   ///< K and V stride 0 over their heads: one head in memory (every kv head of the problem equal)
  kv_interleaved, ///< K and V in one buffer [B,T,H_kv,2,D] (a fused KV projection): V a view at offset D
  v_is_k,         ///< V the very view K is (the problem's v equal to k: MLA reads V from K's buffer)
};
/// "contiguous", "token-major", "padded", "kv-broadcast", "kv-interleaved", "v-is-k".
std::string input_layout_name(InputLayout l);

/// One call: inputs at `dtype`, held as double but exactly representable in `dtype` (so converting to the
/// native type and back is exact).
struct Problem : AttentionOptions {
  DType dtype = DType::f32;
  /// q [B,H,T_q,D]; k [B,H_kv,T_k,D] with H_kv dividing H (grouped-query attention when H_kv < H); v
  /// [B,H_kv,T_k,D_v], D_v = D unless the implementation declares Feature::v_head_dim (MLA: 576 and 512).
  Tensor<double> q{Shape{}}, k{Shape{}}, v{Shape{}};
  /// The scale, alignment, key lengths, windows, score modifiers, causal rule and masks are the base's
  /// (AttentionOptions); a problem is the core's call plus its tensors and how they cross to an implementation.
  /// K and V passed as a page pool and a block table (ABI 3); empty: dense. Forward calls only.
  std::optional<PagedPlan> paged{};
  /// How q, k and v lie in memory in the call (Feature::strided; never with paged K and V). kv_broadcast
  /// needs every kv head equal, v_is_k needs v equal to k (the layout-invariance law draws them so).
  InputLayout layout = InputLayout::contiguous;
  bool want_weights = true;  ///< the law reads the weights; ignored by implementations that cannot return them
  bool want_lse = false;     ///< the law reads the LSE; ignored by implementations that cannot return it
  /// The gradient of the loss with respect to the output, dO [B,H,T_q,D_v]: set for backward calls only.
  std::optional<Tensor<double>> d_output{};

  Index kv_heads() const { return k.shape().H; }
  /// V's head dimension D_v, the output's (D, Q's and K's, unless the implementation declares v_head_dim).
  Index v_dim() const { return v.shape().D; }
  /// The output's shape [B,H,T_q,D_v] (and dO's).
  Shape output_shape() const { return {q.shape().B, q.shape().H, q.shape().T, v.shape().D}; }
  /// Whether any score modifier is set (softcap, ALiBi, sinks).
  bool modified() const { return softcap || !alibi_slopes.empty() || !sinks.empty(); }
  /// Whether any mask family beyond causal, padding and the left window is set (documents, chunks, a prefix, a
  /// right window).
  bool masked_beyond_causal() const {
    return !doc_bounds.empty() || chunk_size != 0 || prefix_length != 0 || window_right.has_value() ||
           block_mask.has_value() || dense_mask.has_value();
  }
  /// Whether a block or dense mask is set (then visibility may differ per head and have gaps in a row).
  bool has_cell_masks() const { return block_mask.has_value() || dense_mask.has_value(); }
  /// The core's options for this problem: the call's scale, alignment, masks and modifiers are the base it
  /// holds (AttentionOptions documents each; every mask family is kept by a law that slices the problem: bounds
  /// and lengths past T_k cut nothing; a law that slices or moves keys draws no block or dense mask).
  const AttentionOptions& options() const { return *this; }
  /// Which keys the queries of batch entry b, query head h, see (only a block or dense mask depends on h).
  Visibility visibility(Index b, Index h = 0) const;
  /// Each sequence's length: key_lengths, or T_k for every batch entry.
  std::vector<Index> sequence_lengths() const;
  /// The explicit layout of `paged` (which must be set) for this problem's B and sequence lengths.
  PagedKV paged_kv() const;
};

/// The one check of a call's fields, whichever reader made it (the exec wire, a JSON report, the C loader): the
/// core's check_call (shapes, scale, key lengths, windows, documents, masks, modifiers), then dO, when set, the
/// output's shape. Throws ShapeError or ValueError naming `who`; each reader says it in its own error.
void check_call(const char* who, const Problem& p);

/// A paged problem's K and V pools at scalar S (k and v being the problem's tensors cast to S): scatter_pages of
/// each under p.paged_kv().
template <class S> struct PagedPools {
  PagedKV layout;
  Tensor<S> k{Shape{}}, v{Shape{}};
};
template <class S> PagedPools<S> paged_pools(const Problem& p, const Tensor<S>& k, const Tensor<S>& v) {
  PagedPools<S> pools{p.paged_kv()};
  const std::vector<Index> lengths = p.sequence_lengths();
  pools.k = scatter_pages(k, lengths, pools.layout);
  pools.v = scatter_pages(v, lengths, pools.layout);
  return pools;
}

/// What a backward call returned, widened to double: dQ [B,H,T_q,D], dK and dV [B,H_kv,T_k,D] (the dK and dV
/// of a shared kv head sum over its group).
using Gradients = AttentionGradients<double>;

/// What a row that sees no key returns (a query whose keys are all padding, outside its window, or, with
/// bottom-right alignment and T_q > T_k, in its future): libraries disagree.
enum class EmptyRows {
  zero,  ///< output 0 and weights 0 (FlashAttention; attncheck's core)
  nan,   ///< NaN (PyTorch's math path: softmax of an all -inf row)
  /// Unspecified output: anything at all, because the caller discards those rows (Hugging Face's fully padded
  /// rows get uniform weights). Laws skip them: every call's outcome has them set to the zero convention before
  /// a law reads it (canonical_outcome), the gradient laws give them dO = 0 and ignore their dQ, and
  /// empty-row-convention does not apply.
  any,
};

/// What one call returned, widened to double (exact for every supported dtype).
struct Outcome {
  Tensor<double> output{Shape{}};         ///< [B,H,T_q,D_v]
  std::optional<Tensor<double>> weights;  ///< [B,H,T_q,T_k], when the implementation returns them
  /// [B,H,T_q,1]: each row's log-sum-exp (natural log, over the modified scores and the sink; -inf for a row that
  /// sees no key and has no sink), when the problem asks for it and the implementation returns it (Feature::lse).
  std::optional<Tensor<double>> lse;
  int calls = 1;  ///< calls to the implementation this outcome took (more when its weights were probed)
};

/// What an implementation accepts; the generators only produce cases inside it.
struct Capabilities {
  std::vector<DType> dtypes{DType::f32, DType::f64, DType::f16, DType::bf16};
  bool returns_weights = true;
  /// The weights are recovered by probing (one more call per D keys), so laws check outputs first and ask for
  /// weights only when the outputs pass.
  bool weights_probed = false;
  bool cross_lengths = true;  ///< accepts T_q != T_k
  /// Which T_q != T_k regimes, when cross_lengths: T_q < T_k (decode steps and prefill chunks against a cache;
  /// Hugging Face's cache positions are never negative, so it accepts only these) and T_q > T_k.
  bool q_shorter = true, q_longer = true;
  std::vector<CausalAlignment> alignments{CausalAlignment::TopLeft, CausalAlignment::BottomRight};
  bool custom_scale = true;
  Index max_T = Index{1} << 20;
  /// The head dimensions accepted: D a multiple of head_dim_multiple, at most max_head_dim (0: no limit), and
  /// one of head_dims when that is not empty. The generators draw only such D (within the run's --max-D).
  Index head_dim_multiple = 1;
  Index max_head_dim = 0;
  std::vector<Index> head_dims{};
  /// Claims boolean-mask (select) semantics: NaN or Inf in a masked score, key or value never reaches an
  /// output. Most additive-mask kernels compute 0·Inf = NaN there and do not claim it.
  bool nonfinite_safe = false;
  /// Calls may run concurrently from several threads and each call's result depends only on its problem (no
  /// state kept between calls): `--jobs` then checks several laws at once. Off by default: a plug-in, a
  /// subprocess or a stateful kernel is called one law after the other, in the serial order.
  bool reentrant = false;
  /// The convention it declares for rows that see no key; empty: either is accepted, and reports say which
  /// one it follows.
  std::optional<EmptyRows> empty_rows;
  /// The features it declares, one row of kFeatures (attncheck/features.hpp) each: what it does beyond plain
  /// causal attention, beside the limits above and below. None by default.
  FeatureSet features{};
  bool declares(Feature f) const { return features.has(f); }
  /// With `paged`: the page sizes it accepts and its layouts (ATTNCHECK_PAGED_* bits: 1 token-major, 2
  /// head-major).
  std::vector<Index> page_sizes{};
  std::uint32_t page_layouts = 0;
  /// What an ABI-3 plug-in or a version-3 exec: client declares (attncheck/plugin.h): its ATTNCHECK_CAP3_* bits
  /// (also set in `features`), carried so that reports say what was declared.
  std::uint32_t abi3_flags = 0;
  /// Head dimension pairs (D_k, D_v) with D_v != D_k in the declared list (with v_head_dim). A list given
  /// (head_dims or these) is the whole of what is accepted: D alone means D_v = D.
  std::vector<std::pair<Index, Index>> head_dim_pairs{};

  bool supports(DType t) const;
  bool supports(CausalAlignment a) const;
  /// Whether it accepts a paged call with this page size and layout.
  bool supports_paging(Index page_size, PageLayout layout) const;
  /// Whether it accepts head dimension D for Q, K and V (head_dim_multiple, max_head_dim, the list).
  bool supports_head_dim(Index D) const;
  /// Whether it accepts D_k for Q and K with D_v for V: D_v = D_k as supports_head_dim; otherwise only with
  /// v_head_dim, and then the pair is in head_dim_pairs when a list is given, else both within the multiple and
  /// the maximum.
  bool supports_head_dims(Index D_k, Index D_v) const;
  /// The D_v other than D_k it accepts with D_k, up to max_D, ascending (empty without v_head_dim).
  std::vector<Index> v_head_dims_with(Index D_k, Index max_D) const;
  /// Whether a list of head dimensions is declared (head_dims or head_dim_pairs).
  bool lists_head_dims() const { return !head_dims.empty() || !head_dim_pairs.empty(); }
  /// Whether it accepts T_q queries over T_k keys (cross_lengths and its regimes; max_T).
  bool supports_lengths(Index T_q, Index T_k) const;
  /// The head dimensions in [1, max_D] it accepts, ascending (empty when none).
  std::vector<Index> head_dims_up_to(Index max_D) const;
  /// The smallest head dimension it accepts (0 when none).
  Index smallest_head_dim() const;
};

/// The implementation under test misbehaved: an error status, a crash, a hang, output of the wrong size,
/// a broken protocol, a NaN or Inf from finite inputs. A law that meets one is falsified (with the case that
/// caused it), not an internal error.
class ImplementationError : public std::runtime_error {
 public:
  enum class Kind { error_status, crash, timeout, wrong_size, protocol, nonfinite, unavailable };
  /// The message may quote what the implementation wrote (its messages, its stderr): kept as printable_text.
  ImplementationError(Kind kind, const std::string& message)
      : std::runtime_error(printable_text(message)), kind_(kind) {}
  Kind kind() const { return kind_; }

 private:
  Kind kind_;
};

/// What `p` needs that `caps` does not declare, one phrase each ("grouped-query attention (1 kv head for 2 query
/// heads)", "key padding", "a window", "float16", ...); empty when the implementation accepts the call. The
/// generators never draw such a call; a stored case (--replay, the corpus) may hold one.
std::vector<std::string> needs_outside(const Problem& p, const Capabilities& caps);
/// needs_outside's phrases with the feature each stands for (attncheck/features.hpp; empty for a limit: a dtype,
/// lengths, head dimensions, an alignment, the scale, max_T, a page size or layout).
enum class Feature : std::uint8_t;
struct Need {
  std::optional<Feature> feature;
  std::string words;
};
/// `forward_call`: the needs of `p` sent as a forward call, whose dO (p.d_output, if any) is not sent: no
/// backward pass is needed.
std::vector<Need> call_needs(const Problem& p, const Capabilities& caps, bool forward_call = false);
/// What `caps` declares, in the words needs_outside uses: "float32, float64; T_q != T_k; top-left; ...".
std::string describe_capabilities(const Capabilities& caps);

/// The name of an ImplementationError kind ("error status", "crash", ...).
std::string_view kind_name(ImplementationError::Kind k);

/// An attention implementation under test.
class Implementation {
 public:
  virtual ~Implementation() = default;
  /// The name as `--impl` takes it: "reference", "mutant:mask-zero", "plugin:./libfoo.so", "exec:...".
  virtual const std::string& name() const = 0;
  /// One line for `attncheck list`.
  virtual const std::string& description() const = 0;
  virtual const Capabilities& capabilities() const = 0;
  /// Runs attention on `p`. Throws ImplementationError when the implementation misbehaves.
  virtual Outcome forward(const Problem& p) const = 0;
  /// The backward pass: dQ, dK, dV of attention on `p` for the upstream gradient `*p.d_output`. Only called
  /// when capabilities().backward; the default throws ImplementationError(error_status).
  virtual Gradients backward(const Problem& p) const;
  /// Empty while calls can be made; otherwise why none can any more (an out-of-process implementation that
  /// could not be started several times in a row), and every call fails at once with that message. The
  /// runner then reports the laws left without calling, and stops shrinking.
  virtual std::string unavailable() const { return {}; }
};

using ImplementationPtr = std::shared_ptr<const Implementation>;
using ForwardFn = std::function<Outcome(const Problem&)>;
using BackwardFn = std::function<Gradients(const Problem&)>;

/// Registers any callable as an implementation (in-process C++); with a `backward`, caps.backward is set.
ImplementationPtr make_implementation(std::string name, std::string description, Capabilities caps, ForwardFn fn,
                                      BackwardFn backward = {});

/// Converts the problem's tensors to the native scalar of its dtype (exactly), calls
/// `f(q, k, v, problem, weights_or_null) -> Tensor<S> output` and widens the results back. `f` is generic
/// over S (a template lambda), so one body serves all four dtypes. An `f` that also takes a `Tensor<double>*`
/// for the LSE gets one when the problem asks for it (want_lse), and its LSE is returned.
template <class F> Outcome run_typed(const Problem& p, F&& f) {
  return visit_dtype(p.dtype, [&](auto tag) {
    using S = decltype(tag);
    const Tensor<S> q = p.q.template cast<S>(), k = p.k.template cast<S>(), v = p.v.template cast<S>();
    Tensor<S> w(Shape{1, 1, 1, 1});
    Outcome o;
    if constexpr (std::is_invocable_v<F, const Tensor<S>&, const Tensor<S>&, const Tensor<S>&, const Problem&, Tensor<S>*,
                                      Tensor<double>*>) {
      Tensor<double> lse(Shape{1, 1, 1, 1});
      o.output = f(q, k, v, p, p.want_weights ? &w : nullptr, p.want_lse ? &lse : nullptr).template cast<double>();
      if (p.want_lse) o.lse = std::move(lse);
    } else {
      o.output = f(q, k, v, p, p.want_weights ? &w : nullptr).template cast<double>();
    }
    if (p.want_weights) o.weights = w.template cast<double>();
    return o;
  });
}

/// The backward counterpart of run_typed: converts q, k, v and *p.d_output to the native scalar of the problem's
/// dtype (exactly), calls `f(q, k, v, d_output, problem) -> AttentionGradients<S>` and widens the gradients.
/// Throws std::invalid_argument when the problem has no d_output (a backward call needs one).
template <class F> Gradients run_backward_typed(const Problem& p, F&& f) {
  if (!p.d_output) throw std::invalid_argument("backward: the problem has no d_output");
  return visit_dtype(p.dtype, [&](auto tag) {
    using S = decltype(tag);
    const AttentionGradients<S> g = f(p.q.template cast<S>(), p.k.template cast<S>(), p.v.template cast<S>(),
                                      p.d_output->template cast<S>(), p);
    return Gradients{g.dq.template cast<double>(), g.dk.template cast<double>(), g.dv.template cast<double>(), g.dsinks,
                     g.dbias ? std::optional(g.dbias->template cast<double>()) : std::nullopt};
  });
}

/// `p` as a weight probe calls it: the same problem, laid out so that values written into V reach the kernel.
/// Every layout keeps V's own memory but V-is-K, whose V is K's memory (a one-hot V written there never reaches the
/// kernel, which reads K's values for V): that one goes through the contiguous layout, which reads K through the
/// same strides. A quantised V gets scale 1 (per tensor, or ggml blocks with d = 1 and m = 0), so that every value
/// written into it is a code.
Problem probe_layout(Problem p);

/// The weights `impl` applies on `p`, recovered from outputs alone: with V's rows set to the identity
/// columns e_0..e_{D-1} of a block of D keys, output[i,c] = weights[i, block+c] exactly (one product by 1,
/// the rest by exact zeros), so ceil(T_k/D) calls recover [B,H,T_q,T_k], each through probe_layout(p). Throws
/// what `impl` throws.
Tensor<double> recover_weights(const Implementation& impl, const Problem& p);

/// Wraps an implementation that returns no weights so that it does (by recover_weights, only when a call
/// asks for them; Capabilities::weights_probed): every weight law then applies to it.
ImplementationPtr with_recovered_weights(ImplementationPtr impl);

/// The reference core (attncheck::attention with a BoolMask, and attention_backward) as an implementation
/// named "reference"; it claims every capability, nonfinite_safe and backward included.
ImplementationPtr reference_implementation();

/// Checks that an outcome has the shapes the problem implies; throws ImplementationError(wrong_size)
/// naming what was expected and what came.
void check_outcome_shape(const Problem& p, const Outcome& o, const std::string& impl_name);
/// The same for gradients: dQ like q, dK and dV like k.
void check_gradients_shape(const Problem& p, const Gradients& g, const std::string& impl_name,
                           const Capabilities& caps);

/// For an implementation that declares EmptyRows::any: `o` with every row that sees no key set to the zero
/// convention (output 0, weights 0), so that no law reads what those rows hold; otherwise `o` unchanged.
Outcome canonical_outcome(const Problem& p, const Capabilities& caps, Outcome o);

/// The masks beyond causal a problem sets, in words ("no causal rule; prefix 2; right window 0; chunks of 2;
/// document bounds {1} {}"); empty when it sets none.
std::string mask_families_line(const Problem& p);

/// "zero", "nan" or "any".
std::string_view empty_rows_name(EmptyRows e);

}  // namespace attncheck
