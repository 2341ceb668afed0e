// The Markdown report of one falsified law, for a person: the law and why it matters, the shape, the worst
// entry, the picture, expected against actual with offending entries in bold, then the inputs in full.
#include <cmath>

#include "render_common.hpp"

namespace attncheck::reports {
using namespace detail;
namespace {

// A paged problem's layout: the plan and the block table it derives (Problem::paged_kv).
std::string paged_lines(const Problem& p) {
  const PagedPlan& pl = *p.paged;
  const PagedKV pk = p.paged_kv();
  std::string md = "paged K and V: pages of " + std::to_string(pl.page_size) + ", " + page_layout_name(pl.layout) +
                   ", " + std::to_string(pk.num_pages) + (pk.num_pages == 1 ? " page" : " pages") + " in the pool (" + page_order_name(pl.order) +
                   " order" + (pl.spare_pages ? ", " + std::to_string(pl.spare_pages) + " spare" : std::string()) +
                   "), slots no key occupies hold " + page_fill_name(pl.fill) +
                   (pl.shared_pages ? ", sequences b ≥ 1 share sequence 0's first " + std::to_string(pl.shared_pages) +
                                          " pages"
                                    : std::string()) +
                   "; block table (" + std::to_string(pk.max_pages) + (pk.max_pages == 1 ? " column" : " columns") +
                   (pl.junk_entries ? ", junk past each sequence's pages" : "") + "):\n\n";
  const Index B = Index(pk.block_table.size()) / std::max<Index>(pk.max_pages, 1);
  for (Index b = 0; b < B; ++b) {
    md += "- sequence " + std::to_string(b) + ":";
    for (Index i = 0; i < pk.max_pages; ++i) md += " " + std::to_string(pk.block_table[std::size_t(b * pk.max_pages + i)]);
    md += "\n";
  }
  return md;
}


constexpr Index kMaxRows = 32, kMaxCols = 16, kMaxHeads = 4, kMaxDiffs = 20;

bool offending(double expected, double actual, double tol) {
  if (std::isnan(expected) || std::isnan(actual)) return std::isnan(expected) != std::isnan(actual);
  if (std::isinf(expected) || std::isinf(actual)) return expected != actual;
  return tol > 0 ? std::abs(actual - expected) > tol : actual != expected;
}

struct Marking {
  const Tensor<double>* expected = nullptr;  ///< mark entries of the table that differ from this
  double tolerance = 0;
  std::vector<Index> worst;
};

// One head of a [B,H,R,C] tensor as a Markdown table, rows i and columns c (or j for weights).
std::string head_table(const Tensor<double>& t, Index b, Index h, const std::string& corner, const Marking& mark = {}) {
  const Shape& s = t.shape();
  const Index rows = std::min(s.T, kMaxRows), cols = std::min(s.D, kMaxCols);
  std::string md = "| " + corner + " |";
  for (Index c = 0; c < cols; ++c) md += " " + std::to_string(c) + " |";
  if (cols < s.D) md += " … |";
  md += "\n|---|";
  for (Index c = 0; c < cols; ++c) md += "---:|";
  if (cols < s.D) md += "---|";
  md += "\n";
  for (Index i = 0; i < rows; ++i) {
    md += "| **" + std::to_string(i) + "** |";
    for (Index c = 0; c < cols; ++c) {
      const double x = t(b, h, i, c);
      const bool worst = mark.worst.size() == 4 && mark.worst[0] == b && mark.worst[1] == h && mark.worst[2] == i &&
                         mark.worst[3] == c;
      const bool bad = mark.expected && offending((*mark.expected)(b, h, i, c), x, mark.tolerance);
      md += " " + (bad ? "**" + num(x, true) + "**" : num(x)) + (worst ? " ◀ worst" : "") + " |";
    }
    if (cols < s.D) md += " … |";
    md += "\n";
  }
  if (rows < s.T || cols < s.D)
    md += "\n(" + std::to_string(s.T) + "×" + std::to_string(s.D) + "; the first " + std::to_string(rows) + "×" +
          std::to_string(cols) + " shown, all of it is in the JSON report)\n";
  return md;
}

std::string tensor_tables(const Tensor<double>& t, const std::string& corner, const std::vector<Index>& worst = {}) {
  const Shape& s = t.shape();
  std::string md;
  Index shown = 0;
  for (Index b = 0; b < s.B; ++b)
    for (Index h = 0; h < s.H; ++h) {
      if (shown++ >= kMaxHeads) continue;
      if (s.B * s.H > 1) md += "b=" + std::to_string(b) + ", h=" + std::to_string(h) + ":\n\n";
      md += head_table(t, b, h, corner, Marking{nullptr, 0, worst}) + "\n";
    }
  if (shown > kMaxHeads)
    md += "(" + std::to_string(shown - kMaxHeads) + " more heads are in the JSON report)\n\n";
  return md;
}

std::string shape_table(const Problem& p) {
  const Shape& q = p.q.shape();
  // H_kv: the kv heads of K and V (H_kv < H: grouped queries, query head h reading kv head h / (H / H_kv)).
  std::string md =
      "| B | H | H_kv | T_q | T_k | D | scale | causal alignment | dtype |\n|---:|---:|---:|---:|---:|---:|---|---|---|\n";
  md += "| " + std::to_string(q.B) + " | " + std::to_string(q.H) + " | " + std::to_string(p.kv_heads()) + " | " +
        std::to_string(q.T) + " | " +
        std::to_string(p.k.shape().T) + " | " + std::to_string(q.D) +
        (p.v_dim() != q.D ? " (D_v = " + std::to_string(p.v_dim()) + ")" : std::string()) + " | " +
        (p.scale ? num(*p.scale, true) : std::string("1/√D (default)")) + " | " + std::string(alignment_name(p.alignment)) +
        " | " + std::string(dtype_name(p.dtype)) + " |\n";
  const Index H_kv = p.kv_heads(), group = q.H / H_kv;
  if (H_kv < q.H) {  // which query heads share each kv head
    md += "\nGrouped queries: ";
    for (Index g = 0; g < H_kv; ++g)
      md += (g ? "; " : "") + std::string(group > 1 ? "query heads " : "query head ") + std::to_string(g * group) +
            (group > 1 ? "–" + std::to_string((g + 1) * group - 1) : "") + " read kv head " + std::to_string(g);
    md += ".\n";
  }
  if (!p.key_lengths.empty()) {
    md += "\nkey lengths:";
    for (std::size_t b = 0; b < p.key_lengths.size(); ++b) md += (b ? ", " : " ") + std::to_string(p.key_lengths[b]);
    md += " (keys j ≥ key_lengths[b] of batch entry b are padding)\n";
  }
  if (p.window)
    md += "\nsliding window: " + std::to_string(*p.window) + " (the query at aligned position p sees keys p - " +
          std::to_string(*p.window) + " .. p)\n";
  if (!p.causal) md += "\nno causal rule (causal = false): every query sees every key up to the padding\n";
  if (p.prefix_length != 0)
    md += "\nbidirectional prefix: keys 0 .. " + std::to_string(p.prefix_length - 1) +
          " are visible to every query (prefix-LM)\n";
  if (p.window_right)
    md += "\nright window: " + std::to_string(*p.window_right) + " (the query at aligned position p sees keys up to p + " +
          std::to_string(*p.window_right) + ")\n";
  if (p.chunk_size != 0)
    md += "\nchunked local attention: chunks of " + std::to_string(p.chunk_size) +
          " positions (a query sees only keys of its own chunk)\n";
  if (p.layout != InputLayout::contiguous)
    md += "\ninputs laid out " + input_layout_name(p.layout) + " (q, k and v passed through other strides: " +
          (p.layout == InputLayout::token_major      ? "[B,T,H,D] in memory"
           : p.layout == InputLayout::padded         ? "gaps between rows, heads and batch entries, holding NaN"
           : p.layout == InputLayout::kv_broadcast   ? "K and V stride 0 over their heads"
           : p.layout == InputLayout::kv_interleaved ? "K and V interleaved in one buffer [B,T,H_kv,2,D]"
                                                     : "V the very view K is") +
          ")\n";
  if (!p.doc_bounds.empty()) {
    // Each batch entry's documents as key ranges (and query ranges, when the queries have bounds of their own):
    // what a person checks a packed row against.
    const auto range = [](const std::vector<Index>& bounds, std::size_t d, Index T) {
      const Index start = d == 0 ? 0 : std::min(bounds[d - 1], T), end = d < bounds.size() ? std::min(bounds[d], T) : T;
      return end > start ? "[" + std::to_string(start) + ", " + std::to_string(end) + ")" : std::string("(empty)");
    };
    md += "\npacked documents (a query sees only keys of its own document";
    md += p.q_doc_bounds.empty() ? "):" : "; each document aligned on its own query and key lengths):";
    for (std::size_t b = 0; b < p.doc_bounds.size(); ++b) {
      md += std::string(b ? ";" : "") + " batch entry " + std::to_string(b) + ":";
      for (std::size_t d = 0; d <= p.doc_bounds[b].size(); ++d) {
        md += d ? ", " : " ";
        if (!p.q_doc_bounds.empty())
          md += "queries " + range(p.q_doc_bounds[b], d, p.q.shape().T) + " keys ";
        md += range(p.doc_bounds[b], d, p.k.shape().T);
      }
    }
    md += "\n";
  }
  // A block or dense mask: each (b, h) entry's grid, when small enough to read.
  const auto grid = [&](Index B, Index H, Index rows, Index cols, auto&& at, const std::string& what) {
    if (B * H * rows * cols > 4096) {
      md += " (" + std::to_string(B * H) + " entries of " + std::to_string(rows) + " x " + std::to_string(cols) +
            ": in the JSON)\n";
      return;
    }
    md += "\n";
    for (Index b = 0; b < B; ++b)
      for (Index h = 0; h < H; ++h) {
        md += "\n" + what + (B > 1 ? " batch entry " + std::to_string(b) : std::string()) +
              (H > 1 ? " head " + std::to_string(h) : std::string()) + ":\n\n```\n";
        for (Index i = 0; i < rows; ++i) {
          for (Index j = 0; j < cols; ++j) md += at(b, h, i, j);
          md += "\n";
        }
        md += "```\n";
      }
  };
  if (p.block_mask) {
    const BlockMask& m = *p.block_mask;
    md += "\nblock mask: blocks of " + std::to_string(m.block_q) + " queries x " + std::to_string(m.block_k) +
          " keys, " + (m.B == 1 ? "one for every batch entry" : "one per batch entry") + ", " +
          (m.H == 1 ? "every head" : "one per head") + "; E empty, P partial (its cells below), F full:";
    grid(m.B, m.H, m.q_blocks, m.k_blocks, [&](Index b, Index h, Index x, Index y) {
      return std::string(1, "EPF"[int(m.kind(b, h, x, y))]);
    }, "kinds of");
    if (!m.partial.cells.empty()) {
      md += "\npartial blocks' cells (1 visible, . hidden; read only inside P blocks):";
      grid(m.partial.B, m.partial.H, m.partial.T_q, m.partial.T_k, [&](Index b, Index h, Index i, Index j) {
        return std::string(m.partial.visible(b, h, i, j) ? "1" : ".");
      }, "cells of");
    }
  }
  if (p.dense_mask) {
    const DenseMask& m = *p.dense_mask;
    md += std::string("\ndense mask (1 visible, . hidden), ") +
          (m.B == 1 ? "one for every batch entry" : "one per batch entry") + ", " +
          (m.H == 1 ? "every head" : "one per head") + ":";
    grid(m.B, m.H, m.T_q, m.T_k, [&](Index b, Index h, Index i, Index j) {
      return std::string(m.visible(b, h, i, j) ? "1" : ".");
    }, "cells of");
  }
  if (p.index_list) {  // each (batch entry, kv head, query) row's entries, then the keys they leave each query head
    const IndexList& l = *p.index_list;
    md += "\nindex list (selected " +
          std::string(l.block_size > 1 ? "blocks of " + std::to_string(l.block_size) + " keys" : std::string("keys")) +
          ", one list per kv head, -1 padding; a query sees a key only if its row lists it and every other rule "
          "allows it):\n";
    for (Index b = 0; b < l.B; ++b)
      for (Index g = 0; g < l.H; ++g)
        for (Index i = 0; i < l.T_q; ++i) {
          md += "  b" + std::to_string(b) + " kv" + std::to_string(g) + " q" + std::to_string(i) + ": [";
          const std::int32_t* row = l.indices.data() + ((b * l.H + g) * l.T_q + i) * l.max_k;
          for (Index n = 0; n < l.max_k; ++n) md += (n ? ", " : "") + std::to_string(row[n]);
          md += "]\n";
        }
  }
  if (p.tree) {  // the parents of each entry's nodes, or its bitmask's rows; then what each node sees
    const TokenTree& t = *p.tree;
    md += "\ntree of draft tokens (the last " + std::to_string(t.T_q) +
          " keys of each entry are its nodes, node n query n; a node sees the prefix and its ancestors, and only what "
          "every other rule allows):\n";
    for (Index b = 0; b < t.B; ++b) {
      const Index L = p.key_lengths.empty() ? p.k.shape().T : p.key_lengths[std::size_t(b)];
      md += "  b" + std::to_string(b) + ", prefix of " + std::to_string(L - t.T_q) + " keys: ";
      if (t.form == TokenTree::Form::parents) {
        md += "parents [";
        for (Index n = 0; n < t.T_q; ++n) md += (n ? ", " : "") + std::to_string(t.parent(b, n));
        md += "]\n";
      } else {
        md += std::string("bitmask (") + (t.big_endian ? "big" : "little") + "-endian bits from byte " +
              std::to_string(t.offsets[std::size_t(b)]) + ", rows of " + std::to_string(L) + " cells):";
        for (Index i = 0; i < t.T_q; ++i) {
          md += " ";
          for (Index j = 0; j < L; ++j) md += t.sees(b, i, j, L) ? "1" : "0";
        }
        md += "\n";
      }
    }
  }
  // The score modifiers, in the order they apply.
  const auto list = [](const std::vector<double>& x) {
    std::string s;
    for (std::size_t h = 0; h < x.size(); ++h) s += (h ? ", " : "") + num(x[h], true);
    return s;
  };
  if (p.softcap) md += "\nsoftcap: " + num(*p.softcap, true) + " (each scaled score s becomes softcap·tanh(s/softcap))\n";
  if (!p.alibi_slopes.empty())
    md += "\nALiBi slopes per query head: " + list(p.alibi_slopes) + " (score += slope·(j - p), p the query's aligned position)\n";
  if (!p.sinks.empty())
    md += "\nsinks per query head: " + list(p.sinks) + " (one more softmax logit in every row, with no value)\n";
  if (p.bias) {  // one line per (b, h, query) row
    const ScoreBias& b = *p.bias;
    md += "\nadditive bias [" + std::to_string(b.B) + "," + std::to_string(b.H) + "," + std::to_string(b.T_q) + "," +
          std::to_string(b.T_k) + "] (score += bias after the softcap, where ALiBi's term is; an extent of 1 is " +
          "shared):\n";
    for (Index r = 0; r < b.B * b.H * b.T_q; ++r)
      md += "  " + list(std::vector<double>(b.values.begin() + r * b.T_k, b.values.begin() + (r + 1) * b.T_k)) + "\n";
  }
  if (p.rope) {  // its fields, then each batch entry's positions
    const Rope& r = *p.rope;
    const Index B = p.q.shape().B, T_q = p.q.shape().T, T_k = p.k.shape().T;
    md += std::string("\nrotary embeddings: ") + (r.variant == RopeVariant::half_split ? "half-split" : "interleaved") +
          " pairs, rotary_dim " + std::to_string(r.rotary_dim) + ", base " + num(r.base, true) + ", factor " +
          num(r.factor, true) + " (q and k rotated by their tokens' positions before the scores):\n";
    const auto ids = [](auto from, auto to) {
      std::string out;
      for (auto it = from; it != to; ++it) out += (out.empty() ? "" : ", ") + std::to_string(*it);
      return out;
    };
    for (Index b = 0; b < B; ++b)
      md += "  entry " + std::to_string(b) + ": q at " +
            ids(r.q_positions.begin() + b * T_q, r.q_positions.begin() + (b + 1) * T_q) + "; k at " +
            ids(r.k_positions.begin() + b * T_k, r.k_positions.begin() + (b + 1) * T_k) + "\n";
  }
  if (p.qk_norm) {  // its eps and each normalised side's weights
    const QkNorm& n = *p.qk_norm;
    md += "\nQK-norm (each row w ⊙ x / r, r = " +
          std::string(n.eps_outside ? "sqrt(mean x²) + eps" : "sqrt(mean x² + eps)") + ", before the rope), eps " +
          num(n.eps, true) + ":\n";
    if (!n.q_weight.empty()) md += "  q weights " + list(n.q_weight) + "\n";
    if (!n.k_weight.empty()) md += "  k weights " + list(n.k_weight) + "\n";
  }
  if (p.temperature) {  // one line per (b, h)
    const QueryTemperature& t = *p.temperature;
    md += "\nper-query temperature [" + std::to_string(t.B) + "," + std::to_string(t.H) + "," + std::to_string(t.T_q) +
          "] (query i's scaled scores divided by its temperature, before the softcap; an extent of 1 is shared):\n";
    for (Index r = 0; r < t.B * t.H; ++r)
      md += "  " + list(std::vector<double>(t.values.begin() + r * t.T_q, t.values.begin() + (r + 1) * t.T_q)) + "\n";
  }
  if (p.dropout)
    md += "\ndropout: p = " + num(p.dropout->p, true) + ", seed " + std::to_string(p.dropout->seed) + ", offset " +
          std::to_string(p.dropout->offset) +
          " (each weight kept and divided by 1 - p, or dropped, by the "
          "implementation's own keep mask)\n";
  if (p.quant) {  // the format, each side's scales (and zero points), and its codes where the cache is small
    const QuantizedKV& qk = *p.quant;
    md += "\nK and V quantised to " + std::string(quant_format_name(qk.format)) +
          " (k and v above are the dequantised values, (code - zero point)·scale + minimum):\n";
    for (const auto& [name, s, x] : {std::tuple{"k", &qk.k, &p.k}, {"v", &qk.v, &p.v}}) {
      md += std::string("  ") + name + " scales per " + std::string(quant_granularity_name(s->granularity)) + " [" +
            std::to_string(s->B) + "," + std::to_string(s->H) + "," + std::to_string(s->T) +
            (s->C > 1 ? "," + std::to_string(s->C) : "") + "]: " + list(s->scales);
      if (!s->zero_points.empty()) md += "; zero points " + list(s->zero_points);
      if (!s->mins.empty()) md += "; minimums " + list(s->mins);
      md += "\n";
      if (x->size() <= 256) {
        const std::vector<std::uint8_t> codes = quant_codes("report", name, qk.format, *s, *x);
        md += std::string("  ") + name + " codes (hex, row-major [B,H_kv,T_k,D]):";
        for (std::size_t n = 0; n < codes.size(); ++n) {
          char hex[4];
          std::snprintf(hex, sizeof hex, "%02x", unsigned(codes[n]));
          md += (n % std::size_t(x->shape().D) == 0 ? "\n   " : "") + std::string(" ") + hex;
        }
        md += "\n";
      }
    }
  }
  if (p.want_lse) md += "\nthe log-sum-exp of every row is asked for\n";
  if (p.paged) md += "\n" + paged_lines(p);
  return md;
}

std::string variant_section(const Problem& p, const Problem& v) {
  if (p.paged != v.paged && p.q.shape() == v.q.shape() && p.k.shape() == v.k.shape()) {
    std::string md = "## The variant problem (what the law changed)\n\nThe same inputs, laid out in pages "
                     "differently:\n\n";
    md += v.paged ? paged_lines(v) : std::string("dense K and V (no pages)\n");
    if (p.q.values() == v.q.values() && p.k.values() == v.k.values() && p.v.values() == v.v.values()) return md + "\n";
  }
  std::string md = "## The variant problem (what the law changed)\n\n";
  const bool same_shapes = p.q.shape() == v.q.shape() && p.k.shape() == v.k.shape() && p.v.shape() == v.v.shape();
  if (!same_shapes) {
    md += "Its shapes differ from the problem's:\n\n" + shape_table(v) + "\n";
    for (const auto& [name, t] : {std::pair<const char*, const Tensor<double>*>{"q", &v.q}, {"k", &v.k}, {"v", &v.v}})
      md += "### " + std::string(name) + " " + to_string(t->shape()) + "\n\n" + tensor_tables(*t, "i \\ c");
    return md;
  }
  if (p.scale != v.scale)
    md += "- scale: " + (p.scale ? num(*p.scale, true) : "default") + " → " + (v.scale ? num(*v.scale, true) : "default") + "\n";
  if (p.alignment != v.alignment)
    md += "- alignment: " + std::string(alignment_name(p.alignment)) + " → " + std::string(alignment_name(v.alignment)) + "\n";
  if (p.dtype != v.dtype)
    md += "- dtype: " + std::string(dtype_name(p.dtype)) + " → " + std::string(dtype_name(v.dtype)) + "\n";
  Index diffs = 0, listed = 0;
  for (const auto& [name, a, b] : {std::tuple<const char*, const Tensor<double>*, const Tensor<double>*>{"q", &p.q, &v.q},
                                   {"k", &p.k, &v.k},
                                   {"v", &p.v, &v.v}}) {
    const Shape& s = a->shape();
    for (Index bb = 0; bb < s.B; ++bb)
      for (Index h = 0; h < s.H; ++h)
        for (Index i = 0; i < s.T; ++i)
          for (Index c = 0; c < s.D; ++c) {
            const double x = (*a)(bb, h, i, c), y = (*b)(bb, h, i, c);
            if (x == y || (std::isnan(x) && std::isnan(y))) continue;
            ++diffs;
            if (listed++ < kMaxDiffs)
              md += "- `" + std::string(name) + index_string({bb, h, i, c}) + "`: " + num(x, true) + " → " + num(y, true) + "\n";
          }
  }
  if (diffs > kMaxDiffs) md += "- … " + std::to_string(diffs - kMaxDiffs) + " more (all in the JSON report)\n";
  if (diffs == 0 && p.scale == v.scale && p.alignment == v.alignment && p.dtype == v.dtype)
    md += "The variant has the same inputs (the law calls the implementation on it again).\n";
  return md + "\n";
}

}  // namespace

std::string law_markdown(const RunInfo& run, const LawReport& r) {
  const LawResult& res = r.result;
  std::string md = "# `" + res.law + "` falsified by `" + run.implementation + "`\n\n";
  if (res.violation) md += "> " + md_cell(plain_message(res.law, res.violation->message)) + "\n\n";
  md += "**The law.** " + r.summary + "\n\n";
  if (!r.why.empty()) md += "**Why it matters.** " + r.why + "\n\n";

  md += "| | |\n|---|---|\n";
  md += "| implementation | `" + md_cell(run.implementation) + "`: " + md_cell(run.implementation_description) + " |\n";
  md += "| dtype, seed | " + std::string(dtype_name(run.dtype)) + ", " + std::to_string(res.seed) + " |\n";
  md += "| found by | case " + std::to_string(res.cases_run) + ", then " + std::to_string(res.shrink_steps) +
        " shrink steps (" + std::to_string(res.calls) + " calls to the implementation" +
        (res.note.empty() ? "" : "; " + md_cell(res.note)) + ") |\n";
  if (const auto cmd = replay_command(run, r); !cmd.empty())
    md += "| replay this case | `" + md_cell(cmd) + "` |\n";
  if (const auto cmd = reproduce_command(run, r); !cmd.empty())
    md += "| regenerate it with RapidCheck | `" + md_cell(cmd) + "` |\n";
  md += "\n";

  if (!res.minimal_case) return md + "(no case was recorded: " + (res.violation ? res.violation->message : "") + ")\n";
  const LawCase& c = *res.minimal_case;
  md += "## Shape\n\n" + shape_table(c.problem) + "\n";
  if (!c.params.empty()) {
    md += "Law parameters:";
    for (const auto& [key, value] : c.params) md += " " + key + " = " + num(value, true) + ";";
    md.pop_back();
    md += "\n\n";
  }

  if (res.violation) {
    const Violation& v = *res.violation;
    // Weight-like tensors end in T_k (keys j); outputs end in D (channels c).
    const auto corner_of = [&](const Tensor<double>& t) {
      const bool gradient = !v.quantity.empty() && v.quantity[0] == 'd';  // dq, dk, dv, dk-sum: channels
      const bool keys = v.quantity != "output" && !gradient && t.shape().D == c.problem.k.shape().T;
      return std::string(keys ? "i \\ j" : "i \\ c");
    };
    md += "## What went wrong\n\n";
    md += "The worst entry";
    if (!v.worst_index.empty()) md += ", `" + v.quantity + index_string(v.worst_index) + "`";
    if (v.expected && v.actual && v.worst_index.size() == 4 && v.expected->shape() == v.actual->shape()) {
      const auto& w = v.worst_index;
      const Shape& s = v.expected->shape();
      if (w[0] < s.B && w[1] < s.H && w[2] < s.T && w[3] < s.D)
        md += ": expected " + num((*v.expected)(w[0], w[1], w[2], w[3]), true) + ", actual " +
              num((*v.actual)(w[0], w[1], w[2], w[3]), true);
    }
    // An exact law (or an entry where a law allows no rounding) has no tolerance to print: any difference fails.
    if (v.tolerance > 0)
      md += "; magnitude " + num(v.magnitude, true) + ", tolerance " + num(v.tolerance, true) +
            "; margin (magnitude / tolerance): " + margin_text(v) + ".\n\n";
    else if (v.quantity == "call")
      md += "; " + margin_text(v) + ".\n\n";
    else
      md += "; magnitude " + num(v.magnitude, true) + "; exact law: any difference is a violation.\n\n";

    const PictureSet pics = pictures_of(res);
    if (pics.error_map) {
      const auto [b, h] = worst_head(v, v.expected->shape());
      md += "![error map of the counterexample](" + law_file(res.law, "-error.svg") +
            ")\n\n*Left: how far each entry of head b=" + std::to_string(b) + ", h=" + std::to_string(h) +
            " is from the expected value, as a multiple of its own tolerance, on a log scale: light entries are "
            "within the tolerance, strong ones past it, and the pattern of the strong ones is the shape of the bug. "
            "Right: the " + v.quantity + " the implementation returned.*\n\n";
    }
    if (pics.weights)
      md += "![weights of the counterexample](" + law_file(res.law, "-weights.svg") +
            ")\n\n*The weights the implementation returned for the head of the worst entry. Cells outlined in red are "
            "future keys, whose weight must be exactly 0" +
            (v.quantity == "weights" ? "; the worst entry is outlined in black.*\n\n" : ".*\n\n");
    if (pics.variance) {
      md += "![score variance against D](" + law_file(res.law, "-variance.svg") +
            ")\n\n*The scaled scores' variance measured at each D (median of group means, with a 95% band), against "
            "what each mistake predicts: 1 when scores are scaled by 1/√D, D when the scale is forgotten, 1/D when it "
            "is applied twice.*\n\n| D | score variance | 95% band |\n|---:|---:|---|\n";
      for (const auto& pt : v.series)
        md += "| " + num(pt.D) + " | " + num(pt.variance) + " | " + num(pt.low) + " – " + num(pt.high) + " |\n";
      md += "\n";
    }

    if (v.expected && v.actual && v.expected->shape() == v.actual->shape()) {
      const Shape& s = v.expected->shape();
      Index bad = 0;
      for (Index b = 0; b < s.B; ++b)
        for (Index h = 0; h < s.H; ++h)
          for (Index i = 0; i < s.T; ++i)
            for (Index d = 0; d < s.D; ++d) bad += offending((*v.expected)(b, h, i, d), (*v.actual)(b, h, i, d), v.tolerance);
      const bool worst_ok = v.worst_index.size() == 4 && v.worst_index[0] < s.B && v.worst_index[1] < s.H;
      const Index b = worst_ok ? v.worst_index[0] : 0, h = worst_ok ? v.worst_index[1] : 0;
      md += "### Expected against actual (" + v.quantity + ", head b=" + std::to_string(b) + ", h=" + std::to_string(h) +
            ")\n\n";
      md += std::to_string(bad) + " of " + std::to_string(s.numel()) +
            (v.tolerance > 0 ? " entries (all heads) are off by more than the tolerance"
                             : " entries (all heads) differ") +
            "; they are in bold, with every digit.\n\n";
      md += "Expected:\n\n" + head_table(*v.expected, b, h, corner_of(*v.expected)) + "\nActual:\n\n" +
            head_table(*v.actual, b, h, corner_of(*v.actual), Marking{&*v.expected, v.tolerance, v.worst_index}) + "\n";
    } else {
      if (v.expected)
        md += "### Expected " + to_string(v.expected->shape()) + "\n\n" + tensor_tables(*v.expected, corner_of(*v.expected));
      if (v.actual)
        md += "### Actual " + to_string(v.actual->shape()) + "\n\n" +
              tensor_tables(*v.actual, corner_of(*v.actual), v.worst_index);
    }
  }

  if (res.violation && res.violation->call) {
    // The law compared a call derived from the case, and that call computed wrongly: its shape and inputs first,
    // then the case it came from.
    const Problem& call = *res.violation->call;
    md += "## The failing call\n\n";
    if (!res.violation->call_what.empty()) md += md_cell(res.violation->call_what) + ".\n\n";
    md += shape_table(call) + "\n";
    for (const auto& [name, t] : {std::pair<const char*, const Tensor<double>*>{"Q", &call.q}, {"K", &call.k},
                                  {"V", &call.v}})
      md += "### " + std::string(name) + " of the call " + to_string(t->shape()) + "\n\n" + tensor_tables(*t, "i \\ c");
    md += "## Inputs of the case it came from\n\n";
  } else {
    md += "## Inputs\n\n";
  }
  for (const auto& [name, t] : {std::pair<const char*, const Tensor<double>*>{"Q", &c.problem.q}, {"K", &c.problem.k},
                                {"V", &c.problem.v}})
    md += "### " + std::string(name) + " " + to_string(t->shape()) + "\n\n" + tensor_tables(*t, "i \\ c");
  // A gradient law's case carries the upstream gradient the backward was called with.
  if (c.problem.d_output)
    md += "### dO (the upstream gradient) " + to_string(c.problem.d_output->shape()) + "\n\n" +
          tensor_tables(*c.problem.d_output, "i \\ c");
  if (c.variant) md += variant_section(c.problem, *c.variant);
  if (!c.tags.empty()) {
    md += "Coverage tags of this case:";
    for (const auto& t : c.tags) md += " `" + t + "`";
    md += "\n";
  }
  return md;
}

}  // namespace attncheck::reports
