// In-process implementations: the callable wrapper, the reference core, weights recovered by one-hot probes, and
// the outcome shape check.
#include "attncheck/implementation.hpp"

#include "attncheck/features.hpp"
#include "mix64.hpp"

#include <algorithm>
#include <limits>
#include <optional>
#include <string_view>

namespace attncheck {

bool Capabilities::supports(DType t) const { return std::find(dtypes.begin(), dtypes.end(), t) != dtypes.end(); }
bool Capabilities::supports(CausalAlignment a) const {
  return std::find(alignments.begin(), alignments.end(), a) != alignments.end();
}

namespace {
const char* alignment_words(CausalAlignment a) {
  return a == CausalAlignment::TopLeft ? "top-left alignment" : "bottom-right alignment";
}
}  // namespace

bool Capabilities::supports_paging(Index page_size, PageLayout layout) const {
  const std::uint32_t bit = layout == PageLayout::token_major ? 1u : 2u;
  return declares(Feature::paged) && (page_layouts & bit) &&
         std::find(page_sizes.begin(), page_sizes.end(), page_size) != page_sizes.end();
}

bool Capabilities::supports_head_dim(Index D) const {
  if (D < 1 || (max_head_dim > 0 && D > max_head_dim) || (head_dim_multiple > 1 && D % head_dim_multiple != 0))
    return false;
  return !lists_head_dims() || std::find(head_dims.begin(), head_dims.end(), D) != head_dims.end();
}

bool Capabilities::supports_head_dims(Index D_k, Index D_v) const {
  if (D_v == D_k) return supports_head_dim(D_k);
  if (!declares(Feature::v_head_dim)) return false;
  if (lists_head_dims())
    return std::find(head_dim_pairs.begin(), head_dim_pairs.end(), std::pair{D_k, D_v}) != head_dim_pairs.end();
  const auto fits = [&](Index D) {
    return D >= 1 && (max_head_dim <= 0 || D <= max_head_dim) && (head_dim_multiple <= 1 || D % head_dim_multiple == 0);
  };
  return fits(D_k) && fits(D_v);
}

std::vector<Index> Capabilities::v_head_dims_with(Index D_k, Index max_D) const {
  std::vector<Index> out;
  if (!declares(Feature::v_head_dim)) return out;
  if (lists_head_dims()) {
    for (const auto& [k, v] : head_dim_pairs)
      if (k == D_k && v != D_k && v <= max_D) out.push_back(v);
  } else {
    const Index step = std::max<Index>(head_dim_multiple, 1);
    for (Index d = step; d <= max_D && (max_head_dim <= 0 || d <= max_head_dim); d += step)
      if (d != D_k) out.push_back(d);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

bool Capabilities::supports_lengths(Index T_q, Index T_k) const {
  if (max_T > 0 && std::max(T_q, T_k) > max_T) return false;
  if (T_q == T_k) return true;
  return cross_lengths && (T_q < T_k ? q_shorter : q_longer);
}

std::vector<Index> Capabilities::head_dims_up_to(Index max_D) const {
  std::vector<Index> out;
  if (lists_head_dims()) {  // D_k of the pairs too: such a D is drawn with its D_v
    for (const Index d : head_dims)
      if (d <= max_D && supports_head_dim(d)) out.push_back(d);
    if (declares(Feature::v_head_dim))
      for (const auto& [k, v] : head_dim_pairs)
        if (k <= max_D && v <= max_D) out.push_back(k);
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
  }
  const Index step = std::max<Index>(head_dim_multiple, 1);
  for (Index d = step; d <= max_D && (max_head_dim <= 0 || d <= max_head_dim); d += step) out.push_back(d);
  return out;
}

Index Capabilities::smallest_head_dim() const {
  if (lists_head_dims()) {
    Index best = 0;
    for (const Index d : head_dims)
      if (supports_head_dim(d) && (best == 0 || d < best)) best = d;
    if (declares(Feature::v_head_dim))
      for (const auto& [k, v] : head_dim_pairs)
        if (best == 0 || k < best) best = k;
    return best;
  }
  const Index d = std::max<Index>(head_dim_multiple, 1);
  return max_head_dim > 0 && d > max_head_dim ? 0 : d;
}

Outcome canonical_outcome(const Problem& p, const Capabilities& caps, Outcome o) {
  if (caps.empty_rows != EmptyRows::any) return o;
  const Shape& s = o.output.shape();
  for (Index b = 0; b < s.B && b < p.q.shape().B; ++b) {
    for (Index h = 0; h < s.H; ++h) {
      const Visibility vis = p.visibility(b, h);
      for (Index i = 0; i < s.T; ++i) {
        if (!vis.keys(i).empty()) continue;
        o.output.head(b, h).row(i).setZero();
        if (o.weights) o.weights->head(b, h).row(i).setZero();
        if (o.lse && o.lse->shape() == Shape{s.B, s.H, s.T, 1})  // the LSE of such a row: the sink alone, or -inf
          (*o.lse)(b, h, i, 0) = p.sinks.empty() ? -std::numeric_limits<double>::infinity() : p.sinks[std::size_t(h)];
      }
    }
  }
  return o;
}

std::vector<Feature> undeclared_features(const Problem& p, const Capabilities& caps) {
  std::vector<Feature> out;
  for (const FeatureRow& f : kFeatures)
    if (f.used && f.used(p) && !caps.declares(f.id)) out.push_back(f.id);
  return out;
}

std::vector<Need> call_needs(const Problem& p, const Capabilities& caps, bool forward_call) {
  std::vector<Need> needs;
  const auto limit = [&](std::string words) { needs.push_back({std::nullopt, std::move(words)}); };
  const Shape& q = p.q.shape();
  const Index T_k = p.k.shape().T;
  // The limits first, then each feature of the table the call uses and caps does not declare.
  if (!caps.supports(p.dtype)) limit(std::string(dtype_name(p.dtype)));
  if (q.T != T_k && !caps.cross_lengths)
    limit("T_q != T_k (T_q = " + std::to_string(q.T) + ", T_k = " + std::to_string(T_k) + ")");
  else if (q.T < T_k && !caps.q_shorter)
    limit("T_q < T_k (T_q = " + std::to_string(q.T) + ", T_k = " + std::to_string(T_k) + ")");
  else if (q.T > T_k && !caps.q_longer)
    limit("T_q > T_k (T_q = " + std::to_string(q.T) + ", T_k = " + std::to_string(T_k) + ")");
  // A D_v of its own without v_head_dim is the feature's row below; with it, the pair must be accepted.
  if ((p.v_dim() == q.D || caps.declares(Feature::v_head_dim)) && !caps.supports_head_dims(q.D, p.v_dim()))
    limit(p.v_dim() == q.D ? "head dimension D = " + std::to_string(q.D)
                                     : "head dimensions D = " + std::to_string(q.D) + ", D_v = " + std::to_string(p.v_dim()));
  if (!caps.supports(p.alignment)) limit(alignment_words(p.alignment));
  if (p.scale && !caps.custom_scale) limit("an explicit scale");
  if (caps.max_T > 0 && std::max(q.T, T_k) > caps.max_T)
    limit("T = " + std::to_string(std::max(q.T, T_k)) + " (above its max_T " + std::to_string(caps.max_T) +
                    ")");
  for (const Feature f : undeclared_features(p, caps))
    if (!(forward_call && f == Feature::backward)) needs.push_back({f, feature(f).needs(p)});
  if (p.paged) {
    if (caps.declares(Feature::paged) && !caps.supports_paging(p.paged->page_size, p.paged->layout))
      limit("pages of " + std::to_string(p.paged->page_size) + " (" + page_layout_name(p.paged->layout) + ")");
    if (p.d_output && !forward_call) limit("a paged backward call (attncheck sends none)");
  }
  return needs;
}

std::vector<std::string> needs_outside(const Problem& p, const Capabilities& caps) {
  std::vector<std::string> words;
  for (Need& n : call_needs(p, caps)) words.push_back(std::move(n.words));
  return words;
}

DeclaredBy declared_by(std::string_view impl_name) {
  if (impl_name.starts_with("plugin:")) return DeclaredBy::c_plugin;
  if (impl_name.starts_with("exec:")) return DeclaredBy::exec_client;
  return DeclaredBy::cpp;
}

namespace {

// One on/off declaration's names: C++'s (a Feature, or a Capabilities member for a limit that is on or off), the C
// ABI's macro, serve()'s keyword.
struct DeclarationName {
  std::string cpp;
  std::string_view c_name, keyword;
};

// The rows of kFeatures, then the on/off limits a reason may name.
const std::vector<DeclarationName>& declaration_names() {
  static const std::vector<DeclarationName> names = [] {
    std::vector<DeclarationName> v;
    for (const FeatureRow& f : kFeatures)
      v.push_back({"Feature::" + std::string(f.member.empty() ? f.name : f.member), f.c_name, f.name});
    v.push_back({"Capabilities::returns_weights", "ATTNCHECK_CAP_RETURNS_WEIGHTS", "returns_weights"});
    v.push_back({"Capabilities::custom_scale", "ATTNCHECK_CAP_CUSTOM_SCALE", "custom_scale"});
    v.push_back({"Capabilities::cross_lengths", "ATTNCHECK_CAP_CROSS_LENGTHS", "cross_lengths"});
    v.push_back({"Capabilities::nonfinite_safe", "ATTNCHECK_CAP_NONFINITE_SAFE", "nonfinite_safe"});
    return v;
  }();
  return names;
}

const DeclarationName* declaration_named(std::string_view token) {
  for (const DeclarationName& d : declaration_names())
    if (token == d.cpp || token == d.c_name) return &d;
  return nullptr;
}

// A list of declarations, "Feature::a, b", "Capabilities::a, b" or "ATTNCHECK_CAP3_A, _B" (the later names
// abbreviated), in the words of `by`; empty when `inside` is not such a list.
std::optional<std::string> declarations_in_words(std::string_view inside, DeclaredBy by) {
  std::vector<std::string_view> tokens;
  for (std::size_t at = 0;;) {
    const std::size_t comma = inside.find(", ", at);
    tokens.push_back(inside.substr(at, comma == std::string_view::npos ? std::string_view::npos : comma - at));
    if (comma == std::string_view::npos) break;
    at = comma + 2;
  }
  const std::string_view first = tokens.front();
  const std::string prefix = first.starts_with("Feature::")        ? "Feature::"
                             : first.starts_with("Capabilities::")   ? "Capabilities::"
                             : first.starts_with("ATTNCHECK_CAP3_") ? "ATTNCHECK_CAP3"
                             : first.starts_with("ATTNCHECK_CAP4_") ? "ATTNCHECK_CAP4"
                             : first.starts_with("ATTNCHECK_CAP4B_") ? "ATTNCHECK_CAP4B"
                                                                    : "ATTNCHECK_CAP";
  std::string out;
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const DeclarationName* d = declaration_named(i == 0 ? std::string(first) : prefix + std::string(tokens[i]));
    if (!d) return std::nullopt;
    out += i == 0 ? "" : ", ";
    out += by == DeclaredBy::c_plugin ? std::string(d->c_name) : std::string(d->keyword) + "=True";
  }
  return out;
}

}  // namespace

std::string in_declaration_words(std::string_view text, DeclaredBy by) {
  if (by == DeclaredBy::cpp) return std::string(text);
  std::string out;
  std::size_t at = 0;
  // Each innermost parenthesised group: the last '(' before the next ')'.
  for (std::size_t close; (close = text.find(')', at)) != std::string_view::npos; at = close + 1) {
    const std::size_t open = text.rfind('(', close);
    if (open == std::string_view::npos || open < at) {
      out += text.substr(at, close + 1 - at);
      continue;
    }
    const std::string_view inside = text.substr(open + 1, close - open - 1);
    out += text.substr(at, open + 1 - at);
    out += declarations_in_words(inside, by).value_or(std::string(inside));
    out += ')';
  }
  out += text.substr(at);
  return out;
}

std::string describe_capabilities(const Capabilities& caps) {
  std::string dtypes;
  for (const DType t : caps.dtypes) dtypes += (dtypes.empty() ? "" : ", ") + std::string(dtype_name(t));
  std::string s = dtypes.empty() ? std::string("no dtype") : dtypes;
  for (const CausalAlignment a : caps.alignments) s += std::string("; ") + alignment_words(a);
  s += !caps.cross_lengths                     ? "; T_q == T_k only"
       : caps.q_shorter && caps.q_longer         ? "; T_q != T_k"
       : caps.q_shorter                          ? "; T_q <= T_k only"
       : caps.q_longer                           ? "; T_q >= T_k only"
                                                 : "; T_q == T_k only";
  if (caps.lists_head_dims()) {
    s += "; head dimensions";
    std::string list;
    for (const Index d : caps.head_dims) list += (list.empty() ? " " : ", ") + std::to_string(d);
    for (const auto& [k, v] : caps.head_dim_pairs)
      list += (list.empty() ? " " : ", ") + std::to_string(k) + "/" + std::to_string(v);
    s += list;
  } else {
    if (caps.head_dim_multiple > 1) s += "; D a multiple of " + std::to_string(caps.head_dim_multiple);
    if (caps.max_head_dim > 0) s += "; D up to " + std::to_string(caps.max_head_dim);
  }
  s += caps.custom_scale ? "; an explicit scale" : "; the default scale only";
  if (caps.max_T > 0) s += "; T up to " + std::to_string(caps.max_T);
  for (const FeatureRow& f : kFeatures) {
    const std::string_view words = caps.declares(f.id) ? f.words : f.words_off;
    if (!words.empty()) s += "; " + std::string(words);
    if (f.id == Feature::paged && caps.declares(f.id)) {  // the page sizes and layouts, limits of the paged row
      s += " (pages of";
      for (std::size_t n = 0; n < caps.page_sizes.size(); ++n) s += (n ? ", " : " ") + std::to_string(caps.page_sizes[n]);
      s += std::string(caps.page_layouts & 1u ? ", token-major" : "") + (caps.page_layouts & 2u ? ", head-major" : "") + ")";
    }
  }
  if (caps.empty_rows == EmptyRows::any) s += "; rows that see no key: unspecified output (skipped)";
  return s;
}

std::string_view kind_name(ImplementationError::Kind k) {
  switch (k) {
    case ImplementationError::Kind::error_status: return "error status";
    case ImplementationError::Kind::crash: return "crash";
    case ImplementationError::Kind::timeout: return "timeout";
    case ImplementationError::Kind::wrong_size: return "wrong size";
    case ImplementationError::Kind::protocol: return "protocol error";
    case ImplementationError::Kind::nonfinite: return "non-finite output";
    case ImplementationError::Kind::unavailable: return "not started";
  }
  return "error";
}

std::string_view empty_rows_name(EmptyRows e) {
  return e == EmptyRows::nan ? "nan" : e == EmptyRows::any ? "any" : "zero";
}

void check_call(const char* who, const Problem& p) {
  check_call(who, p.q.shape(), p.k.shape(), p.v.shape(), p.options());
  if (p.d_output && p.d_output->shape() != p.output_shape())
    throw ShapeError(std::string(who) + ": d_output is " + to_string(p.d_output->shape()) + " but must have " +
                     (p.v_dim() == p.q.shape().D ? "q's shape " + to_string(p.q.shape())
                                                 : "the output's shape " + to_string(p.output_shape()) +
                                                       " ([B,H,T_q,D_v])"));
  if (p.quant) {
    const std::string w(who);
    if (p.d_output) throw ValueError(w + ": a quantised cache in a backward call (quantised caches are forward only)");
    if (p.layout != InputLayout::contiguous)
      throw ValueError(w + ": a quantised cache with the input layout " + input_layout_name(p.layout) +
                       " (its codes come contiguous)");
    // k and v must be caches of the format under their scales: each element a code times its scale.
    quant_codes(who, "k", p.quant->format, p.quant->k, p.k);
    quant_codes(who, "v", p.quant->format, p.quant->v, p.v);
    if (p.quant->q) quant_codes(who, "q", p.quant->format, *p.quant->q, p.q);  // and a quantised q
  }
}

Visibility Problem::visibility(Index b, Index h) const {
  return attncheck::visibility(options(), b, q.shape().T, k.shape().T, h);
}

std::string mask_families_line(const Problem& p) {
  std::string s;
  const auto add = [&](const std::string& what) { s += (s.empty() ? "" : "; ") + what; };
  if (!p.causal) add("no causal rule");
  if (p.prefix_length != 0) add("prefix " + std::to_string(p.prefix_length));
  if (p.window_right) add("right window " + std::to_string(*p.window_right));
  if (p.chunk_size != 0) add("chunks of " + std::to_string(p.chunk_size));
  if (!p.doc_bounds.empty()) {
    std::string d = "document bounds";
    for (const auto& bounds : p.doc_bounds) {
      d += " {";
      for (std::size_t n = 0; n < bounds.size(); ++n) d += (n ? ", " : "") + std::to_string(bounds[n]);
      d += "}";
    }
    add(d);
  }
  if (!p.q_doc_bounds.empty()) {
    std::string d = "query document bounds";
    for (const auto& bounds : p.q_doc_bounds) {
      d += " {";
      for (std::size_t n = 0; n < bounds.size(); ++n) d += (n ? ", " : "") + std::to_string(bounds[n]);
      d += "}";
    }
    add(d);
  }
  const auto broadcast = [](Index B, Index H) {
    return std::string(B == 1 ? "every batch entry" : "per batch entry") + ", " +
           (H == 1 ? "every head" : "per head");
  };
  if (p.block_mask) {
    const BlockMask& m = *p.block_mask;
    Index n[3] = {0, 0, 0};
    for (const std::uint8_t k : m.kinds) ++n[std::min<std::uint8_t>(k, 2)];
    add("block mask of " + std::to_string(m.block_q) + " x " + std::to_string(m.block_k) + " blocks (" +
        broadcast(m.B, m.H) + "; " + std::to_string(n[0]) + " empty, " + std::to_string(n[1]) + " partial, " +
        std::to_string(n[2]) + " full)");
  }
  if (p.dense_mask) add("dense mask (" + broadcast(p.dense_mask->B, p.dense_mask->H) + ")");
  if (p.layout != InputLayout::contiguous) add("inputs laid out " + input_layout_name(p.layout));
  return s;
}

std::vector<Index> Problem::sequence_lengths() const {
  return key_lengths.empty() ? std::vector<Index>(std::size_t(k.shape().B), k.shape().T) : key_lengths;
}

std::string input_layout_name(InputLayout l) {
  switch (l) {
    case InputLayout::contiguous: return "contiguous";
    case InputLayout::token_major: return "token-major";
    case InputLayout::padded: return "padded";
    case InputLayout::kv_broadcast: return "kv-broadcast";
    case InputLayout::kv_interleaved: return "kv-interleaved";
    case InputLayout::v_is_k: return "v-is-k";
  }
  return "?";
}

std::string page_order_name(PagedPlan::Order o) {
  switch (o) {
    case PagedPlan::Order::contiguous: return "contiguous";
    case PagedPlan::Order::reversed: return "reversed";
    case PagedPlan::Order::shuffled: return "shuffled";
  }
  return "?";
}

namespace {
std::uint64_t splitmix64(std::uint64_t& x) { return mix64(x += 0x9e3779b97f4a7c15ull); }
}  // namespace

PagedKV Problem::paged_kv() const {
  if (!paged) throw std::logic_error("Problem::paged_kv: the problem is not paged");
  const PagedPlan& plan = *paged;
  PagedKV pk;
  pk.page_size = plan.page_size;
  pk.layout = plan.layout;
  pk.fill = plan.fill;
  if (plan.page_size <= 0) throw std::invalid_argument("paged: page size must be > 0, got " + std::to_string(plan.page_size));
  if (!plan.block_table.empty()) {  // given explicitly (decoded from the wire): as it came
    pk.num_pages = plan.num_pages;
    pk.max_pages = plan.max_pages;
    pk.block_table = plan.block_table;
    return pk;
  }
  const std::vector<Index> lengths = sequence_lengths();
  const Index B = Index(lengths.size()), ps = plan.page_size;
  // Pages each sequence shares with sequence 0 (full pages both have), then the pages it owns.
  std::vector<Index> used(static_cast<std::size_t>(B)), shared(static_cast<std::size_t>(B), 0);
  Index live = 0, widest = 0;
  for (Index b = 0; b < B; ++b) {
    used[std::size_t(b)] = pk.pages_used(lengths[std::size_t(b)]);
    if (b > 0) shared[std::size_t(b)] = std::min({plan.shared_pages, lengths[0] / ps, lengths[std::size_t(b)] / ps});
    live += used[std::size_t(b)] - shared[std::size_t(b)];
    widest = std::max(widest, used[std::size_t(b)]);
  }
  pk.num_pages = std::max<Index>(live + std::max<Index>(plan.spare_pages, 0), 1);  // a pool is never empty
  pk.max_pages = std::max<Index>(widest + std::max<Index>(plan.spare_columns, 0), 1);
  // The physical page of the n-th live page (sequence by sequence), then the spares.
  std::vector<std::int32_t> physical(std::size_t(pk.num_pages));
  for (Index n = 0; n < pk.num_pages; ++n)
    physical[std::size_t(n)] = std::int32_t(plan.order == PagedPlan::Order::reversed ? pk.num_pages - 1 - n : n);
  if (plan.order == PagedPlan::Order::shuffled) {
    std::uint64_t state = plan.shuffle_seed;
    for (Index n = pk.num_pages - 1; n > 0; --n)
      std::swap(physical[std::size_t(n)], physical[std::size_t(splitmix64(state) % std::uint64_t(n + 1))]);
  }
  pk.block_table.assign(std::size_t(B * pk.max_pages), -1);
  Index next = 0;
  for (Index b = 0; b < B; ++b)
    for (Index i = 0; i < used[std::size_t(b)]; ++i)
      pk.block_table[std::size_t(b * pk.max_pages + i)] =
          i < shared[std::size_t(b)] ? pk.block_table[std::size_t(i)] : physical[std::size_t(next++)];
  if (plan.junk_entries) {
    const std::int32_t other = live > 0 ? physical[0] : 0;
    const std::int32_t junk[] = {-1, std::int32_t(pk.num_pages), std::numeric_limits<std::int32_t>::max(),
                                 std::numeric_limits<std::int32_t>::min(), other};
    for (Index b = 0; b < B; ++b)
      for (Index i = used[std::size_t(b)]; i < pk.max_pages; ++i)
        pk.block_table[std::size_t(b * pk.max_pages + i)] = junk[std::size_t(b + i) % 5];
  }
  return pk;
}

Gradients Implementation::backward(const Problem&) const {
  throw ImplementationError(ImplementationError::Kind::error_status, name() + " has no backward pass");
}

namespace {

class CallableImplementation final : public Implementation {
 public:
  CallableImplementation(std::string name, std::string description, Capabilities caps, ForwardFn fn, BackwardFn bwd)
      : name_(std::move(name)),
        description_(std::move(description)),
        caps_(std::move(caps)),
        fn_(std::move(fn)),
        bwd_(std::move(bwd)) {
    if (bwd_) caps_.features.add(Feature::backward);
  }
  const std::string& name() const override { return name_; }
  const std::string& description() const override { return description_; }
  const Capabilities& capabilities() const override { return caps_; }
  Outcome forward(const Problem& p) const override {
    Outcome o = fn_(p);
    check_outcome_shape(p, o, name_);
    return o;
  }
  Gradients backward(const Problem& p) const override {
    if (!bwd_) return Implementation::backward(p);
    Gradients g = bwd_(p);
    check_gradients_shape(p, g, name_, caps_);
    return g;
  }

 private:
  std::string name_, description_;
  Capabilities caps_;
  ForwardFn fn_;
  BackwardFn bwd_;
};

}  // namespace

ImplementationPtr make_implementation(std::string name, std::string description, Capabilities caps, ForwardFn fn,
                                      BackwardFn backward) {
  return std::make_shared<CallableImplementation>(std::move(name), std::move(description), std::move(caps),
                                                  std::move(fn), std::move(backward));
}

Problem probe_layout(Problem p) {
  if (p.layout == InputLayout::v_is_k) p.layout = InputLayout::contiguous;  // K keeps its strides; V its own memory
  // A quantised V holds the probe's 0s and 1s exactly at scale 1 (code 1 in every format; a ggml block's d = 1, m = 0),
  // with K as it is: one scale per tensor (always declared) or the blocks.
  if (p.quant) {
    QuantScales& v = p.quant->v;
    v = quant_extents(quant_blocked(p.quant->format) ? QuantGranularity::block32 : QuantGranularity::tensor,
                      p.v.shape());
    v.scales.assign(std::size_t(v.B * v.H * v.T * v.C), 1.0);
    if (quant_has_min(p.quant->format)) v.mins.assign(v.scales.size(), 0.0);
  }
  return p;
}

Tensor<double> recover_weights(const Implementation& impl, const Problem& p) {
  const Shape qs = p.q.shape(), ks = p.v.shape();  // V's shape: [B,H_kv,T_k,D_v]
  Tensor<double> w(Shape{qs.B, qs.H, qs.T, ks.T});
  Problem probe = probe_layout(p);
  probe.want_weights = false;
  // One call per block of D_v keys: V = [0; I_D_v; 0] over keys [start, start+D_v) puts weight (i, start+c) in
  // output column c. Every kv head gets the same probe, so a broadcast layout (one head in memory) holds it too.
  for (Index start = 0; start < ks.T; start += ks.D) {
    probe.v = Tensor<double>(ks);
    const Index width = std::min(ks.D, ks.T - start);
    for (Index b = 0; b < ks.B; ++b)
      for (Index h = 0; h < ks.H; ++h)
        for (Index c = 0; c < width; ++c) probe.v(b, h, start + c, c) = 1;
    const Outcome o = impl.forward(probe);
    for (Index b = 0; b < qs.B; ++b)
      for (Index h = 0; h < qs.H; ++h)
        for (Index i = 0; i < qs.T; ++i)
          for (Index c = 0; c < width; ++c) w(b, h, i, start + c) = o.output(b, h, i, c);
  }
  return w;
}

namespace {

class RecoveredWeights final : public Implementation {
 public:
  explicit RecoveredWeights(ImplementationPtr inner) : inner_(std::move(inner)), caps_(inner_->capabilities()) {
    caps_.returns_weights = true;
    caps_.weights_probed = true;
    description_ = inner_->description() + " (weights recovered by one-hot probing)";
  }
  const std::string& name() const override { return inner_->name(); }
  const std::string& description() const override { return description_; }
  const Capabilities& capabilities() const override { return caps_; }
  std::string unavailable() const override { return inner_->unavailable(); }
  Outcome forward(const Problem& p) const override {
    Problem plain = p;
    plain.want_weights = false;
    Outcome o = inner_->forward(plain);
    if (p.want_weights) {
      o.weights = recover_weights(*inner_, p);
      o.calls += int((p.k.shape().T + p.v_dim() - 1) / p.v_dim());  // recover_weights: one per D_v keys
    }
    return o;
  }
  // The gradient laws call the backward through this wrapper.
  Gradients backward(const Problem& p) const override {
    Gradients g = inner_->backward(p);
    check_gradients_shape(p, g, name(), capabilities());
    return g;
  }

 private:
  ImplementationPtr inner_;
  Capabilities caps_;
  std::string description_;
};

}  // namespace

ImplementationPtr with_recovered_weights(ImplementationPtr impl) {
  return std::make_shared<RecoveredWeights>(std::move(impl));
}

void check_gradients_shape(const Problem& p, const Gradients& g, const std::string& impl_name,
                           const Capabilities& caps) {
  if (p.bias && caps.declares(Feature::bias_grad) && caps.declares(Feature::bias)) {
    const Shape want{p.bias->B, p.bias->H, p.bias->T_q, p.bias->T_k};
    if (!g.dbias || g.dbias->shape() != want)
      throw ImplementationError(
          ImplementationError::Kind::wrong_size,
          impl_name + (!g.dbias ? ": returned no d_bias" : ": d_bias is " + to_string(g.dbias->shape())) +
              " but must be " + to_string(want) +
              " (it declares dBias, Feature::bias_grad: the bias's shape, dS summed over the axes it broadcasts over)");
  }
  if (!p.sinks.empty() && g.dsinks.size() != p.sinks.size())
    throw ImplementationError(ImplementationError::Kind::wrong_size,
                              impl_name + ": d_sinks has " + std::to_string(g.dsinks.size()) + " entries but must have " +
                                  std::to_string(p.sinks.size()) + " (one per query head, for the sinks it was given)");
  const std::pair<const char*, std::pair<const Tensor<double>*, const Tensor<double>*>> parts[] = {
      {"dq", {&g.dq, &p.q}}, {"dk", {&g.dk, &p.k}}, {"dv", {&g.dv, &p.v}}};
  for (const auto& [name, t] : parts)
    if (t.first->shape() != t.second->shape())
      throw ImplementationError(ImplementationError::Kind::wrong_size,
                                impl_name + ": " + name + " is " + to_string(t.first->shape()) + " but must be " +
                                    to_string(t.second->shape()) + " (the shape of " + (name + 1) + ")");
}

void check_outcome_shape(const Problem& p, const Outcome& o, const std::string& impl_name) {
  const Shape& q = p.q.shape();
  const Shape want_out = p.output_shape();
  if (o.output.shape() != want_out)
    throw ImplementationError(ImplementationError::Kind::wrong_size,
                              impl_name + ": output is " + to_string(o.output.shape()) + " but must be " +
                                  to_string(want_out) +
                                  (want_out == q ? std::string(" (q's shape)") : std::string(" ([B,H,T_q,D_v])")));
  const Shape want_lse{q.B, q.H, q.T, 1};
  if (o.lse && o.lse->shape() != want_lse)
    throw ImplementationError(ImplementationError::Kind::wrong_size,
                              impl_name + ": lse is " + to_string(o.lse->shape()) + " but must be " +
                                  to_string(want_lse) + " ([B,H,T_q,1], one per query row)");
  const Shape want_w{q.B, q.H, q.T, p.k.shape().T};
  if (o.weights && o.weights->shape() != want_w)
    throw ImplementationError(ImplementationError::Kind::wrong_size,
                              impl_name + ": weights are " + to_string(o.weights->shape()) + " but must be " +
                                  to_string(want_w) + " ([B,H,T_q,T_k])");
}

ImplementationPtr reference_implementation() {
  Capabilities caps;
  caps.nonfinite_safe = true;
  caps.features = {Feature::gqa,           Feature::key_padding,
                   Feature::window,        Feature::lse,
                   Feature::sinks,         Feature::softcap,
                   Feature::alibi,         Feature::bidirectional,
                   Feature::documents,     Feature::query_documents,
                   Feature::chunked_local, Feature::prefix,
                   Feature::right_window,  Feature::block_mask,
                   Feature::dense_mask,    Feature::v_head_dim,
                   Feature::paged,         Feature::bias,
                   Feature::bias_grad,     Feature::temperature,
                   Feature::rope,          Feature::rope_interleaved,
                   Feature::qk_norm,       Feature::qk_norm_eps_outside,
                   Feature::dropout,       Feature::rope_ntk,
                   Feature::rope_llama3,   Feature::kv_e4m3fn,
                   Feature::kv_e5m2,       Feature::kv_int8,
                   Feature::kv_scale_per_head, Feature::kv_scale_per_token,
                   Feature::kv_zero_points,  Feature::kv_ggml_q8_0,
                   Feature::kv_ggml_q4_0,    Feature::kv_ggml_q4_1,
                   Feature::kv_ggml_q5_0,    Feature::kv_ggml_q5_1,
                   Feature::q_quant,        Feature::paged_quant,
                   Feature::index_list,     Feature::index_list_blocks,
                   Feature::index_list_per_query_head, Feature::tree,
                   Feature::tree_bitmask, Feature::index_list_physical};
  caps.page_sizes = {1, 8, 16, 64, 256};
  caps.page_layouts = 3;  // token-major and head-major
  caps.reentrant = true;  // a pure function of the problem
  caps.empty_rows = EmptyRows::zero;
  static const ImplementationPtr ref = make_implementation(
      "reference", "attncheck's Eigen core: boolean causal mask, stable softmax, float accumulation", caps,
      [](const Problem& p) {
        return run_typed(p, [](const auto& q, const auto& k, const auto& v, const Problem& pr, auto* w,
                               Tensor<double>* lse) {
          if (!pr.paged) return attention(q, k, v, pr.options(), w, lse);
          // Paged: lay K and V out in the pool, then read them back only through the block table, and attend.
          const Shape& ks = k.shape();
          const std::vector<Index> lengths = pr.sequence_lengths();
          if (pr.quant) {  // quantised pools: their codes and scales, dequantised from where each key's sit
            using S = typename std::decay_t<decltype(q)>::Scalar;
            const PagedKV pk = pr.paged_kv();
            const auto unpaged = [&](const QuantScales& s, const Tensor<double>& x) {
              QuantScales back;
              return unpage_quant(pr.quant->format, page_quant(pr.quant->format, s, x, lengths, pk), pk, ks.B, ks.T,
                                  lengths, back)
                  .template cast<S>();
            };
            return attention(q, unpaged(pr.quant->k, pr.k), unpaged(pr.quant->v, pr.v), pr.options(), w, lse);
          }
          const auto pools = paged_pools(pr, k, v);
          return attention(q, gather_pages(pools.k, pools.layout, ks.B, ks.H, ks.T, ks.D, lengths),
                           gather_pages(pools.v, pools.layout, ks.B, ks.H, ks.T, v.shape().D, lengths), pr.options(), w,
                           lse);
        });
      },
      [](const Problem& p) {
        return run_backward_typed(p, [](const auto& q, const auto& k, const auto& v, const auto& d_output,
                                        const Problem& pr) { return attention_backward(q, k, v, d_output, pr.options()); });
      });
  return ref;
}

}  // namespace attncheck
