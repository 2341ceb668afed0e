"""PyTorch's own attention (torch 1.13, CPU), checked by attncheck through the Python client:
    attncheck check --impl exec:'/usr/bin/python3 examples/python/torch_attention.py'
(with harness/python on PYTHONPATH; Debian: apt-get install python3-torch)."""
import os

import torch
import torch.nn.functional as F

import attncheck_plugin

# float32 and float64 only. torch 1.13's CPU bfloat16 matmul accumulates in bfloat16 (a sum of 1000 ones is
# 256), so its bfloat16 attention exceeds the error any float-accumulating kernel has: attncheck falsifies
# convex-hull and oracle-agreement there (ctest example.torch.bfloat16_accumulation). Declaring bfloat16 is
# one flag away: ATTNCHECK_TORCH_BF16=1.
TORCH_DTYPES = {"float32": torch.float32, "float64": torch.float64}
if os.environ.get("ATTNCHECK_TORCH_BF16") == "1":
    TORCH_DTYPES["bfloat16"] = torch.bfloat16


def attention(q, k, v, dtype):
    """torch's fused scaled-dot-product attention with is_causal (top-left; scale fixed at 1/sqrt(D))."""
    q, k, v = (torch.from_numpy(x).to(TORCH_DTYPES[dtype]) for x in (q, k, v))
    out, _ = F._scaled_dot_product_attention(q, k, v, is_causal=True)
    return out.to(torch.float64).numpy()  # exact: every bfloat16/float32 value is a float64


if __name__ == "__main__":
    torch.set_num_threads(1)  # one worker per law run; the harness machine's cores are shared
    attncheck_plugin.serve(attention, name="torch-sdpa", description="torch %s _scaled_dot_product_attention"
                           % torch.__version__, dtypes=tuple(TORCH_DTYPES))
