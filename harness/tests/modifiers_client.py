"""A child for the exec: tests that declares protocol version 3's modifiers and the LSE (numpy, float64): softcap,
ALiBi, sinks (with d_sinks in the backward) and causal = False, and version 4's additive bias (with d_bias) and
per-query temperatures, rotary embeddings, QK-norm and dropout (a mask from numpy's Philox under the seed, its counter
at the offset, drawn over [B,H,T_q,T_k] in order, so a batch entry's mask does not depend on those after it), and
quantised K and V caches in every format and granularity (dequantised with the client's QuantizedKV.dequantize()). `dict`
as the first argument returns a dict
instead of a tuple; `strict` raises when it gets a modifier keyword it did not declare (it declares only the LSE
and sinks then), so a test can see that nothing undeclared is passed."""
import sys

import numpy as np

import attncheck_plugin

MODE = sys.argv[1] if len(sys.argv) > 1 else ""


def rotate(x, rope, positions, back=False):
    """x [B, H, T, D] with each token's pairs below rope.rotary_dim rotated by its position (by minus it: back)."""
    return rope.apply(x, positions, inverse=back)


def normalise(x, norm, w):
    """Rows of x [B, H, T, D] as QK-norm makes them: w * x / r, r = sqrt(mean x^2 + eps) or sqrt(mean x^2) + eps."""
    ms = (x.astype(np.float64) ** 2).mean(axis=-1, keepdims=True)
    r = np.sqrt(ms) + norm.eps if norm.eps_outside else np.sqrt(ms + norm.eps)
    return x.astype(np.float64) / r * w


def normalise_back(g, x, norm, w):
    """The gradient of x from that of its normalised rows: w g / r - x (sum w g x) / (D s r^2)."""
    x = x.astype(np.float64)
    D = x.shape[-1]
    ms = (x ** 2).mean(axis=-1, keepdims=True)
    s = np.sqrt(ms) if norm.eps_outside else np.sqrt(ms + norm.eps)
    r = s + norm.eps if norm.eps_outside else s
    second = np.divide((w * g * x).sum(axis=-1, keepdims=True), D * s * r * r, out=np.zeros_like(s), where=s > 0)
    return w * g / r - x * second  # a zero row with eps outside the root (s = 0): the second term is 0


