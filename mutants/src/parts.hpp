// The zoo's entries, grouped by where the mistake sits; each function builds its family's Mutant records.
#pragma once

#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include "attncheck/mutants.hpp"
#include "kernel_kit.hpp"

namespace attncheck::zoo {

/// What every zoo entry declares: the full contract, as its author believes the kernel meets it (so every
/// law applies, strict causality with non-finite inputs included).
inline Capabilities zoo_capabilities() {
  Capabilities c;
  c.nonfinite_safe = true;
  return c;
}

/// `c` with batch invariance declared (ATTNCHECK_CAP3_BATCH_INVARIANT).
inline Capabilities batch_invariant(Capabilities c) {
  c.features.add(Feature::batch_invariant);
  return c;
}

/// The zoo's contract for kernels written for grouped-query attention (K and V with H_kv | H heads).
inline Capabilities gqa_capabilities() {
  Capabilities c = zoo_capabilities();
  c.features.add(Feature::gqa);
  return c;
}

/// The zoo's contract for kernels with ABI-3 features (grouped queries too): each true flag declares the
/// log-sum-exp, sinks, softcap or ALiBi (Feature::lse, sinks, softcap, alibi).
struct Abi3 {
  bool lse = false, sinks = false, softcap = false, alibi = false;
};
inline Capabilities abi3_capabilities(Abi3 f) {
  Capabilities c = gqa_capabilities();
  c.features.set(Feature::lse, f.lse);
  c.features.set(Feature::sinks, f.sinks);
  c.features.set(Feature::softcap, f.softcap);
  c.features.set(Feature::alibi, f.alibi);
  return c;
}

/// An implementation whose body is one head's code, run over [B,H] at every dtype by per_head.
/// `fn(Q, K, V, ctx) -> HeadOut<A>` is generic over the accumulation type A; `kv_of(h, H, H_kv)` picks the kv
/// head query head h reads (only kernels with caps.gqa ever see H_kv < H). When the problem asks for the LSE,
/// the rows' HeadOut::lse come back as Outcome::lse.
template <class HeadFn, class KvOf = GroupedKv>
ImplementationPtr head_impl(std::string name, std::string description, HeadFn fn,
                            Capabilities caps = zoo_capabilities(), KvOf kv_of = {}) {
  return make_implementation(std::move(name), std::move(description), std::move(caps), [fn, kv_of](const Problem& p) {
    return run_typed(p, [&](const auto& q, const auto& k, const auto& v, const Problem& pr, auto* w,
                            Tensor<double>* lse) { return per_head(q, k, v, pr, w, fn, kv_of, lse); });
  });
}

/// The scalar type of an Eigen expression (a head kernel's accumulation type A, from its Q).
template <class M>
using Scalar = typename std::decay_t<M>::Scalar;

/// A visibility rule as a kernel gets it wrong: `rule(ctx, correct, i, j)` says whether query i sees key j,
/// `correct` being the right Visibility (for the parts the author got right).
using Rule = std::function<bool(const HeadCtx&, const Visibility&, Index, Index)>;

/// A kernel that mixes values over the keys `rule` lets through (attend_where), so the rule is its only bug.
/// One kernel body for every rule (a std::function, not a template): instantiated once per dtype for all the
/// mask-family and block-mask mutants (src/masks_beyond.cpp defines it), not once per mutant and dtype.
ImplementationPtr rule_impl(const char* name, const char* description, Rule rule, Capabilities caps);

std::vector<Mutant> mask_mutants();     ///< where the mask is built or applied
std::vector<Mutant> softmax_mutants();  ///< the softmax step
std::vector<Mutant> scale_mutants();    ///< the scale
std::vector<Mutant> layout_mutants();   ///< memory layout and state between calls
std::vector<Mutant> gqa_mutants();      ///< grouped-query heads, KV-cache decoding and chunked prefill
std::vector<Mutant> padding_mutants();  ///< key padding, sliding windows, rows that see no key (and controls)
std::vector<Mutant> backward_mutants();  ///< the backward pass (and its two controls)
std::vector<Mutant> backward_nan_mutants();  ///< the backward under the nan empty-row convention (and a control)
std::vector<Mutant> decode_mutants();   ///< the split-KV decode path alone
std::vector<Mutant> tiled_mutants();    ///< block-tiled online softmax: its loops, rescale and ragged ends
std::vector<Mutant> lse_mutants();       ///< the log-sum-exp a kernel returns, split-KV merging, the row max's start
std::vector<Mutant> modifier_mutants();  ///< softcap, ALiBi and sinks in the forward
std::vector<Mutant> modifier_backward_mutants();  ///< the backward of softcap and sinks (d_sinks)
std::vector<Mutant> paged_mutants();    ///< paged K and V: the block table, pages, slots, strides (and a control)
std::vector<Mutant> mask_family_mutants();  ///< documents, chunks, a prefix, a right window, no causal rule (a control)
std::vector<Mutant> block_mask_mutants();   ///< block masks and dense masks: kinds, cells, broadcasting (a control)
std::vector<Mutant> stride_mutants();   ///< inputs read through strides: the address arithmetic (a control)
std::vector<Mutant> head_dim_mutants();  ///< V with a head dimension of its own: D read for D_v (a control)
std::vector<Mutant> position_mutants();  ///< bugs only long contexts show: an int16 position
std::vector<Mutant> batch_mutants();    ///< correct kernels switched by the call's shape under a batch-invariance claim
std::vector<Mutant> dropout_mutants();  ///< dropout fused and got wrong (a control)
std::vector<Mutant> quant_mutants();    ///< quantised K and V caches dequantised wrong (a control)
std::vector<Mutant> index_list_mutants();  ///< selected keys read wrong (a control)
std::vector<Mutant> tree_mutants();        ///< trees of draft tokens read wrong (a control)

/// A zoo entry: the kernel, its bug, its minimal case (q's shape; `also` the other q shapes a shrink may end at),
/// why that case is minimal, and the laws that must kill it.
inline Mutant zoo_entry(ImplementationPtr impl, const char* bug, Shape minimal, const char* why,
                        std::vector<std::string> killed_by, std::vector<Shape> also = {}) {
  return Mutant{.impl = std::move(impl),
                .bug = bug,
                .minimal_shape = minimal,
                .why_minimal = why,
                .killed_by = std::move(killed_by),
                .also_minimal = std::move(also)};
}

/// Attention in double over the keys keys_of(b, h, i) gives each query (one softmax term per entry: a key given twice
/// weighs twice), of those `rules` lets it see: scores, their softmax, the weighted values, rounded to p's dtype (the
/// weights and LSE too, where p asks for them), each score plus score_offset(b, h, i, j) where given (ALiBi at a
/// kernel's own positions). The gather-then-attend controls' kernel.
Outcome attend_gathered(const Problem& p, const Problem& rules,
                        const std::function<std::vector<Index>(Index b, Index h, Index i)>& keys_of,
                        const std::function<double(Index b, Index h, Index i, Index j)>& score_offset = {});
std::vector<Mutant> qk_norm_mutants();  ///< QK-norm fused and got wrong (a control)
std::vector<Mutant> rope_mutants();  ///< rotary embeddings fused and got wrong (a control)
std::vector<Mutant> temperature_mutants();  ///< a per-query temperature read or applied wrong (a control)
std::vector<Mutant> bias_mutants();     ///< an additive score bias read wrong: dropped, broadcast, strides, scaled (a control)
std::vector<Mutant> controls();         ///< correct implementations written differently
std::vector<Mutant> modifier_controls();  ///< a correct flash-decoding kernel with the LSE and every modifier
std::vector<Mutant> exactness_controls();  ///< correct kernels whose arithmetic differs where exact laws once looked

}  // namespace attncheck::zoo
