"""PyTorch's own attention (torch 1.13, CPU), with grouped-query heads (repeat_interleave, then the call) and
key padding and a sliding window as a boolean attn_mask, checked by attncheck through the Python client:
    attncheck check --impl exec:'/usr/bin/python3 examples/python/torch_attention.py'
(Debian: apt-get install python3-torch). serve(..., framework="torch") hands it torch tensors of each case's dtype."""
import os

import torch
import torch.nn.functional as F

import attncheck_plugin

# float32 and float64 only. torch 1.13's CPU bfloat16 matmul accumulates in bfloat16 (a sum of 1000 ones is
# 256), so its bfloat16 attention exceeds the error any float-accumulating kernel has: attncheck falsifies
# convex-hull and oracle-agreement there (ctest example.torch.bfloat16_accumulation). Declaring bfloat16 is
# one flag away: ATTNCHECK_TORCH_BF16=1.
DTYPES = ("float32", "float64") + (("bfloat16",) if os.environ.get("ATTNCHECK_TORCH_BF16") == "1" else ())


def attn_mask(B, T_q, T_k, key_lengths, window):
    """[B,1,T_q,T_k] booleans, True where query i may see key j (torch's convention): causal top-left (j <= i),
    inside the window (j >= i - window) and not padding (j < key_lengths[b], an int64 tensor)."""
    i = torch.arange(T_q)[:, None]
    j = torch.arange(T_k)[None, :]
    seen = j <= i
    if window is not None:
        seen = seen & (j >= i - window)
    seen = seen.expand(B, T_q, T_k)
    if key_lengths is not None:
        seen = seen & (j[None] < key_lengths[:, None, None])
    return seen[:, None]


def attention(q, k, v, key_lengths=None, window=None):
    """torch's fused scaled-dot-product attention (top-left; scale fixed at 1/sqrt(D)): is_causal, or with
    padding or a window the whole mask as attn_mask. q, k, v come as torch tensors of the case's dtype
    (framework="torch"), and the output goes back as it is. A query that sees no key gets NaN (softmax of a
    row of -inf), declared below as the `nan` convention."""
    group = q.shape[1] // k.shape[1]  # query head h reads kv head h // group: repeat_interleave's order
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    if key_lengths is None and window is None:
        out, _ = F._scaled_dot_product_attention(q, k, v, is_causal=True)
    else:
        mask = attn_mask(q.shape[0], q.shape[2], k.shape[2], key_lengths, window).expand(-1, q.shape[1], -1, -1)
        out, _ = F._scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return out


if __name__ == "__main__":
    torch.set_num_threads(1)  # one worker per law run; the harness machine's cores are shared
    attncheck_plugin.serve(attention, name="torch-sdpa", description="torch %s _scaled_dot_product_attention"
                           % torch.__version__, dtypes=DTYPES, gqa=True, empty_rows="nan", framework="torch")
