"""PyTorch 1.13 autograd as the backward pass (CPU), checked by attncheck's forward and gradient laws:
    attncheck check --impl exec:'/usr/bin/python3 examples/python/torch_autograd.py' --dtype float64
    ATTNCHECK_TORCH_PATH=manual attncheck check --impl exec:'/usr/bin/python3 examples/python/torch_autograd.py'
(with harness/python on PYTHONPATH). The default path differentiates torch's own
F._scaled_dot_product_attention(is_causal=True) (top-left, scale 1/sqrt(D)); `manual` differentiates a
plain implementation (matmul, masked_fill, softmax) that honours a custom scale, both alignments, grouped
kv heads, key padding and a window. float32 and float64."""
import os

import numpy as np
import torch
import torch.nn.functional as F

import attncheck_plugin

TORCH_DTYPES = {"float32": torch.float32, "float64": torch.float64}
PATH = os.environ.get("ATTNCHECK_TORCH_PATH", "sdpa")


def sdpa(q, k, v, **_):
    out, _ = F._scaled_dot_product_attention(q, k, v, is_causal=True)
    return out


def manual(q, k, v, scale=None, alignment="top-left", key_lengths=None, window=None):
    B, H, T_q, D = q.shape
    H_kv, T_k = k.shape[1], k.shape[2]
    k, v = k.repeat_interleave(H // H_kv, dim=1), v.repeat_interleave(H // H_kv, dim=1)
    pos = torch.arange(T_q)[:, None] + (T_k - T_q if alignment == "bottom-right" else 0)
    j = torch.arange(T_k)[None, :]
    vis = (j <= pos).expand(B, T_q, T_k)
    if window is not None:
        vis = vis & (j >= pos - window)
    if key_lengths is not None:
        vis = vis & (j[None] < torch.from_numpy(np.asarray(key_lengths))[:, None, None])
    vis = vis[:, None]
    scores = (q @ k.transpose(-1, -2)) * (scale or D ** -0.5)
    # A row that sees no key: softmax of an all -inf row is NaN (and so is its gradient), so such rows get scores
    # 0 and are multiplied by 0 afterwards: zero weights, zero output, zero gradient.
    sees = vis.any(dim=-1, keepdim=True)
    z = scores.masked_fill(~vis, float("-inf")).masked_fill(~sees, 0.0)
    return (torch.softmax(z, dim=-1) * sees) @ v


def tensors(dtype, *arrays):
    return [torch.from_numpy(np.ascontiguousarray(a)).to(TORCH_DTYPES[dtype]) for a in arrays]


if PATH == "sdpa":
    def attention(q, k, v, dtype):
        with torch.no_grad():
            return sdpa(*tensors(dtype, q, k, v)).to(torch.float64).numpy()

    def backward(q, k, v, d_output, dtype):
        q, k, v, d_o = tensors(dtype, q, k, v, d_output)
        q, k, v = (x.requires_grad_() for x in (q, k, v))
        sdpa(q, k, v).backward(d_o)
        return tuple(x.grad.to(torch.float64).numpy() for x in (q, k, v))
else:
    def attention(q, k, v, dtype, scale=None, alignment="top-left", key_lengths=None, window=None):
        with torch.no_grad():
            return manual(*tensors(dtype, q, k, v), scale=scale, alignment=alignment, key_lengths=key_lengths,
                          window=window).to(torch.float64).numpy()

    def backward(q, k, v, d_output, dtype, scale=None, alignment="top-left", key_lengths=None, window=None):
        q, k, v, d_o = tensors(dtype, q, k, v, d_output)
        q, k, v = (x.requires_grad_() for x in (q, k, v))
        manual(q, k, v, scale=scale, alignment=alignment, key_lengths=key_lengths, window=window).backward(d_o)
        return tuple(x.grad.to(torch.float64).numpy() for x in (q, k, v))


if __name__ == "__main__":
    torch.set_num_threads(1)  # one worker per law run; the harness machine's cores are shared
    manual_path = PATH != "sdpa"
    attncheck_plugin.serve(attention, name="torch-autograd-" + PATH,
                           description="torch %s autograd through %s" % (
                               torch.__version__, "a manual implementation" if manual_path
                               else "_scaled_dot_product_attention"),
                           dtypes=tuple(TORCH_DTYPES),
                           alignments=("top-left", "bottom-right") if manual_path else ("top-left",),
                           gqa=manual_path, backward=backward, empty_rows="zero")
