"""Causal attention in numpy, with grouped-query heads, key padding, a sliding window and a backward pass,
checked by attncheck through the Python client:
    attncheck check --impl exec:'/usr/bin/python3 examples/python/numpy_attention.py'
(with harness/python on PYTHONPATH). It declares strided inputs (strided=True): numpy reads any strides, so it also
gets q, k and v as views padded, [B,T,H,D], broadcast over kv heads, interleaved or as one array (layout-invariance)."""
import numpy as np

import attncheck_plugin


def visible(q, k, alignment, key_lengths, window):
    """[B,1,T_q,T_k] booleans: query i sees key j. With aligned position p = i (top-left) or i + T_k - T_q
    (bottom-right), it sees j <= p, j < key_lengths[b] and j >= p - window."""
    B, T_q, T_k = q.shape[0], q.shape[2], k.shape[2]
    p = np.arange(T_q)[:, None] + (T_k - T_q if alignment == "bottom-right" else 0)
    j = np.arange(T_k)[None, :]
    seen = j <= p
    if window is not None:
        seen = seen & (j >= p - window)
    seen = np.broadcast_to(seen, (B, T_q, T_k))
    if key_lengths is not None:
        seen = seen & (j[None] < np.asarray(key_lengths)[:, None, None])
    return seen[:, None]


def grouped(q, k, v):
    """k and v repeated to q's heads: query head h reads kv head h // (H // H_kv) (repeat_interleave)."""
    group = q.shape[1] // k.shape[1]
    return np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)


def weights_of(q, k, seen, scale):
    """Softmax over the keys each query sees; exactly 0 elsewhere, and a row that sees no key is all 0."""
    with np.errstate(all="ignore"):  # NaN/Inf in hidden keys are masked by the select below, not warned about
        scores = np.where(seen, q @ k.swapaxes(-1, -2) * (scale or 1 / np.sqrt(q.shape[3])), -np.inf)
        top = scores.max(axis=-1, keepdims=True)
        e = np.where(seen, np.exp(scores - np.where(np.isfinite(top), top, 0)), 0.0)
        total = e.sum(axis=-1, keepdims=True)
        return np.divide(e, total, out=np.zeros_like(e), where=total > 0)


def rows_times(a, seen, x):
    """out[b,h,i] = sum over the keys j query i sees of a[b,h,i,j] x[b,h,j], row by row: 0 * Inf in a hidden
    key or value would otherwise be NaN."""
    out = np.zeros(a.shape[:3] + x.shape[3:])
    for i in range(a.shape[2]):
        hidden_free = np.where(seen[:, :, i, :, None], x, 0.0)
        out[:, :, i, :] = np.einsum("bhj,bhjd->bhd", a[:, :, i, :], hidden_free)
    return out


def attention(q, k, v, scale=None, alignment="top-left", key_lengths=None, window=None):
    """q [B,H,T_q,D], k [B,H_kv,T_k,D], v [B,H_kv,T_k,D_v] -> output [B,H,T_q,D_v], weights [B,H,T_q,T_k], in
    float64 (D_v may differ from D: v_head_dim=True)."""
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    k, v = grouped(q, k, v)
    seen = visible(q, k, alignment, key_lengths, window)
    w = weights_of(q, k, seen, scale)
    return rows_times(w, seen, v), w


def backward(q, k, v, d_output, scale=None, alignment="top-left", key_lengths=None, window=None):
    """The gradients of sum(output * d_output): with P the weights, dP = dO Vᵀ, Δ = rowsum(P ∘ dP),
    dS = P ∘ (dP − Δ); dQ = scale·dS K, dK = scale·dSᵀ Q, dV = Pᵀ dO, and a kv head sums over its group."""
    B, H_kv, T_k, D = k.shape
    scale = scale or 1 / np.sqrt(q.shape[3])
    q, k, v, d_o = (x.astype(np.float64) for x in (q, k, v, d_output))
    k, v = grouped(q, k, v)
    seen = visible(q, k, alignment, key_lengths, window)
    p = weights_of(q, k, seen, scale)
    with np.errstate(all="ignore"):
        d_p = np.where(seen, d_o @ v.swapaxes(-1, -2), 0.0)
    d_s = p * (d_p - (p * d_p).sum(axis=-1, keepdims=True))
    d_q = scale * rows_times(d_s, seen, k)
    d_k = scale * d_s.swapaxes(-1, -2) @ q
    d_v = p.swapaxes(-1, -2) @ d_o
    # Query heads h*group .. h*group+group-1 share kv head h: their gradients add up.
    return d_q, d_k.reshape(B, H_kv, -1, T_k, D).sum(axis=2), d_v.reshape(B, H_kv, -1, T_k, d_v.shape[3]).sum(axis=2)


if __name__ == "__main__":
    attncheck_plugin.serve(attention, name="numpy-example",
                           description="numpy causal attention in float64, GQA, padding, window, backward",
                           dtypes=("float32", "float64", "float16", "bfloat16"), returns_weights=True,
                           alignments=("top-left", "bottom-right"), nonfinite_safe=True, gqa=True,
                           backward=backward, empty_rows="zero", strided=True, v_head_dim=True)
