"""Attention under block masks and dense masks in numpy, checked by attncheck through the Python client:
    attncheck check --impl exec:'/usr/bin/python3 examples/python/numpy_block_masks.py'
(with harness/python on PYTHONPATH).

A dense mask arrives as `dense_mask`, a bool array [B or 1, H or 1, T_q, T_k] (an extent of 1 broadcasts over the
batch or the heads): key j is visible to query i of (b, h) where it is True. A block mask (FlexAttention's
BlockMask) arrives as `block_mask`, an attncheck_plugin.BlockMask: a kind per block of block_q x block_k (EMPTY,
PARTIAL, FULL) and the partial cells; to_dense() gives the bool array it stands for. Both go on top of the causal
rule, key padding and the left window: every family present must allow a key, and visibility now differs per head
and may have gaps in a row, which the code below never assumes away. Selected keys (DeepSeek's DSA top-k, NSA's and
MoBA's selected blocks) arrive as `index_list`, an attncheck_plugin.IndexList: int32 [B, H_kv, T_q, max_k] key (or
block) indices with -1 padding ([B, H, T_q, max_k] when its `per` is "query_head"); to_mask(T_k, H) gives the keys each query head's row lists, one more family to
intersect. A tree of draft tokens (speculative decoding) arrives as `tree`, an attncheck_plugin.Tree: the last T_q
keys of each entry are its nodes, given by their `parents` or as a packed bitmask (FlashInfer's, in either bit
order); to_mask(T_k) gives the [B, T_q, T_k] keys each node sees (the prefix and its ancestors), broadcast over heads,
and a window reads each node's place (tree.places: the prefix's length plus its depth), not its index.
"""
import numpy as np

import attncheck_plugin


def visible(B, H, T_q, T_k, alignment="top-left", causal=True, key_lengths=None, window=None, block_mask=None,
            dense_mask=None, index_list=None, tree=None):
    """The [B, H, T_q, T_k] boolean mask: query i sits at aligned position p = i (top-left) or i + T_k - T_q
    (bottom-right)."""
    p = np.arange(T_q)[:, None] + (T_k - T_q if alignment == "bottom-right" else 0)
    j = np.arange(T_k)[None, :]
    seen = np.ones((B, H, T_q, T_k), dtype=bool)
    if causal:
        seen &= j <= p
    if key_lengths is not None:
        seen &= j[None, None] < np.asarray(key_lengths)[:, None, None, None]
    if window is not None:
        if tree is not None:  # a node's place is the prefix's length plus its depth, not its index
            q_places, k_places = tree.places(T_k)
            seen &= (k_places[:, None, None, :] >= q_places[:, None, :, None] - window)
        else:
            seen &= j >= p - window
    if block_mask is not None:
        seen &= block_mask.to_dense()  # [B or 1, H or 1, T_q, T_k] broadcasts
    if dense_mask is not None:
        seen &= dense_mask
    if index_list is not None:
        seen &= index_list.to_mask(T_k, H)
    if tree is not None:
        seen &= tree.to_mask(T_k)[:, None]  # one tree per batch entry, every head
    return seen


def attention(q, k, v, scale=None, alignment="top-left", key_lengths=None, window=None, causal=True,
              block_mask=None, dense_mask=None, index_list=None, tree=None):
    """q [B,H,T_q,D], k and v [B,H_kv,T_k,D] -> output [B,H,T_q,D] and weights [B,H,T_q,T_k], in float64; a row
    that sees no key gets zeros."""
    B, H, T_q, D = q.shape
    H_kv, T_k = k.shape[1], k.shape[2]
    scale = scale or 1 / np.sqrt(D)
    kk = np.repeat(k, H // H_kv, axis=1).astype(np.float64)  # query head h reads kv head h // (H // H_kv)
    vv = np.repeat(v, H // H_kv, axis=1).astype(np.float64)
    seen = visible(B, H, T_q, T_k, alignment, causal, key_lengths, window, block_mask, dense_mask, index_list,
                   tree)
    with np.errstate(all="ignore"):  # NaN/Inf in hidden keys are masked by the select, not warned about
        scores = np.where(seen, q.astype(np.float64) @ kk.swapaxes(-1, -2) * scale, -np.inf)
        top = scores.max(axis=-1, keepdims=True)
        e = np.where(seen, np.exp(scores - np.where(np.isfinite(top), top, 0)), 0.0)
    total = e.sum(axis=-1, keepdims=True)
    weights = np.divide(e, total, out=np.zeros_like(e), where=total > 0)
    out = np.zeros((B, H, T_q, D))
    for b in range(B):  # only the values a query sees: 0 * Inf in a hidden one would be NaN
        for h in range(H):
            for i in range(T_q):
                out[b, h, i] = weights[b, h, i, seen[b, h, i]] @ vv[b, h, seen[b, h, i]]
    return out, weights


if __name__ == "__main__":
    attncheck_plugin.serve(attention, name="numpy-block-masks",
                           description="numpy attention under block masks and dense masks",
                           dtypes=("float32", "float64", "float16", "bfloat16"), returns_weights=True,
                           alignments=("top-left", "bottom-right"), nonfinite_safe=True, gqa=True, empty_rows="zero",
                           bidirectional=True, block_mask=True, dense_mask=True, index_list=True,
                           index_list_blocks=True, index_list_per_query_head=True, tree=True, tree_bitmask=True)
