"""Causal attention in numpy, checked by attncheck through the Python client:
    attncheck check --impl exec:'/usr/bin/python3 examples/python/numpy_attention.py'
(with harness/python on PYTHONPATH)."""
import numpy as np

import attncheck_plugin


def attention(q, k, v, scale=None, alignment="top-left"):
    """q [B,H,T_q,D], k and v [B,H,T_k,D] -> output [B,H,T_q,D], weights [B,H,T_q,T_k], in float64."""
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    T_q, T_k, D = q.shape[2], k.shape[2], q.shape[3]
    shift = T_k - T_q if alignment == "bottom-right" else 0
    visible = np.arange(T_k)[None, :] <= np.arange(T_q)[:, None] + shift  # [T_q,T_k]
    with np.errstate(all="ignore"):  # NaN/Inf in future keys are masked by the select below, not warned about
        scores = np.where(visible, q @ k.swapaxes(-1, -2) * (scale or 1 / np.sqrt(D)), -np.inf)
        top = scores.max(axis=-1, keepdims=True)
        e = np.where(visible, np.exp(scores - np.where(np.isfinite(top), top, 0)), 0.0)
        total = e.sum(axis=-1, keepdims=True)
        weights = np.divide(e, total, out=np.zeros_like(e), where=total > 0)
    # Row by row over the visible keys only: 0 * Inf in a future value would otherwise be NaN.
    out = np.zeros(q.shape)
    for i in range(T_q):
        n = max(0, min(T_k, i + shift + 1))
        out[:, :, i, :] = np.einsum("bhj,bhjd->bhd", weights[:, :, i, :n], v[:, :, :n, :])
    return out, weights


if __name__ == "__main__":
    attncheck_plugin.serve(attention, name="numpy-example", description="numpy causal attention in float64",
                           dtypes=("float32", "float64", "float16", "bfloat16"), returns_weights=True,
                           alignments=("top-left", "bottom-right"), nonfinite_safe=True)
