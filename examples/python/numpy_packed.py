"""Packed-document attention in numpy, with the other masks beyond causal, checked by attncheck through the
Python client:
    attncheck check --impl exec:'/usr/bin/python3 examples/python/numpy_packed.py'
(with harness/python on PYTHONPATH).

Packed sequences (several documents concatenated into one row of the batch, as varlen FlashAttention and
FlexAttention's document masks train them) arrive as q_doc_ids [B, T_q] and k_doc_ids [B, T_k], int32: a query
sees only the keys of its own document. The queries' ids are their own (query_documents=True: FlashAttention
varlen's cu_seqlens_q beside cu_seqlens_k), so a document may hold other numbers of queries and keys, and each
document is aligned on its own lengths: its query i sits at p = k0 + (i - q0), plus (k1 - k0) - (q1 - q0)
bottom-right, for its queries [q0, q1) and keys [k0, k1). The other families: chunked local attention (Llama 4: a query sees only
the keys of its chunk of chunk_size positions), a bidirectional prefix (prefix-LM: keys j < prefix_length are
visible to every query), a right window (j <= p + window_right), no causal rule at all (causal=False), key padding
and the left window. The mask is written from those definitions, one boolean per (query, key), every family
present having to allow a key; nothing assumes the visible keys are contiguous.
"""
import numpy as np

import attncheck_plugin


def visible(T_q, T_k, alignment="top-left", causal=True, key_length=None, window=None, prefix_length=0,
            window_right=None, chunk_size=0, q_doc=None, k_doc=None):
    """The [T_q, T_k] boolean mask of one batch entry: query i sits at aligned position p = i (top-left) or
    i + T_k - T_q (bottom-right), or, with documents, at that position inside its own document; q_doc [T_q] and
    k_doc [T_k] are its row of the document ids (non-decreasing), or None."""
    i = np.arange(T_q)
    if q_doc is None:
        p = i + (T_k - T_q if alignment == "bottom-right" else 0)
    else:  # each document's ranges, as cu_seqlens give them
        q0, q1 = np.searchsorted(q_doc, q_doc, "left"), np.searchsorted(q_doc, q_doc, "right")
        k0, k1 = np.searchsorted(k_doc, q_doc, "left"), np.searchsorted(k_doc, q_doc, "right")
        p = k0 + (i - q0) + ((k1 - k0) - (q1 - q0) if alignment == "bottom-right" else 0)
    p = p[:, None]
    j = np.arange(T_k)[None, :]
    seen = np.ones((T_q, T_k), dtype=bool)
    if causal:
        seen &= (j <= p) | (j < prefix_length)
    if key_length is not None:
        seen &= j < key_length
    if window is not None:
        seen &= j >= p - window
    if window_right is not None:
        seen &= j <= p + window_right
    if chunk_size > 0:
        seen &= (j // chunk_size) == (p // chunk_size)  # numpy's // floors, also for a negative p
    if q_doc is not None:
        seen &= q_doc[:, None] == k_doc[None, :]
    return seen


def attention(q, k, v, scale=None, alignment="top-left", key_lengths=None, window=None, causal=True,
              prefix_length=0, window_right=None, chunk_size=0, q_doc_ids=None, k_doc_ids=None):
    """q [B,H,T_q,D], k and v [B,H_kv,T_k,D] -> output [B,H,T_q,D] and weights [B,H,T_q,T_k], in float64; a row
    that sees no key gets zeros."""
    B, H, T_q, D = q.shape
    H_kv, T_k = k.shape[1], k.shape[2]
    scale = scale or 1 / np.sqrt(D)
    kk = np.repeat(k, H // H_kv, axis=1).astype(np.float64)  # query head h reads kv head h // (H // H_kv)
    vv = np.repeat(v, H // H_kv, axis=1).astype(np.float64)
    out, weights = np.zeros((B, H, T_q, D)), np.zeros((B, H, T_q, T_k))
    for b in range(B):
        seen = visible(T_q, T_k, alignment, causal, None if key_lengths is None else int(key_lengths[b]), window,
                       prefix_length, window_right, chunk_size,
                       None if q_doc_ids is None else q_doc_ids[b], None if k_doc_ids is None else k_doc_ids[b])
        with np.errstate(all="ignore"):  # NaN/Inf in hidden keys are masked by the select, not warned about
            scores = np.where(seen, q[b].astype(np.float64) @ kk[b].swapaxes(-1, -2) * scale, -np.inf)
            top = scores.max(axis=-1, keepdims=True)
            e = np.where(seen, np.exp(scores - np.where(np.isfinite(top), top, 0)), 0.0)
        total = e.sum(axis=-1, keepdims=True)
        w = np.divide(e, total, out=np.zeros_like(e), where=total > 0)
        for i in range(T_q):  # only the values a query sees: 0 * Inf in a hidden one would be NaN
            out[b, :, i] = np.einsum("hj,hjd->hd", w[:, i, seen[i]], vv[b][:, seen[i]])
        weights[b] = w
    return out, weights


if __name__ == "__main__":
    attncheck_plugin.serve(attention, name="numpy-packed",
                           description="numpy attention over packed documents, chunks, a prefix, a right window",
                           dtypes=("float32", "float64", "float16", "bfloat16"), returns_weights=True,
                           alignments=("top-left", "bottom-right"), nonfinite_safe=True, gqa=True, empty_rows="zero",
                           documents=True, query_documents=True, chunked_local=True, prefix=True,
                           right_window=True, bidirectional=True)
