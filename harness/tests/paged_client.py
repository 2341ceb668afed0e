"""A child for the exec: tests that declares paged K and V (protocol version 3), both layouts, pages of 1, 2, 8 and
16 keys, with grouped-query heads, key padding, a window and weights, in float64. A paged call is checked for
what PROTOCOL.md promises (k and v None, the pools in the layout's shape, an int32 [B, max_pages] table, int64
sequence lengths equal to key_lengths, a declared page size and layout), and raises otherwise, so that the
test sees the message; then the pools are read back through the table with PagedKV.gather() and attended to
densely. It declares quantised caches in paged pools too (e4m3fn, int8 with zero points, ggml's q4_1; per tensor, kv
head and token): such a call's pools are quant.k.codes and quant.v.codes, and paged.gather(*quant.dequantize()) gives
the dense float64 k and v. `head-major` as the first argument declares the head-major layout only."""
import sys

import numpy as np

import attncheck_plugin

LAYOUTS = ("head-major",) if sys.argv[1:] == ["head-major"] else ("token-major", "head-major")
PAGE_SIZES = (1, 2, 8, 16)


def check_paged(q, k, v, key_lengths, paged):
    B, D = q.shape[0], q.shape[3]
    problems = []
    if k is not None or v is not None:
        problems.append("k and v are not None")
    if paged.layout not in LAYOUTS or paged.page_size not in PAGE_SIZES:
        problems.append("undeclared layout %s or page size %d" % (paged.layout, paged.page_size))
    H_kv = paged.k_pages.shape[2] if paged.layout == "token-major" else paged.k_pages.shape[1]
    shape = ((paged.num_pages, paged.page_size, H_kv, D) if paged.layout == "token-major"
             else (paged.num_pages, H_kv, paged.page_size, D))
    if paged.k_pages.dtype == np.uint8 and len(paged.k_pages.shape) == 5:  # ggml's blocks: D/32 of them a row
        shape = shape[:3] + (D // 32, paged.k_pages.shape[4])
    if paged.k_pages.shape != shape or paged.v_pages.shape != shape:
        problems.append("pools %s, %s (expected %s)" % (paged.k_pages.shape, paged.v_pages.shape, shape))
    if paged.block_table.dtype != np.int32 or paged.block_table.shape != (B, paged.max_pages):
        problems.append("table %s %s" % (paged.block_table.dtype, paged.block_table.shape))
    if paged.seq_lens.dtype != np.int64 or paged.seq_lens.shape != (B,) or key_lengths is None \
            or not np.array_equal(key_lengths, paged.seq_lens) or np.any(paged.seq_lens > paged.T_k):
        problems.append("seq_lens %r, key_lengths %r, T_k %d" % (paged.seq_lens, key_lengths, paged.T_k))
    if problems:
        raise ValueError("paged call: " + "; ".join(problems))


def attention(q, k, v, scale=None, alignment="top-left", key_lengths=None, window=None, paged=None, quant=None):
    if paged is not None:
        check_paged(q, k, v, key_lengths, paged)
        if quant is not None:  # the pools are the codes'; their scales over the pools' axes
            if paged.k_pages is not quant.k.codes or paged.v_pages is not quant.v.codes:
                raise ValueError("paged quantised call: the pools are not quant's codes")
            k, v = paged.gather(*quant.dequantize())
        else:
            k, v = paged.gather()
    elif quant is not None:
        k, v = quant.dequantize()
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    B, H, T_q, D = q.shape
    T_k = k.shape[2]
    k, v = np.repeat(k, H // k.shape[1], axis=1), np.repeat(v, H // k.shape[1], axis=1)
    pos = np.arange(T_q)[:, None] + (T_k - T_q if alignment == "bottom-right" else 0)
    j = np.arange(T_k)[None, :]
    seen = (j <= pos) & ((j >= pos - window) if window is not None else True)
    seen = np.broadcast_to(seen, (B, T_q, T_k))
    if key_lengths is not None:
        seen = seen & (j[None] < np.asarray(key_lengths)[:, None, None])
    seen = seen[:, None]
    with np.errstate(all="ignore"):
        s = np.where(seen, q @ k.swapaxes(-1, -2) * (scale or 1 / np.sqrt(D)), -np.inf)
        top = s.max(axis=-1, keepdims=True)
        e = np.where(seen, np.exp(s - np.where(np.isfinite(top), top, 0)), 0.0)
    total = e.sum(axis=-1, keepdims=True)
    w = np.divide(e, total, out=np.zeros_like(e), where=total > 0)
    out = np.einsum("bhij,bhjd->bhid", w, np.where(np.isfinite(v), v, 0.0))
    return out, w


if __name__ == "__main__":
    attncheck_plugin.serve(attention, name="paged-client", dtypes=("float64", "float32", "bfloat16"),
                           returns_weights=True, alignments=("top-left", "bottom-right"), gqa=True,
                           empty_rows="zero", paged=True, page_sizes=PAGE_SIZES, page_layouts=LAYOUTS,
                           kv_e4m3fn=True, kv_int8=True, kv_zero_points=True, kv_ggml_q4_1=True,
                           kv_scale_per_head=True, kv_scale_per_token=True, paged_quant=True)
