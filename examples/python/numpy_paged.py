"""Paged causal attention in numpy, in vLLM's layout, checked by attncheck through the Python client:
    attncheck check --impl exec:'/usr/bin/python3 examples/python/numpy_paged.py'
(with harness/python on PYTHONPATH).

vLLM's PagedAttention keeps the KV cache as key_cache and value_cache [num_blocks, block_size, H_kv, D] with a
block table [B, max_blocks] of int32 block numbers and seq_lens [B]: key t of sequence b is
key_cache[block_tables[b, t // block_size], t % block_size]. This is attncheck's token-major layout
(ATTNCHECK_PAGED_TOKEN_MAJOR), as vLLM's FlashAttention backend holds its cache. vLLM's own CUDA kernel splits the
key cache's D further, [num_blocks, H_kv, D / x, block_size, x] with x = 16 bytes of elements; this example keeps
the plain token-major layout, which attncheck sends.

Every call goes through one kernel that reads a sequence's keys and values block by block through its table row,
its first ceil(seq_len / block_size) entries only and only their live slots: the rest of the cache (NaN, Inf,
pages of other sequences) and the table's entries past them (-1, out of range) are never read. A dense call (half
the cases of every forward law) is the same kernel on k[b, :, :seq_len].
"""
import numpy as np

import attncheck_plugin


def sequence_rows(cache, table_row, seq_len, block_size):
    """Keys (or values) 0 .. seq_len - 1 of one sequence, [seq_len, H_kv, D], block by block through its row of
    the block table."""
    blocks = []
    for n in range((seq_len + block_size - 1) // block_size):
        blocks.append(cache[int(table_row[n]), :min(block_size, seq_len - n * block_size)])
    return np.concatenate(blocks) if blocks else np.zeros((0,) + cache.shape[2:], dtype=cache.dtype)


def attend(q, keys, values, T_k, scale, alignment, window):
    """One sequence: q [H, T_q, D], keys and values [seq_len, H_kv, D] -> output [H, T_q, D] and weights
    [H, T_q, T_k] in float64 (keys past seq_len are padding: weight 0). Query head h reads kv head
    h // (H // H_kv); query i at aligned position p = i (top-left) or i + T_k - T_q (bottom-right) sees the keys
    j <= p (and j >= p - window)."""
    H, T_q, D = q.shape
    n, H_kv = keys.shape[0], keys.shape[1]
    k = np.repeat(keys.transpose(1, 0, 2), H // H_kv, axis=0).astype(np.float64)  # [H, seq_len, D]
    v = np.repeat(values.transpose(1, 0, 2), H // H_kv, axis=0).astype(np.float64)
    p = np.arange(T_q)[:, None] + (T_k - T_q if alignment == "bottom-right" else 0)
    j = np.arange(n)[None, :]
    seen = (j <= p) & ((j >= p - window) if window is not None else True)  # [T_q, seq_len]
    weights = np.zeros((H, T_q, T_k))
    out = np.zeros((H, T_q, values.shape[2]))  # V's own head dimension D_v (v_head_dim=True)
    if n == 0:
        return out, weights
    with np.errstate(all="ignore"):  # NaN/Inf in hidden keys are masked by the select, not warned about
        scores = np.where(seen, q.astype(np.float64) @ k.swapaxes(-1, -2) * scale, -np.inf)
        top = scores.max(axis=-1, keepdims=True)
        e = np.where(seen, np.exp(scores - np.where(np.isfinite(top), top, 0)), 0.0)
    total = e.sum(axis=-1, keepdims=True)
    w = np.divide(e, total, out=np.zeros_like(e), where=total > 0)
    for i in range(T_q):  # only the values a query sees: 0 * Inf in a hidden one would be NaN
        out[:, i] = np.einsum("hj,hjd->hd", w[:, i, seen[i]], v[:, seen[i]])
    weights[:, :, :n] = w
    return out, weights


def attention(q, k, v, scale=None, alignment="top-left", key_lengths=None, window=None, paged=None):
    """q [B,H,T_q,D]; k and v [B,H_kv,T_k,D], or None with `paged` (an attncheck_plugin.PagedKV: k_pages and
    v_pages [num_blocks, block_size, H_kv, D], block_table [B, max_blocks], seq_lens [B]) -> output [B,H,T_q,D],
    weights [B,H,T_q,T_k]."""
    B, H, T_q, D = q.shape
    T_k = paged.T_k if paged is not None else k.shape[2]
    scale = scale or 1 / np.sqrt(D)
    D_v = paged.v_pages.shape[-1] if paged is not None else v.shape[3]  # the value cache's rows may differ (MLA)
    out, weights = np.zeros((B, H, T_q, D_v)), np.zeros((B, H, T_q, T_k))
    for b in range(B):
        if paged is not None:
            seq_len = int(paged.seq_lens[b])
            keys = sequence_rows(paged.k_pages, paged.block_table[b], seq_len, paged.page_size)
            values = sequence_rows(paged.v_pages, paged.block_table[b], seq_len, paged.page_size)
        else:
            seq_len = int(key_lengths[b]) if key_lengths is not None else T_k
            keys, values = k[b, :, :seq_len].transpose(1, 0, 2), v[b, :, :seq_len].transpose(1, 0, 2)
        out[b], weights[b] = attend(q[b], keys, values, T_k, scale, alignment, window)
    return out, weights


if __name__ == "__main__":
    attncheck_plugin.serve(attention, name="numpy-paged",
                           description="numpy paged attention in vLLM's token-major layout, GQA, padding, window",
                           dtypes=("float32", "float64", "float16", "bfloat16"), returns_weights=True,
                           alignments=("top-left", "bottom-right"), nonfinite_safe=True, gqa=True, empty_rows="zero",
                           paged=True, page_sizes=(1, 8, 16, 32), page_layouts=("token-major",), v_head_dim=True)
