"""Causal attention and its backward pass in numpy (float64), with grouped-query heads, key padding and a
sliding window, checked by attncheck's forward and gradient laws through the Python client:
    attncheck check --impl exec:'/usr/bin/python3 examples/python/numpy_backward.py'
(with harness/python on PYTHONPATH)."""
import numpy as np

import attncheck_plugin


def visible(B, T_q, T_k, alignment, key_lengths, window):
    """[B,1,T_q,T_k] booleans: query i (at position p = i, or i + T_k - T_q bottom-right) sees key j when
    p - window <= j <= p and j < key_lengths[b]."""
    pos = np.arange(T_q)[:, None] + (T_k - T_q if alignment == "bottom-right" else 0)
    j = np.arange(T_k)[None, :]
    vis = j <= pos
    if window is not None:
        vis = vis & (j >= pos - window)
    vis = np.broadcast_to(vis, (B, T_q, T_k))
    if key_lengths is not None:
        vis = vis & (j[None] < np.asarray(key_lengths)[:, None, None])
    return vis[:, None]


def weights_of(q, k, scale, vis):
    """Softmax over the visible keys; a row that sees no key gets zero weights."""
    with np.errstate(all="ignore"):  # huge future keys may overflow a score that the select then drops
        scores = np.where(vis, q @ k.swapaxes(-1, -2) * scale, -np.inf)
        top = scores.max(axis=-1, keepdims=True)
        e = np.where(vis, np.exp(scores - np.where(np.isfinite(top), top, 0)), 0.0)
    total = e.sum(axis=-1, keepdims=True)
    return np.divide(e, total, out=np.zeros_like(e), where=total > 0)


def prepare(q, k, v, scale, alignment, key_lengths, window):
    """Inputs in float64 with K and V repeated over each kv head's group, the scale and the visibility."""
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    scale = scale or 1 / np.sqrt(q.shape[3])
    return q, k, v, scale, visible(q.shape[0], q.shape[2], k.shape[2], alignment, key_lengths, window)


def attention(q, k, v, scale=None, alignment="top-left", key_lengths=None, window=None):
    """q [B,H,T_q,D], k and v [B,H_kv,T_k,D] -> output [B,H,T_q,D], weights [B,H,T_q,T_k]."""
    q, k, v, scale, vis = prepare(q, k, v, scale, alignment, key_lengths, window)
    w = weights_of(q, k, scale, vis)
    return w @ v, w


def backward(q, k, v, d_output, scale=None, alignment="top-left", key_lengths=None, window=None):
    """dQ [B,H,T_q,D], dK and dV [B,H_kv,T_k,D] (a shared kv head's gradient sums over its group)."""
    B, H_kv, T_k, D = k.shape
    q, k, v, scale, vis = prepare(q, k, v, scale, alignment, key_lengths, window)
    d_output = d_output.astype(np.float64)
    w = weights_of(q, k, scale, vis)                       # P [B,H,T_q,T_k]
    dv = w.swapaxes(-1, -2) @ d_output                     # Pᵀ dO
    dp = d_output @ v.swapaxes(-1, -2)                     # dO Vᵀ
    ds = w * (dp - (w * dp).sum(axis=-1, keepdims=True))   # P ∘ (dP - Δ), Δ = rowsum(P ∘ dP) = rowsum(dO ∘ O)
    dq = scale * ds @ k
    dk = scale * ds.swapaxes(-1, -2) @ q

    def fold(g):  # the sum over each kv head's group of query heads
        return g.reshape(B, H_kv, -1, T_k, D).sum(axis=2)

    return dq, fold(dk), fold(dv)


if __name__ == "__main__":
    attncheck_plugin.serve(attention, name="numpy-backward", description="numpy causal attention and backward in float64",
                           dtypes=("float32", "float64"), returns_weights=True,
                           alignments=("top-left", "bottom-right"), gqa=True, backward=backward, empty_rows="zero")
