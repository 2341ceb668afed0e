"""check_bench's BM_two_dtypes: one small causal attention, served at float32 and float64 in numpy or in torch
(argv[1]), so that a 2-dtype check of each costs what the pytest fixture's does (one attncheck run, one server,
torch's import included) and the two compare."""
import sys

import attncheck_plugin

FRAMEWORK = sys.argv[1]

if FRAMEWORK == "torch":
    import torch

    def attention(q, k, v, scale=None):  # torch tensors of the case's dtype
        s = (q @ k.transpose(-1, -2)) * (scale or q.shape[-1] ** -0.5)
        causal = torch.ones(s.shape[-2:], dtype=torch.bool).tril()
        return torch.softmax(s.masked_fill(~causal, float("-inf")), -1) @ v
else:
    import numpy as np

    def attention(q, k, v, scale=None):  # numpy arrays
        s = (q @ k.swapaxes(-1, -2)) * (scale or q.shape[-1] ** -0.5)
        s = np.where(np.tril(np.ones(s.shape[-2:], dtype=bool)), s, -np.inf)
        w = np.exp(s - s.max(-1, keepdims=True))
        return (w / w.sum(-1, keepdims=True)) @ v

attncheck_plugin.serve(attention, name=FRAMEWORK + "-attention", dtypes=("float32", "float64"), framework=FRAMEWORK)
