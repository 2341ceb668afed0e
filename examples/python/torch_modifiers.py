"""PyTorch 1.13 (CPU) attention with ABI 3's score modifiers, written out by hand: logit softcapping (Gemma 2),
ALiBi, attention sinks (gpt-oss), causal or bidirectional, and each row's log-sum-exp; autograd is the backward,
the sinks' gradient included. It declares them all, so attncheck draws them:
    attncheck check --impl exec:'/usr/bin/python3 examples/python/torch_modifiers.py' --dtype float64
(Debian: apt-get install python3-torch). float32 and float64."""
import numpy as np
import torch

import attncheck_plugin

TORCH_DTYPES = {"float32": torch.float32, "float64": torch.float64}


def visible(B, T_q, T_k, alignment, key_lengths, window, causal):
    """[B,1,T_q,T_k] booleans (query i sees key j) and the ALiBi distances j - p [T_q,T_k], p the aligned
    position of query i (i top-left, i + T_k - T_q bottom-right): j <= p unless not causal, j >= p - window,
    j < key_lengths[b]."""
    pos = torch.arange(T_q)[:, None] + (T_k - T_q if alignment == "bottom-right" else 0)
    j = torch.arange(T_k)[None, :]
    vis = j <= pos if causal else torch.ones(T_q, T_k, dtype=torch.bool)
    if window is not None:
        vis = vis & (j >= pos - window)
    vis = vis.expand(B, T_q, T_k)
    if key_lengths is not None:
        vis = vis & (j[None] < torch.from_numpy(np.asarray(key_lengths))[:, None, None])
    return vis[:, None], j - pos


def attend(q, k, v, sinks, scale=None, alignment="top-left", key_lengths=None, window=None, softcap=None,
           alibi_slopes=None, causal=True):
    """(output [B,H,T_q,D], weights [B,H,T_q,T_k], lse [B,H,T_q]) in the order attncheck/plugin.h gives:
    s = scale·q·k, softcap, ALiBi, the mask, then the sink as one more softmax column that has no value."""
    B, H, T_q, D = q.shape
    H_kv, T_k = k.shape[1], k.shape[2]
    k, v = k.repeat_interleave(H // H_kv, dim=1), v.repeat_interleave(H // H_kv, dim=1)
    vis, dist = visible(B, T_q, T_k, alignment, key_lengths, window, causal)
    s = (q @ k.transpose(-1, -2)) * (scale or D ** -0.5)
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    if alibi_slopes is not None:
        s = s + torch.from_numpy(alibi_slopes).to(s.dtype)[:, None, None] * dist.to(s.dtype)
    s = s.masked_fill(~vis, float("-inf"))
    sink = sinks if sinks is not None else torch.full((H,), float("-inf"), dtype=s.dtype)
    z = torch.cat([s, sink[None, :, None, None].expand(B, H, T_q, 1)], dim=-1)
    # A row with no visible key and no sink: softmax of all -inf is NaN (and so is its gradient), so such rows
    # get logits 0 and are multiplied by 0 afterwards: zero weights, zero output, zero gradient, LSE -inf.
    alive = (z > float("-inf")).any(dim=-1, keepdim=True)
    z = z.masked_fill(~alive, 0.0)
    w = (torch.softmax(z, dim=-1) * alive)[..., :T_k]
    lse = torch.logsumexp(z, dim=-1).masked_fill(~alive[..., 0], float("-inf"))
    return w @ v, w, lse


def tensors(dtype, *arrays):
    return [torch.from_numpy(np.ascontiguousarray(a)).to(TORCH_DTYPES[dtype]) for a in arrays]


def sink_tensor(sinks, dtype, grad=False):
    return None if sinks is None else torch.from_numpy(np.asarray(sinks)).to(TORCH_DTYPES[dtype]).requires_grad_(grad)


def attention(q, k, v, dtype, sinks=None, **options):
    """-> (output, weights, lse), float64 arrays (exact: every float32 is a float64)."""
    with torch.no_grad():
        parts = attend(*tensors(dtype, q, k, v), sink_tensor(sinks, dtype), **options)
    return tuple(x.to(torch.float64).numpy() for x in parts)


def backward(q, k, v, d_output, dtype, sinks=None, **options):
    """-> (dq, dk, dv, d_sinks) by autograd of sum(output * d_output); d_sinks only when the call has sinks."""
    q, k, v, d_o = tensors(dtype, q, k, v, d_output)
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    sink = sink_tensor(sinks, dtype, grad=True)
    attend(q, k, v, sink, **options)[0].backward(d_o)
    grads = tuple(x.grad.to(torch.float64).numpy() for x in (q, k, v))
    return grads + ((sink.grad.to(torch.float64).numpy(),) if sink is not None else ())


# The keywords attncheck passes (the client reads them off the signatures, so they are spelled out).
def attention_entry(q, k, v, dtype, scale=None, alignment="top-left", key_lengths=None, window=None,
                    softcap=None, alibi_slopes=None, sinks=None, causal=True):
    return attention(q, k, v, dtype, sinks=sinks, scale=scale, alignment=alignment, key_lengths=key_lengths,
                     window=window, softcap=softcap, alibi_slopes=alibi_slopes, causal=causal)


def backward_entry(q, k, v, d_output, dtype, scale=None, alignment="top-left", key_lengths=None, window=None,
                   softcap=None, alibi_slopes=None, sinks=None, causal=True):
    return backward(q, k, v, d_output, dtype, sinks=sinks, scale=scale, alignment=alignment,
                    key_lengths=key_lengths, window=window, softcap=softcap, alibi_slopes=alibi_slopes, causal=causal)


if __name__ == "__main__":
    torch.set_num_threads(1)  # one worker per law run; the harness machine's cores are shared
    attncheck_plugin.serve(attention_entry, name="torch-modifiers",
                           description="torch %s by hand: softcap, ALiBi, sinks, bidirectional, LSE; autograd"
                           % torch.__version__, dtypes=tuple(TORCH_DTYPES), returns_weights=True,
                           alignments=("top-left", "bottom-right"), gqa=True, backward=backward_entry,
                           empty_rows="zero", lse=True, sinks=True, softcap=True, alibi=True, bidirectional=True)
