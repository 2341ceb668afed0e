"""A child for the exec: tests that declares protocol version 3's limits: only D in {2, 4}, only T_q <= T_k, and
rows that see no key unspecified (it fills them with 7). Outside what it declares it fails loudly, so a law
that sends it such a call is falsified: the test asserts that none does."""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "python"))
import attncheck_plugin  # noqa: E402
import numpy_attention  # noqa: E402


def attention(q, k, v, scale=None, alignment="top-left", key_lengths=None):
    if q.shape[3] not in (2, 4) or q.shape[2] > k.shape[2]:
        raise ValueError("undeclared call: D = %d, T_q = %d, T_k = %d" % (q.shape[3], q.shape[2], k.shape[2]))
    out, w = numpy_attention.attention(q, k, v, scale=scale, alignment=alignment, key_lengths=key_lengths)
    empty = ~numpy_attention.visible(q, k, alignment, key_lengths, None).any(axis=3)  # [B,1,T_q]
    out = np.where(empty[..., None], 7.0, out)
    w = np.where(empty[..., None], 7.0, w)
    return out, w


if __name__ == "__main__":
    attncheck_plugin.serve(attention, name="declared-client", description="D in {2, 4}, T_q <= T_k, empty rows any",
                           returns_weights=True, alignments=("top-left", "bottom-right"),
                           cross_lengths="T_q<=T_k", head_dims=[2, 4], empty_rows="any")
