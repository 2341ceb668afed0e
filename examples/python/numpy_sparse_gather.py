"""Selected-key attention the way a sparse kernel computes it (DeepSeek's FlashMLA sparse decoding, NSA's selection
branch), in numpy, checked by attncheck through the Python client:
    attncheck check --impl exec:'/usr/bin/python3 examples/python/numpy_sparse_gather.py'
(with harness/python on PYTHONPATH).

For each query the kernel walks its row of the index list entry by entry: it skips -1, expands a block index into
its block's keys, drops what the causal rule and the key padding hide, and attends over the keys it gathered alone,
each entry one term of the softmax. A key the row lists twice therefore weighs twice, which the kernel declares
(index_list_counted=True): attncheck's oracle then counts duplicates too (a key listed n times weighs n·e^s). Run
with --undeclared, the same kernel claims set semantics instead, and attncheck shows where its rows weigh a repeated
key twice (index-list-oracle is falsified on a row with a duplicate).
"""
import sys

import numpy as np

import attncheck_plugin


def attention(q, k, v, scale=None, alignment="top-left", key_lengths=None, index_list=None):
    """q [B,H,T_q,D], k and v [B,H_kv,T_k,D] -> output [B,H,T_q,D] and weights [B,H,T_q,T_k], in float64; a row
    that gathers no key gets zeros."""
    B, H, T_q, D = q.shape
    H_kv, T_k = k.shape[1], k.shape[2]
    scale = scale or 1 / np.sqrt(D)
    shift = T_k - T_q if alignment == "bottom-right" else 0
    out = np.zeros((B, H, T_q, v.shape[3]))
    weights = np.zeros((B, H, T_q, T_k))
    for b in range(B):
        length = T_k if key_lengths is None else int(key_lengths[b])
        for h in range(H):
            g = h // (H // H_kv)  # the kv head query head h reads
            for i in range(T_q):
                last = min(i + shift, length - 1)  # the causal rule and the padding: keys 0 .. last
                if index_list is None:
                    keys = list(range(last + 1))
                else:
                    row = index_list.indices[b, h if index_list.per == "query_head" else g, i]
                    bs = index_list.block_size
                    keys = [j for e in row if e >= 0 for j in range(e * bs, min((e + 1) * bs, T_k)) if j <= last]
                if not keys:
                    continue
                keys = np.array(keys)  # each entry a term: a repeated key weighs as often as it is listed
                s = k[b, g, keys].astype(np.float64) @ q[b, h, i].astype(np.float64) * scale
                e = np.exp(s - s.max())
                w = e / e.sum()
                np.add.at(weights[b, h, i], keys, w)
                out[b, h, i] = w @ v[b, g, keys].astype(np.float64)
    return out, weights


if __name__ == "__main__":
    undeclared = "--undeclared" in sys.argv[1:]
    attncheck_plugin.serve(attention, name="numpy-sparse-gather",
                           description="selected keys gathered entry by entry, duplicates counted"
                           + (" (declared as sets)" if undeclared else ""),
                           dtypes=("float32", "float64"), returns_weights=True,
                           alignments=("top-left", "bottom-right"), gqa=True, key_lengths=True, empty_rows="zero",
                           index_list=True, index_list_blocks=True, index_list_per_query_head=True,
                           index_list_counted=not undeclared)
