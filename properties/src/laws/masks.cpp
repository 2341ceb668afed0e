// Laws 39-43, masks beyond causal: packed documents, chunked local attention, a bidirectional prefix,
// a right window and no causal rule at all. The generators draw those families for every law whose reasoning
// they keep (ProblemOptions); these five are about the families themselves.
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "registry.hpp"
#include "support.hpp"

namespace attncheck::law_kit {
namespace {
namespace masks_law {

// ---- hidden-keys ----------------------------------------------------------------------------------------

// Key j of kv head g in batch entry b is hidden from query t of every query head reading g (a block or dense
// mask may differ per head: a key value is changed only where no head of its group lets t see it).
std::vector<char> hidden_from(const Problem& p, Index t) {
  const Shape& ks = p.k.shape();
  const Index H = p.q.shape().H;
  std::vector<char> out(std::size_t(ks.B * ks.H * ks.T), 1);
  for (Index b = 0; b < ks.B; ++b)
    for (Index h = 0; h < H; ++h) {
      const Visibility vis = p.visibility(b, h);
      vis.for_each_run(t, 0, ks.T, [&](Index a, Index e) {
        for (Index j = a; j < e; ++j) out[std::size_t((b * ks.H + kv_of(p, h)) * ks.T + j)] = 0;
      });
    }
  return out;
}

const char* kWhyHidden =
    "Whatever mask families a call combines (the causal rule, a prefix, padding, left and right windows, chunks, "
    "documents, block and dense masks), a key a query may not see must never reach its output: replacing every key and value hidden "
    "from query t (extreme magnitudes, and NaN or Inf for a kernel that claims select semantics) must leave the "
    "output of t, and of every row that sees only keys t sees, bit-identical. Masked terms add exact zeros and "
    "never raise the running max. A document boundary off by one, a chunk taken from the wrong index, a prefix "
    "that overrides padding or a window that is too wide lets a hidden value in. Exact: no tolerance, but +0 and "
    "-0 are equal (a row that sees no key returns 0 * v in FlashAttention's reference, whose sign follows the "
    "hidden values).";

rc::Gen<LawCase> gen_hidden(const GenConfig& cfg) {
  return rc::gen::exec([cfg] {
    LawCase c = *gen_problem(cfg, outputs_only());
    const Problem& p = c.problem;
    const Shape& ks = p.k.shape();
    // The query whose hidden keys change: shrinks toward query 0.
    const Index t = *rc::gen::inRange<Index>(0, p.q.shape().T);
    const HiddenValues hv = *gen_hidden_values(cfg, p);
    Problem v = p;
    Index changed = 0;
    const std::vector<char> hidden = hidden_from(p, t);
    for (Index b = 0; b < ks.B; ++b)
      for (Index g = 0; g < ks.H; ++g)
        for (Index j = 0; j < ks.T; ++j) {
          if (!hidden[std::size_t((b * ks.H + g) * ks.T + j)]) continue;
          ++changed;
          v.k.head(b, g).row(j) = hv.k.head(b, g).row(j);
          v.v.head(b, g).row(j) = hv.v.head(b, g).row(j);
        }
    c.variant = v;
    c.params["t"] = double(t);
    c.tags.push_back(changed > 0 ? hv.tag : "no-hidden-key");
    return c;
  });
}

std::optional<Violation> check_hidden(const Implementation& impl, const LawCase& c) {
  const char* law = "hidden-keys";
  const Problem& p = c.problem;
  const Index t = int_param(c, law, "t", 0, p.q.shape().T - 1);
  const Outcome a = call(impl, p), b = call(impl, variant_of(c, law));
  // A row is compared when every key it sees was not changed (query t's rows, and every row that sees only
  // keys t sees).
  const std::vector<char> hidden = hidden_from(p, t);
  const Shape& ks = p.k.shape();
  const Shape& qs = p.q.shape();
  // Each row's answer once, from a running count of the changed keys of its kv head: O(T_k + runs) a row, not
  // O(T_k) for every one of its D elements (at T = 16384 that was 8.6·10⁹ steps, most of the law's time).
  std::vector<Index> before(std::size_t(ks.T) + 1);
  std::vector<char> unchanged(std::size_t(qs.B * qs.H * qs.T), 1);
  for (Index bb = 0; bb < qs.B; ++bb)
    for (Index h = 0; h < qs.H; ++h) {
      const char* hid = &hidden[std::size_t((bb * ks.H + kv_of(p, h)) * ks.T)];
      for (Index j = 0; j < ks.T; ++j) before[std::size_t(j) + 1] = before[std::size_t(j)] + hid[j];
      const Visibility vis = p.visibility(bb, h);
      for (Index i = 0; i < qs.T; ++i) {
        char& ok = unchanged[std::size_t((bb * qs.H + h) * qs.T + i)];
        vis.for_each_run(i, 0, ks.T,
                         [&](Index s, Index e) { ok = ok && before[std::size_t(e)] == before[std::size_t(s)]; });
      }
    }
  auto v = compare(law, "output", a.output, b.output, nullptr, [&](Index bb, Index h, Index i, Index) {
    return unchanged[std::size_t((bb * qs.H + h) * qs.T + i)] != 0;
  });
  if (v) {
    const Index bb = v->worst_index[0], h = v->worst_index[1], i = v->worst_index[2];
    const KeyRange seen = keys_of(p, bb, h, t);
    const Index n_seen = p.visibility(bb, h).count(t);
    v->message += "; only keys hidden from query " + std::to_string(t) + " were changed (it sees " +
                  (seen.empty() ? std::string("no key") :
                   n_seen == seen.size() ? "keys " + std::to_string(seen.begin) + " .. " + std::to_string(seen.end - 1)
                                         : std::to_string(n_seen) + " keys in " + std::to_string(seen.begin) + " .. " +
                                               std::to_string(seen.end - 1)) +
                  " of batch entry " + std::to_string(bb) + ", head " + std::to_string(h) + "; row " +
                  std::to_string(i) + " sees only keys among them)";
    // Name the family that hides the first changed key, so the reader knows which rule leaked.
    for (Index j = 0; j < ks.T; ++j)
      if (hidden[std::size_t((bb * ks.H + kv_of(p, h)) * ks.T + j)]) {
        v->message += "; key " + std::to_string(j) + " is " + why_hidden(p, bb, h, t, j);
        break;
      }
    v->weights = b.weights;
  }
  return v;
}

// ---- packed-equals-separate and chunked-equals-separate ------------------------------------------------------

// A segment of batch entry b: queries [q0, q1) and keys [k0, k1) (one document's, or one chunk's).
struct Segment {
  Index q0, q1, k0, k1;
};

// Segment g of batch entry b alone: its queries, keys and values, every family moved with it (a prefix and the
// padding shortened by k0, document bounds shifted), without chunking when `drop_chunks` (the segment is one
// chunk). Windows and ALiBi are relative and stay as they are; a document alone is aligned on its own lengths,
// as the packed call aligns it.
Problem segment_alone(const Problem& p, Index b, const Segment& g, bool drop_chunks) {
  Problem one = p;
  const Shape qs = p.q.shape(), ks = p.k.shape();
  const Index nq = g.q1 - g.q0, nk = g.k1 - g.k0;
  one.q = Tensor<double>({1, qs.H, nq, qs.D});
  one.k = Tensor<double>({1, ks.H, nk, ks.D});
  one.v = Tensor<double>({1, ks.H, nk, p.v_dim()});
  for (Index h = 0; h < qs.H; ++h) one.q.head(0, h) = p.q.head(b, h).middleRows(g.q0, nq);
  for (Index j = 0; j < ks.H; ++j) {
    one.k.head(0, j) = p.k.head(b, j).middleRows(g.k0, nk);
    one.v.head(0, j) = p.v.head(b, j).middleRows(g.k0, nk);
  }
  if (!p.key_lengths.empty()) one.key_lengths = {std::clamp<Index>(p.key_lengths[std::size_t(b)] - g.k0, 0, nk)};
  one.prefix_length = std::clamp<Index>(p.prefix_length - g.k0, 0, nk);
  if (!p.doc_bounds.empty()) {
    std::vector<Index> bounds;
    for (const Index x : p.doc_bounds[std::size_t(b)])
      if (x > g.k0 && x < g.k1) bounds.push_back(x - g.k0);  // bounds outside the segment cut nothing inside it
    one.doc_bounds = {bounds};
  }
  one.q_doc_bounds.clear();  // one document (a chunk is drawn without query bounds): aligned on its own lengths
  if (drop_chunks) one.chunk_size = 0;
  one.want_weights = false;
  return one;
}

// The segments of batch entry b: each document's queries and keys (a document without queries is left out), or
// each chunk's positions. Of many chunks, the first four and the last four: a chunk boundary bug shows at the
// first boundaries or at the ragged last chunk, and a call per chunk of 1 over 64 positions would be 64 calls per
// batch entry.
std::vector<Segment> segments(const Problem& p, Index b, bool chunks) {
  const Index T_q = p.q.shape().T, T_k = p.k.shape().T;
  std::vector<Segment> out;
  if (chunks) {
    const Index n = (T_q + p.chunk_size - 1) / p.chunk_size;
    for (Index k = 0; k < n; ++k)
      if (k < 4 || k >= n - 4) {
        const Index e = std::min(T_q, (k + 1) * p.chunk_size);
        out.push_back({k * p.chunk_size, e, k * p.chunk_size, e});
      }
    return out;
  }
  // A document's queries are contiguous (their documents never decrease), its keys run between its bounds.
  const Visibility vis = p.visibility(b);
  const std::vector<Index>& bounds = p.doc_bounds[std::size_t(b)];
  for (Index i = 0; i < T_q;) {
    const Index d = vis.query_document(i);
    Index e = i;
    while (e < T_q && vis.query_document(e) == d) ++e;
    const Index k0 = d == 0 ? 0 : std::min(bounds[std::size_t(d - 1)], T_k);
    const Index k1 = d < Index(bounds.size()) ? std::min(bounds[std::size_t(d)], T_k) : T_k;
    if (k1 > k0) out.push_back({i, e, k0, k1});  // without keys its rows see none, and are not compared
    i = e;
  }
  return out;
}

std::optional<Violation> check_segments(const char* law, bool chunks, const Implementation& impl, const LawCase& c) {
  const Problem& p = c.problem;
  if (chunks ? p.chunk_size <= 0 : p.doc_bounds.empty()) return std::nullopt;  // a stored case without them
  const Outcome whole = call(impl, p);
  const Shape& s = p.q.shape();
  Tensor<double> alone = whole.output;
  struct Call {
    Index b;
    Segment g;
    Outcome o;
  };
  std::vector<Call> calls;
  const Capabilities& caps = impl.capabilities();
  for (Index b = 0; b < s.B; ++b)
    for (const Segment& g : segments(p, b, chunks)) {
      // A document of other query and key lengths alone is a cross-length call: where the implementation does
      // not take one (it then sees its rows only packed), its rows keep the packed call's values.
      if (g.q1 - g.q0 != g.k1 - g.k0 && !caps.supports_lengths(g.q1 - g.q0, g.k1 - g.k0)) continue;
      Outcome o = call(impl, segment_alone(p, b, g, chunks));
      for (Index h = 0; h < s.H; ++h) alone.head(b, h).middleRows(g.q0, g.q1 - g.q0) = o.output.head(0, h);
      calls.push_back({b, g, std::move(o)});
    }
  // Both calls are within the derived oracle bound tol of the float64 oracle (the visible keys and their values
  // are the same in both), so they agree within 2 tol.
  Tensor<double> tol = run_oracle(p).tol_out;
  tol.values() *= 2;
  auto v = compare(law, "output", alone, whole.output, &tol,
                   seen_rows(p));
  if (v) {
    const Index b = v->worst_index[0], i = v->worst_index[2];
    for (const Call& k : calls)
      if (k.b == b && k.g.q0 <= i && i < k.g.q1) {
        const Segment& g = k.g;
        const std::string range = g.q0 == g.k0 && g.q1 == g.k1
                                      ? "[" + std::to_string(g.q0) + ", " + std::to_string(g.q1) + ")"
                                      : "(queries [" + std::to_string(g.q0) + ", " + std::to_string(g.q1) +
                                            "), keys [" + std::to_string(g.k0) + ", " + std::to_string(g.k1) + "))";
        const std::string what = std::string(chunks ? "chunk " : "document ") + range + " of batch entry " +
                                 std::to_string(b) + " alone";
        v->message += " (the " + std::string(chunks ? "chunked" : "packed") + " call vs. " + what + ")";
        blame_derived_call(*v, p, whole, segment_alone(p, b, g, chunks), k.o,
                           {0, v->worst_index[1], i - g.q0, v->worst_index[3]}, what);
        break;
      }
    v->weights = whole.weights;
  }
  return v;
}

std::string needs_square(const GenConfig& g, bool has, const char* what) {
  if (!has) return std::string("the implementation does not declare ") + what;
  return needs_square_shapes(g);
}

const char* kWhyPacked =
    "Packing sequences into one row with document boundaries (FlashAttention's varlen cu_seqlens_q and "
    "cu_seqlens_k, xformers' BlockDiagonalCausalMask, splash attention's segment ids) must not change any "
    "sequence's result: each document's rows equal that document called alone, its queries and keys moved to "
    "start at 0 and aligned on its own lengths (windows and ALiBi are relative; a prefix and the padding move with "
    "it). A document's queries are the rows its query bounds give it, or, without those, the rows whose aligned "
    "position lies in it (then the per-document alignment is the call's, shifted). Both calls are within the "
    "derived oracle bound tol (per row, over the visible keys, which are the same) of the float64 oracle, so they "
    "agree within 2 tol. A boundary off by one, a query's document read from the wrong index, a document aligned "
    "on the whole call's lengths instead of its own, or an empty document that shifts the others breaks it. Cases "
    "without chunks (a chunk boundary would move with the document); a document of other query and key lengths is "
    "called alone only where the implementation takes such a call.";

rc::Gen<LawCase> gen_packed(const GenConfig& cfg) {
  ProblemOptions po = outputs_only().no_cell_masks();  // each document is called alone, at other positions
  po.allow.remove({Feature::chunked_local});
  po.require.add(Feature::documents);
  return gen_problem(cfg, po);
}

const char* kWhyChunked =
    "Chunked local attention (Llama 4) lets a query see only the keys of its own chunk of chunk_size positions, so "
    "the call equals one call per chunk, each chunk's queries, keys and values alone without chunking. Both are "
    "within the derived oracle bound tol of the float64 oracle, so they agree within 2 tol. A chunk index taken "
    "from the query's row instead of its position, a chunk implemented as a sliding window, or a boundary off by "
    "one breaks it. Square cases (the chunks of queries and keys coincide); of more than eight chunks, the first "
    "four and the last four are called.";

rc::Gen<LawCase> gen_chunked(const GenConfig& cfg) {
  ProblemOptions po = outputs_only().no_cell_masks();  // each chunk is called alone, at other positions
  po.allow_cross_lengths = false;
  po.allow.remove({Feature::query_documents});  // a chunk's queries and keys must be the same positions
  po.require.add(Feature::chunked_local);
  return gen_problem(cfg, po);
}

// ---- neutral-masks --------------------------------------------------------------------------------------

const char* kWhyNeutral =
    "Some encodings of a mask change nothing, and a kernel must give the same result whichever it is sent: a "
    "chunk longer than every position, a single document (no bound, or bounds only at 0 or past T_k), a prefix of "
    "length 1 (key 0 is visible to every causal query anyway) or any prefix without the causal rule, a right window "
    "of 0 under the causal rule, no causal rule with a right window of 0 (exactly causal: cuDNN's window_right = 0), "
    "and a left or right window past T. Each pair of calls is within the derived oracle bound tol of the same "
    "float64 oracle, so they agree within 2 tol. A kernel that takes another path for an encoding and gets it "
    "wrong breaks it. Each encoding applies where the case allows it (no row at a negative position for those "
    "that would let it see a key).";

// The neutral encodings a case can take, and the problem with encoding `n` of them added.
enum class Neutral { long_chunk, one_document, prefix_one, prefix_bidirectional, right_zero, bidirectional_right_zero,
                     long_left, long_right };

const char* neutral_name(Neutral n) {
  switch (n) {
    case Neutral::long_chunk: return "a chunk longer than every position";
    case Neutral::one_document: return "a single document";
    case Neutral::prefix_one: return "a prefix of length 1";
    case Neutral::prefix_bidirectional: return "a prefix without the causal rule";
    case Neutral::right_zero: return "a right window of 0 under the causal rule";
    case Neutral::bidirectional_right_zero: return "no causal rule and a right window of 0 instead of the causal rule";
    case Neutral::long_left: return "a left window past T";
    case Neutral::long_right: return "a right window past T";
  }
  return "?";
}

std::vector<Neutral> neutral_encodings(const Problem& p, const Capabilities& caps) {
  const Index T_q = p.q.shape().T;
  // No query sits before key 0 (a document aligned on its own lengths may put one there in any call).
  bool no_negative = true;
  for (Index b = 0; b < p.q.shape().B && no_negative; ++b) {
    const Visibility vis = p.visibility(b);
    for (Index i = 0; i < T_q && no_negative; ++i) no_negative = vis.position(i) >= 0;
  }
  std::vector<Neutral> out;
  if (caps.declares(Feature::chunked_local) && p.chunk_size == 0 && no_negative) out.push_back(Neutral::long_chunk);
  if (caps.declares(Feature::documents) && p.doc_bounds.empty()) out.push_back(Neutral::one_document);
  if (caps.declares(Feature::prefix) && p.causal && p.prefix_length <= 1 && no_negative)
    out.push_back(Neutral::prefix_one);
  if (caps.declares(Feature::prefix) && !p.causal && p.prefix_length == 0) out.push_back(Neutral::prefix_bidirectional);
  // A right window of 0 cuts the prefix's keys after a query: neutral only when the prefix adds no key, that is
  // none, or 1 with no query before key 0 (a query at position -1 sees key 0 only through a prefix of 1).
  const bool prefix_adds_nothing = p.prefix_length == 0 || (p.prefix_length == 1 && no_negative);
  if (caps.declares(Feature::right_window) && p.causal && prefix_adds_nothing && !p.window_right)
    out.push_back(Neutral::right_zero);
  if (caps.features.contains({Feature::right_window, Feature::bidirectional}) && p.causal && prefix_adds_nothing &&
      !p.window_right)
    out.push_back(Neutral::bidirectional_right_zero);
  if (caps.declares(Feature::window) && !p.window) out.push_back(Neutral::long_left);
  if (caps.declares(Feature::right_window) && !p.window_right) out.push_back(Neutral::long_right);
  return out;
}

Problem with_neutral(const Problem& p, Neutral n, Index pick) {
  Problem v = p;
  const Index T_q = p.q.shape().T, T_k = p.k.shape().T, T = std::max(T_q, T_k);
  switch (n) {
    case Neutral::long_chunk: v.chunk_size = T + 1 + pick % 64; break;
    case Neutral::one_document: {
      // No bound, a bound at 0 (an empty first document), or bounds past the last key, for every batch entry.
      const std::vector<std::vector<Index>> kinds{{}, {0}, {T_k}, {0, T_k, T_k + 3}};
      v.doc_bounds.assign(std::size_t(p.q.shape().B), kinds[std::size_t(pick % 4)]);
      break;
    }
    case Neutral::prefix_one: v.prefix_length = 1; break;
    case Neutral::prefix_bidirectional: v.prefix_length = 1 + pick % T; break;
    case Neutral::right_zero: v.window_right = 0; break;
    case Neutral::bidirectional_right_zero:
      v.causal = false;
      v.window_right = 0;
      break;
    case Neutral::long_left: v.window = T + pick % 64; break;
    case Neutral::long_right: v.window_right = T + pick % 64; break;
  }
  return v;
}

rc::Gen<LawCase> gen_neutral_masks(const GenConfig& cfg) {
  return rc::gen::exec([cfg] {
    LawCase c = *gen_problem(cfg, outputs_only());
    // Which encoding (shrinking toward the first that applies) and a number for its value.
    c.params["encoding"] = double(*rc::gen::inRange<Index>(0, 8));
    c.params["pick"] = double(*rc::gen::inRange<Index>(0, 1 << 20));
    return c;
  });
}

std::optional<Violation> check_neutral_masks(const Implementation& impl, const LawCase& c) {
  const char* law = "neutral-masks";
  const Problem& p = c.problem;
  const std::vector<Neutral> encodings = neutral_encodings(p, impl.capabilities());
  if (encodings.empty()) return std::nullopt;
  const Index k = int_param(c, law, "encoding", 0, 1 << 20), pick = int_param(c, law, "pick", 0, Index{1} << 40);
  // The encoding drawn, or the next that applies (in the enum's order, cyclically): shrinking the case away from
  // a family that made another encoding inapplicable does not change the encoding under test.
  Neutral n = encodings.front();
  for (int step = 0; step < 8; ++step) {
    const auto want = Neutral((k + step) % 8);
    if (std::find(encodings.begin(), encodings.end(), want) != encodings.end()) {
      n = want;
      break;
    }
  }
  const Problem v = with_neutral(p, n, pick);
  const Outcome a = call(impl, p), b = call(impl, v);
  Tensor<double> tol = run_oracle(p).tol_out;
  tol.values() *= 2;
  auto viol = compare(law, "output", a.output, b.output, &tol, [](Index, Index, Index, Index) { return true; });
  if (viol) {
    const std::string what = "the same case with " + std::string(neutral_name(n));
    viol->message += " (the case as drawn vs. " + what + ", which hides no key it did not hide)";
    viol->weights = b.weights;
    const auto& w = viol->worst_index;
    blame_derived_call(*viol, p, a, v, b, {w[0], w[1], w[2], w[3]}, what);
  }
  return viol;
}

std::string needs_mask_families(const GenConfig& g) {
  const Capabilities& c = g.caps;
  if (!c.features.intersects(
          {Feature::documents, Feature::chunked_local, Feature::prefix, Feature::right_window, Feature::window}))
    return "the implementation declares none of documents, chunks, a prefix, a right window or a window";
  return "";
}

// ---- bidirectional-permutation --------------------------------------------------------------------------

const char* kWhyPermutation =
    "Without the causal rule (an encoder) and without positional families (windows, chunks, documents, ALiBi), "
    "attention is a function of the set of (key, value) pairs: permuting keys and values together, within the "
    "real keys and within the padding, leaves every output unchanged up to the order of the sums. Both calls "
    "are within the derived oracle bound tol of the same float64 oracle, so they agree within 2 tol. A "
    "bidirectional kernel that still masks part of the diagonal tile, or keys read by a position, breaks it.";

rc::Gen<LawCase> gen_permutation(const GenConfig& cfg) {
  return rc::gen::exec([cfg] {
    ProblemOptions po = outputs_only().no_cell_masks();  // the keys move: positional cells would move with them
    po.require.add(Feature::bidirectional);
    po.allow.remove({Feature::window, Feature::chunked_local, Feature::documents, Feature::right_window,
                     Feature::prefix, Feature::alibi});
    LawCase c = *gen_problem(cfg, po);
    // The permutation of each batch entry's real keys (and of its padding): a rotation by r and a reversal.
    c.params["rotate"] = double(*rc::gen::inRange<Index>(1, 1 << 20));
    c.params["reverse"] = double(*rc::gen::inRange<Index>(0, 2));
    return c;
  });
}

std::optional<Violation> check_permutation(const Implementation& impl, const LawCase& c) {
  const char* law = "bidirectional-permutation";
  const Problem& p = c.problem;
  if (p.causal || p.window || p.window_right || p.chunk_size || !p.doc_bounds.empty() || !p.alibi_slopes.empty())
    return std::nullopt;  // a stored case with a positional family
  const Index r = int_param(c, law, "rotate", 0, Index{1} << 40), rev = int_param(c, law, "reverse", 0, 1);
  const Shape& ks = p.k.shape();
  Problem v = p;
  const std::vector<Index> lengths = p.sequence_lengths();
  for (Index b = 0; b < ks.B; ++b) {
    const Index len = lengths[std::size_t(b)];
    const auto to = [&](Index j) {  // where key j goes: within [0, len) or within [len, T_k)
      const Index lo = j < len ? 0 : len, n = j < len ? len : ks.T - len, x = j - lo;
      const Index y = (x + r) % n;
      return lo + (rev ? n - 1 - y : y);
    };
    for (Index j = 0; j < ks.T; ++j)
      for (Index g = 0; g < ks.H; ++g) {
        v.k.head(b, g).row(to(j)) = p.k.head(b, g).row(j);
        v.v.head(b, g).row(to(j)) = p.v.head(b, g).row(j);
      }
  }
  const Outcome a = call(impl, p), b = call(impl, v);
  Tensor<double> tol = run_oracle(p).tol_out;
  tol.values() *= 2;
  auto viol = compare(law, "output", a.output, b.output, &tol,
                      seen_rows(p));
  if (viol) {
    const std::string what = "keys and values permuted together: each batch entry's real keys rotated by " +
                             std::to_string(r) + (rev ? " and reversed" : "");
    viol->message += " (" + what + ", without the causal rule)";
    viol->weights = b.weights;
    const auto& w = viol->worst_index;
    blame_derived_call(*viol, p, a, v, b, {w[0], w[1], w[2], w[3]}, what);
  }
  return viol;
}

}  // namespace masks_law
}  // namespace

Law hidden_keys() {
  using namespace masks_law;
  return {"hidden-keys", "changing keys hidden from a query (by any mask family) leaves its output bit-identical",
          kWhyHidden,
          LawDoc{"39",
                 "replacing every key and value hidden from query t by any mask family (NaN and Inf for select-mask kernels) leaves t's output, and every row that sees only keys t sees, unchanged",
                 "exact (bit-identical)"},
          always_applies, gen_hidden, check_hidden, 0};
}

Law packed_equals_separate() {
  using namespace masks_law;
  return {"packed-equals-separate",
          "each packed document equals that document called alone",
          kWhyPacked,
          LawDoc{"40",
                 "each packed document's rows equal that document called alone (positions from 0, prefix and padding "
                 "moved with it)",
                 "twice the derived bound"},
          [](const GenConfig& g) {
            return g.caps.declares(Feature::documents)
                       ? std::string()
                       : std::string("the implementation does not declare packed documents");
          },
          gen_packed,
          [](const Implementation& impl, const LawCase& c) {
            return check_segments("packed-equals-separate", false, impl, c);
          },
          0};
}

Law chunked_equals_separate() {
  using namespace masks_law;
  return {"chunked-equals-separate",
          "chunked local attention equals one call per chunk",
          kWhyChunked,
          LawDoc{"41", "chunked local attention equals one call per chunk without chunking", "twice the derived bound"},
          [](const GenConfig& g) {
            return needs_square(g, g.caps.declares(Feature::chunked_local), "chunked local attention");
          },
          gen_chunked,
          [](const Implementation& impl, const LawCase& c) {
            return check_segments("chunked-equals-separate", true, impl, c);
          },
          0};
}

Law neutral_masks() {
  using namespace masks_law;
  return {"neutral-masks", "encodings of a mask that hide nothing more give the same result", kWhyNeutral,
          LawDoc{"42",
                 "encodings that hide nothing more (a chunk past T, one document, prefix 1, right window 0 under causal, no causal rule with right window 0, windows past T) give the same result",
                 "twice the derived bound"},
          needs_mask_families, gen_neutral_masks, check_neutral_masks, 0};
}

Law bidirectional_permutation() {
  using namespace masks_law;
  return {"bidirectional-permutation",
          "without the causal rule, permuting keys and values together leaves outputs unchanged",
          kWhyPermutation,
          LawDoc{"43",
                 "without the causal rule (and without positional families), permuting keys and values together leaves "
                 "outputs unchanged",
                 "twice the derived bound"},
          [](const GenConfig& g) {
            return g.caps.declares(Feature::bidirectional)
                       ? std::string()
                       : std::string("the implementation does not declare causal = false");
          },
          gen_permutation,
          check_permutation,
          0};
}

}  // namespace attncheck::law_kit