def parts(q, k, v, scale, alignment, key_lengths, softcap, alibi_slopes, sinks, causal, bias=None, temperature=None,
          rope=None, qk_norm=None):
    """Everything the forward and backward need, float64: K and V repeated over each group, the raw scaled scores
    S, dZ/dS, the visibility, the weights P [B,H,T_q,T_k], the sink's share [B,H,T_q,1] and the LSE."""
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    if qk_norm is not None:  # version 4: the rows normalised first
        q = q if qk_norm.q_weight is None else normalise(q, qk_norm, qk_norm.q_weight)
        k = k if qk_norm.k_weight is None else normalise(k, qk_norm, qk_norm.k_weight)
    if rope is not None:  # version 4: q and k rotated by their tokens' positions first
        q, k = rotate(q, rope, rope.q_positions), rotate(k, rope, rope.k_positions)
    B, H, T_q, D = q.shape
    T_k = k.shape[2]
    k, v = np.repeat(k, H // k.shape[1], axis=1), np.repeat(v, H // k.shape[1], axis=1)
    pos = np.arange(T_q)[:, None] + (T_k - T_q if alignment == "bottom-right" else 0)
    j = np.arange(T_k)[None, :]
    vis = np.broadcast_to(j <= pos if causal else np.ones((T_q, T_k), bool), (B, T_q, T_k))
    if key_lengths is not None:
        vis = vis & (j[None] < np.asarray(key_lengths)[:, None, None])
    vis = vis[:, None]
    s = q @ k.swapaxes(-1, -2) * (scale or 1 / np.sqrt(D))
    z, dz_ds = s, np.ones_like(s)
    if temperature is not None:  # [B or 1, H or 1, T_q]: each query's scores divided by its own
        tau = temperature.astype(np.float64)[..., None]
        z, dz_ds = s / tau, np.broadcast_to(1 / tau, s.shape)
    if softcap is not None:
        z, dz_ds = softcap * np.tanh(z / softcap), dz_ds * (1 - np.tanh(z / softcap) ** 2)
    if alibi_slopes is not None:
        z = z + alibi_slopes[:, None, None] * (j - pos)
    if bias is not None:  # [B or 1, H or 1, T_q, T_k]: numpy broadcasts an extent of 1
        z = z + bias.astype(np.float64)
    z = np.where(vis, z, -np.inf)
    sink = np.broadcast_to((sinks if sinks is not None else np.full(H, -np.inf))[None, :, None, None], (B, H, T_q, 1))
    top = np.maximum(z.max(axis=-1, keepdims=True), sink)
    top = np.where(np.isfinite(top), top, 0)
    e, e_sink = np.where(vis, np.exp(z - top), 0.0), np.exp(sink - top)
    total = e.sum(axis=-1, keepdims=True) + e_sink
    p = np.divide(e, total, out=np.zeros_like(e), where=total > 0)
    p_sink = np.divide(e_sink, total, out=np.zeros_like(e_sink), where=total > 0)
    with np.errstate(divide="ignore"):
        lse = np.where(total > 0, top + np.log(total), -np.inf)
    return q, k, v, s, dz_ds, vis, p, p_sink, lse


def strict_attention(q, k, v, scale=None, alignment="top-left", key_lengths=None, sinks=None, **undeclared):
    """Declares the LSE and sinks only: any other keyword would land in `undeclared`."""
    if undeclared:
        raise ValueError("got undeclared keywords %s" % sorted(undeclared))
    return attention(q, k, v, scale=scale, alignment=alignment, key_lengths=key_lengths, sinks=sinks)


def keep(dropout, shape):
    """What each weight is multiplied by under dropout: 1/(1 - p) where kept, 0 where dropped (1 without)."""
    if dropout is None:
        return 1.0
    u = np.random.Generator(np.random.Philox(key=dropout.seed, counter=dropout.offset)).random(shape)
    return np.where(u >= dropout.p, 1 / (1 - dropout.p), 0.0)


def attention(q, k, v, scale=None, alignment="top-left", key_lengths=None, softcap=None, alibi_slopes=None,
              sinks=None, causal=True, bias=None, temperature=None, rope=None, qk_norm=None, dropout=None, quant=None):
    if quant is not None:  # k and v come as codes and scales (and q too, where it is quantised)
        k, v = quant.dequantize()
        if quant.q is not None:
            q = quant.q.dequantize()
    _, _, v, _, _, _, p, _, lse = parts(q, k, v, scale, alignment, key_lengths, softcap, alibi_slopes, sinks, causal,
                                        bias, temperature, rope, qk_norm)
    p = p * keep(dropout, p.shape)  # the dropped weights (the LSE stays the softmax's)
    out = p @ v
    if MODE == "dict":
        return {"output": out, "weights": p, "lse": lse[..., 0]}  # lse [B,H,T_q]: the client adds the 1
    return out, p, lse


def backward(q, k, v, d_output, scale=None, alignment="top-left", key_lengths=None, softcap=None, alibi_slopes=None,
             sinks=None, causal=True, bias=None, temperature=None, rope=None, qk_norm=None, dropout=None):
    """dP = dO Vᵀ, Δ = rowsum(P ∘ dP), dZ = P ∘ (dP − Δ), dS = dZ ∘ dZ/dS; dQ = scale·dS K, dK = scale·dSᵀ Q,
    dV = Pᵀ dO, summed over each kv head's group; d_sinks[h] = −Σ_{b,i} P_sink Δ. Under dropout (the forward's mask M,
    drawn again) dP = M ∘ dO Vᵀ and dV = (M ∘ P)ᵀ dO."""
    B, H_kv, T_k, D = k.shape
    scale = scale or 1 / np.sqrt(q.shape[3])
    q_in, k_in = q, k
    q, k, v, s, dz_ds, vis, p, p_sink, _ = parts(q, k, v, scale, alignment, key_lengths, softcap, alibi_slopes,
                                                 sinks, causal, bias, temperature, rope, qk_norm)
    d_o = d_output.astype(np.float64)
    m = keep(dropout, p.shape)
    d_p = np.where(vis, d_o @ v.swapaxes(-1, -2), 0.0) * m
    delta = (p * d_p).sum(axis=-1, keepdims=True)
    d_s = p * (d_p - delta) * dz_ds
    d_q = scale * d_s @ k
    d_k = (scale * d_s.swapaxes(-1, -2) @ q).reshape(B, H_kv, -1, T_k, D).sum(axis=2)
    d_v = ((p * m).swapaxes(-1, -2) @ d_o).reshape(B, H_kv, -1, T_k, D).sum(axis=2)
    d_sinks = -(p_sink * delta).sum(axis=(0, 2, 3))
    if rope is not None:  # the gradients of the rotated q and k turned back by R^T
        d_q, d_k = rotate(d_q, rope, rope.q_positions, back=True), rotate(d_k, rope, rope.k_positions, back=True)
    if qk_norm is not None:  # then through the normalisation
        if qk_norm.q_weight is not None:
            d_q = normalise_back(d_q, q_in, qk_norm, qk_norm.q_weight)
        if qk_norm.k_weight is not None:
            d_k = normalise_back(d_k, k_in, qk_norm, qk_norm.k_weight)
    d_bias = None
    if bias is not None:  # dZ, summed over the axes the bias broadcasts over
        d_z = p * (d_p - delta)
        d_bias = d_z.sum(axis=tuple(a for a in (0, 1) if bias.shape[a] == 1), keepdims=True)
    return (d_q, d_k, d_v) + ((d_sinks,) if sinks is not None else ()) + ((d_bias,) if bias is not None else ())


if __name__ == "__main__":
    declared = dict(lse=True, sinks=True) if MODE == "strict" else dict(
        lse=True, sinks=True, softcap=True, alibi=True, bidirectional=True, bias=True, bias_grad=True,
        temperature=True, rope=True, rope_interleaved=True, qk_norm=True, qk_norm_eps_outside=True, dropout=True,
        rope_ntk=True, rope_llama3=True, kv_e4m3fn=True, kv_e5m2=True, kv_int8=True, kv_scale_per_head=True,
        kv_scale_per_token=True, kv_zero_points=True, kv_ggml_q8_0=True, kv_ggml_q4_0=True, kv_ggml_q4_1=True,
        kv_ggml_q5_0=True, kv_ggml_q5_1=True, q_quant=True)
    attncheck_plugin.serve(strict_attention if MODE == "strict" else attention, name="modifiers-client", description="numpy, every version-3 modifier",
                           dtypes=("float64",), returns_weights=True, alignments=("top-left", "bottom-right"),
                           gqa=True, key_lengths=True, backward=None if MODE == "strict" else backward,
                           empty_rows="zero", **declared)
