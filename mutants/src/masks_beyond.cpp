// Mutants whose mistake is in a mask family beyond causal: packed documents, chunked local attention,
// a bidirectional prefix, a right window and no causal rule. Each kernel mixes values over the keys its own
// (wrong) rule lets through with attend_where, so the rule is its only bug; and one control, written from the
// families' definitions over document and chunk ids, as numpy code builds its mask.
#include <algorithm>
#include <cmath>
#include <functional>

#include "parts.hpp"

namespace attncheck::zoo {
namespace {

// What these kernels declare: key padding, the left window, and every family beyond causal.
Capabilities mask_family_capabilities() {
  Capabilities c = zoo_capabilities();
  c.features.add({Feature::key_padding, Feature::window});
  c.features.add(
      {Feature::documents, Feature::chunked_local, Feature::prefix, Feature::right_window, Feature::bidirectional});
  return c;
}

ImplementationPtr family_rule_impl(const char* name, const char* description, Rule rule) {
  return rule_impl(name, description, std::move(rule), mask_family_capabilities());
}

// The rule without one family: `drop` clears it from a copy of the context.
template <class Drop> Visibility without(const HeadCtx& c, Drop drop) {
  HeadCtx d = c;
  drop(d);
  return d.visibility();
}

// The first key of query i's document, and the key past its last.
Index document_start(const Visibility& v, Index i) {
  const Index d = v.query_document(i);
  return d == 0 ? 0 : (*v.doc_bounds)[std::size_t(d - 1)];
}
Index document_end(const Visibility& v, Index i) {
  const Index d = v.query_document(i);
  return d < Index(v.doc_bounds->size()) ? (*v.doc_bounds)[std::size_t(d)] : v.T_k;
}

Index floor_div(Index a, Index b) { return Index(std::floor(double(a) / double(b))); }

// What the query-document kernels declare: the families above and query bounds of their own.
Capabilities query_document_capabilities() {
  Capabilities c = mask_family_capabilities();
  c.features.add(Feature::query_documents);
  return c;
}

// Query i's document under the query bounds, and the ranges of queries and keys it holds, as a varlen kernel
// reads them from cu_seqlens_q and cu_seqlens_k (each clamped to the call's lengths).
struct DocumentRanges {
  Index d, q0, q1, k0, k1;
};
DocumentRanges document_ranges(const HeadCtx& c, Index i) {
  const std::vector<Index>&qb = *c.q_doc_bounds, &kb = *c.doc_bounds;
  const Index d = document_of(qb, i);
  const auto at = [d](const std::vector<Index>& b, Index n, Index T) {
    return n < 0 ? Index{0} : n < Index(b.size()) ? std::min(b[std::size_t(n)], T) : T;
  };
  return {d, at(qb, d - 1, c.T_q), at(qb, d, c.T_q), at(kb, d - 1, c.T_k), at(kb, d, c.T_k)};
}

ImplementationPtr query_document_impl(const char* name, const char* description, Rule rule) {
  return rule_impl(name, description, std::move(rule), query_document_capabilities());
}

}  // namespace

ImplementationPtr rule_impl(const char* name, const char* description, Rule rule, Capabilities caps) {
  return head_impl(
      name, description,
      [rule](const auto& Q, const auto& K, const auto& V, const HeadCtx& c) {
        using A = Scalar<decltype(Q)>;
        const Visibility correct = c.visibility();
        return attend_where<A>(scores(Q, K, c.resolved_scale()), V,
                               [&](Index i, Index j) { return rule(c, correct, i, j); });
      },
      std::move(caps));
}

std::vector<Mutant> mask_family_mutants() {
  std::vector<Mutant> z;

  // cu_seqlens read one entry early for a document's start: `start = cu[d] - 1`, so each query also sees the
  // last key of the document before its own.
  z.push_back(Mutant{
      .impl = family_rule_impl("mutant:document-start-off-by-one", "each document starts one key early",
                        [](const HeadCtx& c, const Visibility& v, Index i, Index j) {
                          if (!c.doc_bounds) return v.visible(i, j);
                          const Visibility nodoc = without(c, [](HeadCtx& d) { d.doc_bounds = nullptr; });
                          return nodoc.visible(i, j) && j >= document_start(v, i) - 1 && j < document_end(v, i);
                        }),
      .bug = "a document's first key taken as cu_seqlens[d] - 1: every query also sees the last key of the "
             "document before its own",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "one query in the second of two one-key documents: T_q = 1 over T_k = 2 keys bottom-right "
                     "(bounds {1}), the query at position 1 sees key 0 of the first document",
      .killed_by = {"hidden-keys", "zero-future-weight", "packed-equals-separate", "oracle-agreement"},
  });

  // The document end read one past: `end = cu[d + 1] + 1`, the next document's first key visible (only
  // without the causal rule does a query ever reach it).
  z.push_back(Mutant{
      .impl = family_rule_impl("mutant:document-end-off-by-one", "each document ends one key late",
                        [](const HeadCtx& c, const Visibility& v, Index i, Index j) {
                          if (!c.doc_bounds) return v.visible(i, j);
                          const Visibility nodoc = without(c, [](HeadCtx& d) { d.doc_bounds = nullptr; });
                          return nodoc.visible(i, j) && j >= document_start(v, i) && j <= document_end(v, i);
                        }),
      .bug = "a document's end taken one key late: the first key of the next document is visible (seen only "
             "where the causal rule does not hide it: no causal rule, or a prefix)",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "one query and the first key of the next document, after it, so visible only without the "
                     "causal rule or through a prefix of 2: T_q = 1 over T_k = 2 keys top-left, bounds {1}",
      .killed_by = {"hidden-keys", "zero-future-weight", "oracle-agreement"},
  });

  // The query's document looked up at its row index i in k_doc_ids, not at its aligned position: right for a
  // square call, wrong for a decode step or a prefill chunk against a cache (bottom-right).
  z.push_back(Mutant{
      .impl = family_rule_impl("mutant:document-from-query-index", "the query's document read at its row index",
                        [](const HeadCtx& c, const Visibility& v, Index i, Index j) {
                          if (!c.doc_bounds) return v.visible(i, j);
                          const Visibility nodoc = without(c, [](HeadCtx& d) { d.doc_bounds = nullptr; });
                          const Index mine = v.key_document(std::clamp<Index>(i, 0, c.T_k - 1));  // should be p
                          return nodoc.visible(i, j) && v.key_document(j) == mine;
                        }),
      .bug = "the query's document taken from k_doc_ids[i] (its row) instead of its aligned position "
             "i + T_k - T_q: a decode step or prefill chunk reads another document",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "row and position differ only under bottom-right with T_q != T_k: one query at position 1 "
                     "over T_k = 2 keys in two documents (bounds {1}) is put in document 0",
      .killed_by = {"hidden-keys", "zero-future-weight", "oracle-agreement"},
  });

  // The chunk of a query from its row index, as in the document mistake above.
  z.push_back(Mutant{
      .impl = family_rule_impl("mutant:chunk-from-query-index", "the query's chunk computed from its row index",
                        [](const HeadCtx& c, const Visibility&, Index i, Index j) {
                          const Visibility nochunk = without(c, [](HeadCtx& d) { d.chunk = 0; });
                          return nochunk.visible(i, j) && (c.chunk <= 0 || j / c.chunk == i / c.chunk);  // i: p
                        }),
      .bug = "the query's chunk computed as i / chunk from its row, not from its aligned position: a decode step "
             "against a cache sees the first chunk's keys",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "row and position differ only bottom-right with T_q != T_k: one query at position 1 over "
                     "T_k = 2 keys, chunks of 1, reads key 0's chunk",
      .killed_by = {"hidden-keys", "zero-future-weight", "oracle-agreement"},
  });

  // Combinations. Each bug below needs three features of a call at once, so it is met only where the generators
  // combine them (one case in several hundred on the features' own shares).
  //
  // An encoder path (no causal rule) written for square calls: it takes the query's chunk from its row index, as
  // an encoder may (row and position agree when T_q == T_k); the causal path aligns it. Wrong only with chunks,
  // no causal rule and T_q != T_k bottom-right, all three.
  z.push_back(Mutant{
      .impl = family_rule_impl("mutant:encoder-chunk-from-row",
                               "no causal rule: the query's chunk computed from its row (right when square)",
                               [](const HeadCtx& c, const Visibility& v, Index i, Index j) {
                                 if (c.chunk <= 0 || c.causal || c.position_offset == 0) return v.visible(i, j);
                                 const Visibility nochunk = without(c, [](HeadCtx& d) { d.chunk = 0; });
                                 return nochunk.visible(i, j) && floor_div(j, c.chunk) == floor_div(i, c.chunk);
                               }),
      .bug = "the non-causal (encoder) path computes a query's chunk as i / chunk from its row, not its aligned "
             "position i + T_k - T_q: wrong only for chunked, non-causal, bottom-right calls with T_q != T_k",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "chunks, no causal rule and a bottom-right offset together: one query at position 1 over T_k = "
                     "2 keys, chunks of 1, reads key 0's chunk instead of key 1's",
      .killed_by = {"hidden-keys", "oracle-agreement"},
  });

  // A decode path that applies one local rule: `if (window) ... else if (chunk) ...`, so with both, the chunk is
  // lost; the prefill path applies both. Wrong only with a window, chunks and T_q < T_k bottom-right.
  z.push_back(Mutant{
      .impl = family_rule_impl("mutant:cache-window-drops-chunk",
                               "against a cache, a sliding window replaces the chunks instead of joining them",
                               [](const HeadCtx& c, const Visibility& v, Index i, Index j) {
                                 if (c.chunk <= 0 || !c.window || c.T_q >= c.T_k || c.position_offset == 0)
                                   return v.visible(i, j);
                                 return without(c, [](HeadCtx& d) { d.chunk = 0; }).visible(i, j);
                               }),
      .bug = "a cache call (T_q < T_k, bottom-right) with both a sliding window and chunks applies only the window "
             "(`if (window) ... else if (chunk) ...`): keys of the previous chunk inside the window are seen",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "a window, chunks and a cache call together: one query at position 1 over T_k = 2 keys, "
                     "chunks of 1 and a window of 1 or more, sees key 0 of the previous chunk",
      .killed_by = {"hidden-keys", "oracle-agreement"},
  });

  // Chunked local attention implemented as a sliding window of chunk - 1 keys: right for the last query of each
  // chunk, too wide for every other.
  z.push_back(Mutant{
      .impl = family_rule_impl("mutant:chunk-as-window", "chunked local attention computed as a sliding window",
                        [](const HeadCtx& c, const Visibility&, Index i, Index j) {
                          if (c.chunk <= 0) return c.visibility().visible(i, j);
                          HeadCtx w = c;
                          w.chunk = 0;
                          w.window = w.window ? std::min(*w.window, c.chunk - 1) : c.chunk - 1;  // not chunks
                          return w.visibility().visible(i, j);
                        }),
      .bug = "chunks of c taken as a sliding window of c - 1 keys: a query early in its chunk also sees the end "
             "of the previous chunk",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "under the causal rule alone, chunks of 2 and a query at the start of the second chunk "
                     "(position 2): one query over T_k = 3 keys bottom-right sees key 1 of the first chunk; with a "
                     "prefix of 2 or no causal rule, chunks of 1 and T_k = 2 top-left (key 1 is after the query, "
                     "and the window reaches only back)",
      .killed_by = {"hidden-keys", "zero-future-weight", "chunked-equals-separate", "oracle-agreement"},
  });

  // The prefix treated as plain causal: prefix-LM's bidirectional prefix never applied.
  z.push_back(Mutant{
      .impl = family_rule_impl("mutant:prefix-ignored", "the bidirectional prefix treated as causal",
                        [](const HeadCtx& c, const Visibility&, Index i, Index j) {
                          return without(c, [](HeadCtx& d) { d.prefix = 0; }).visible(i, j);
                        }),
      .bug = "prefix_length ignored: the prefix is causal, a query does not see the prefix keys after it",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "one query at position 0 and a prefix of 2: T_q = 1 over T_k = 2 keys top-left, key 1 is in "
                     "the prefix and must be seen (as small: two queries over one key bottom-right with a prefix of "
                     "1, where query 0 sits at position -1 and sees key 0 only through the prefix)",
      .killed_by = {"oracle-agreement"},
      .also_minimal = {{1, 1, 2, 1}},
  });

  // The prefix OR-ed into the whole mask instead of into the causal rule: prefix keys visible through padding,
  // windows, chunks and documents.
  z.push_back(Mutant{
      .impl = family_rule_impl("mutant:prefix-overrides-mask", "prefix keys visible whatever the other families say",
                        [](const HeadCtx& c, const Visibility& v, Index i, Index j) {
                          return v.visible(i, j) || (c.causal && j < c.prefix);  // should only relax causality
                        }),
      .bug = "mask = causal_and_rest | (j < prefix_length): the prefix is visible through padding, windows, "
             "chunks and documents, not only through the causal rule",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "one query, one key that is padding (length 0) and a prefix of 1: the padded key is seen (or, "
                     "as small where the case has no padding, a prefix of 1 through a window of 0, chunks of 1 or "
                     "a document bound at 1: one query at position 1 over T_k = 2 keys bottom-right sees key 0)",
      .killed_by = {"hidden-keys", "zero-future-weight", "oracle-agreement"},
  });

  // A bidirectional path built on a causal kernel: it skips the causal mask on every tile but the diagonal
  // one (tiles of 2 keys), which keeps it.
  z.push_back(Mutant{
      .impl = family_rule_impl("mutant:bidirectional-diagonal-tile", "without the causal rule, the diagonal tile is still masked",
                        [](const HeadCtx& c, const Visibility& v, Index i, Index j) {
                          const Index p = i + (c.alignment == CausalAlignment::BottomRight ? c.T_k - c.T_q : 0);
                          const bool diagonal_tile = floor_div(j, 2) == floor_div(p, 2);
                          return v.visible(i, j) && (c.causal || !diagonal_tile || j <= p);
                        }),
      .bug = "causal = false skips the mask on off-diagonal tiles only: inside the query's own tile of 2 keys "
             "the causal rule still hides the keys after it",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "one query at position 0 and key 1 in the same tile, causal = false: T_q = 1 over T_k = 2 "
                     "top-left, key 1 must be seen",
      .killed_by = {"oracle-agreement", "bidirectional-permutation"},
  });

  // `j <= p + window_right + 1`: the right window one key too wide (what a right window of 0 should equal,
  // the causal rule, it does not).
  z.push_back(Mutant{
      .impl = family_rule_impl("mutant:right-window-too-wide", "the right window lets one key too many in",
                        [](const HeadCtx& c, const Visibility&, Index i, Index j) {
                          HeadCtx w = c;
                          if (w.window_right) ++*w.window_right;  // off by one
                          return w.visibility().visible(i, j);
                        }),
      .bug = "the right window is one key too wide: with window_right = 0 and no causal rule a query sees the "
             "key after it, so it does not equal causal",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "one query at position 0, key 1 after it, a right window of 0, and no causal rule or a "
                     "prefix of 2 (either lets key 1 through the causal rule): T_q = 1 over T_k = 2 top-left",
      .killed_by = {"hidden-keys", "zero-future-weight", "neutral-masks", "oracle-agreement"},
  });

  // Documents honoured only on the causal path: `if (causal) mask &= same_document`.
  z.push_back(Mutant{
      .impl = family_rule_impl("mutant:documents-only-when-causal", "documents ignored without the causal rule",
                        [](const HeadCtx& c, const Visibility& v, Index i, Index j) {
                          if (c.causal) return v.visible(i, j);
                          return without(c, [](HeadCtx& d) { d.doc_bounds = nullptr; }).visible(i, j);
                        }),
      .bug = "the document mask applied only when causal: a packed encoder (causal = false) attends across "
             "documents",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "one query in the first of two documents, causal = false: T_q = 1 over T_k = 2 keys, bounds "
                     "{1}, key 1 of the next document seen",
      .killed_by = {"hidden-keys", "zero-future-weight", "oracle-agreement"},
  });

  // Documents whose queries have bounds of their own (FlashAttention varlen, cu_seqlens_q != cu_seqlens_k): the
  // query's document read from its own bounds, right, but its position aligned on the whole call's lengths,
  // p = i + T_k - T_q, not on its document's. Right for the last document (its queries and keys end together) and
  // wherever every document has as many queries as keys.
  z.push_back(Mutant{
      .impl = query_document_impl("mutant:query-documents-aligned-globally",
                                  "each document's queries aligned on the whole call's lengths, not its own",
                                  [](const HeadCtx& c, const Visibility& v, Index i, Index j) {
                                    if (!c.q_doc_bounds) return v.visible(i, j);
                                    const Visibility global = without(c, [](HeadCtx& d) {
                                      d.doc_bounds = d.q_doc_bounds = nullptr;
                                    });
                                    return global.visible(i, j) && v.key_document(j) == v.query_document(i);
                                  }),
      .bug = "a document's queries aligned bottom-right on the whole call (p = i + T_k - T_q) instead of on the "
             "document's own query and key lengths: a document before the last one with fewer queries than keys "
             "sees too few of its keys",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "one query over two keys in two documents of one key each: top-left, the query in the second "
                     "(query bounds {0}, key bounds {1}) sits at position 1 of the call's keys, its document's key, "
                     "but at 0 aligned on the call, and sees nothing; bottom-right, in the first (query bounds {1}) "
                     "it sits at 0 but at 1 aligned on the call, which only a window of 0 or chunks of 1 show. As "
                     "small: two queries over one key, bottom-right with query 0 alone in the first document with the "
                     "key (at 0 of it, at -1 of the call), or top-left with query 1 alone in the second one with the "
                     "key (at 0 of it, at 1 of the call: a window of 0 or chunks of 1 show it)",
      .killed_by = {"row-stochastic", "packed-equals-separate", "oracle-agreement"},
      .also_minimal = {{1, 1, 2, 1}},
  });

  // The query bounds ignored: each query's document derived from its aligned position, as without them (a kernel
  // written for packed sequences of equal query and key lengths that declares cu_seqlens_q).
  z.push_back(Mutant{
      .impl = query_document_impl("mutant:query-documents-ignored", "the queries' own document bounds ignored",
                                  [](const HeadCtx& c, const Visibility& v, Index i, Index j) {
                                    if (!c.q_doc_bounds) return v.visible(i, j);
                                    return without(c, [](HeadCtx& d) { d.q_doc_bounds = nullptr; }).visible(i, j);
                                  }),
      .bug = "cu_seqlens_q ignored: each query put in the document its aligned position lies in, as if queries and "
             "keys had the same lengths, so a query sees another document's keys",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "one query and one key in different documents: the query's bounds put it in one, the key's "
                     "in the other, and from its position it would be the key's",
      .killed_by = {"hidden-keys", "zero-future-weight", "packed-equals-separate", "oracle-agreement"},
  });

  // Each document aligned top-left inside itself (FlashAttention before 2.1 aligned varlen's causal mask so):
  // p = k0 + (i - q0), without the (k1 - k0) - (q1 - q0) a bottom-right call adds.
  z.push_back(Mutant{
      .impl = query_document_impl("mutant:query-documents-top-left",
                                  "each document's queries aligned top-left inside it under bottom-right",
                                  [](const HeadCtx& c, const Visibility& v, Index i, Index j) {
                                    if (!c.q_doc_bounds || c.alignment != CausalAlignment::BottomRight)
                                      return v.visible(i, j);
                                    HeadCtx top = c;
                                    top.alignment = CausalAlignment::TopLeft;
                                    return top.visibility().visible(i, j);
                                  }),
      .bug = "each document's causal mask aligned top-left inside the document (p = k0 + (i - q0)) under a "
             "bottom-right call: a document with fewer queries than keys sees too few",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "one query over two keys bottom-right in one document (query bounds {}, key bounds {}): it sits "
                     "at position 1 and sees both keys, aligned top-left it sees key 0 only (with a window of 0 or "
                     "chunks of 1: key 1 only, key 0 only)",
      .killed_by = {"zero-future-weight", "packed-equals-separate", "oracle-agreement"},
  });

  // Correct, written from cu_seqlens as a varlen kernel is: each query's document and its ranges from the bounds,
  // its position inside the document from the document's own lengths, then every family at that position.
  z.push_back(Mutant{
      .impl = query_document_impl("control:query-documents-from-cu-seqlens",
                                  "documents with query bounds of their own, each aligned on its lengths",
                                  [](const HeadCtx& c, const Visibility& v, Index i, Index j) {
                                    if (!c.q_doc_bounds) return v.visible(i, j);
                                    const DocumentRanges r = document_ranges(c, i);
                                    if (j < r.k0 || j >= r.k1) return false;
                                    const Index p = r.k0 + (i - r.q0) +
                                                    (c.alignment == CausalAlignment::BottomRight
                                                         ? (r.k1 - r.k0) - (r.q1 - r.q0) : 0);
                                    bool ok = !c.causal || j <= p || j < c.prefix;
                                    ok = ok && (c.key_length < 0 || j < c.key_length);
                                    ok = ok && (!c.window || j >= p - *c.window) &&
                                         (!c.window_right || j <= p + *c.window_right);
                                    return ok && (c.chunk <= 0 || floor_div(j, c.chunk) == floor_div(p, c.chunk));
                                  }),
      .bug = "none: a query's document, its ranges and its position from cu_seqlens_q and cu_seqlens_k",
      .control = true,
      .minimal_shape = {},
      .why_minimal = "a control: no case should fail",
      .killed_by = {},
  });

  // Correct, written from ids as numpy code is: per query and key, document ids compared, chunk ids compared,
  // the causal rule or the prefix, the windows and the padding, one test each.
  z.push_back(Mutant{
      .impl = family_rule_impl("control:masks-from-ids", "every mask family from document and chunk ids, cell by cell",
                        [](const HeadCtx& c, const Visibility& v, Index i, Index j) {
                          const Index p = i + (c.alignment == CausalAlignment::BottomRight ? c.T_k - c.T_q : 0);
                          bool ok = !c.causal || j <= p || j < c.prefix;
                          ok = ok && (c.key_length < 0 || j < c.key_length);
                          ok = ok && (!c.window || j >= p - *c.window) && (!c.window_right || j <= p + *c.window_right);
                          ok = ok && (c.chunk <= 0 || floor_div(j, c.chunk) == floor_div(p, c.chunk));
                          ok = ok && (!c.doc_bounds || v.key_document(j) == v.query_document(i));
                          return ok;
                        }),
      .bug = "none: the mask of every family from ids, cell by cell, not as one run of keys",
      .control = true,
      .minimal_shape = {},
      .why_minimal = "a control: no case should fail",
      .killed_by = {},
  });
  return z;
}

}  // namespace attncheck::zoo
