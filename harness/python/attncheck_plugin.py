"""Serve a Python attention function to attncheck over its exec: protocol (harness/PROTOCOL.md).

    import attncheck_plugin

    def attention(q, k, v, scale=None):      # numpy arrays: q [B,H,T_q,D], k and v [B,H,T_k,D]
        ...                                  # your code
        return out                           # [B,H,T_q,D] (or (out, weights) with returns_weights=True)

    attncheck_plugin.serve(attention, name="my-attention", dtypes=("float32", "float64"))

then `attncheck check --impl exec:'/usr/bin/python3 my_attention.py'`. The function is called with the
keyword arguments it declares among `scale` (None: use 1/sqrt(D)), `alignment` ("top-left" or
"bottom-right", for T_q != T_k), `dtype` ("float32", "float64", "float16", "bfloat16"), `key_lengths`
(None, or an int64 array [B]: keys j >= key_lengths[b] of batch entry b are padding) and `window` (None, or
an int w: the query at aligned position p sees keys p-w .. p only). Arrays come as float64, float32 or
float16; bfloat16 comes as float32 holding bfloat16 values, and results are rounded back to bfloat16. With
gqa=True, k and v may have fewer heads than q (H_kv dividing H; query head h reads kv head h // (H // H_kv)).
A `backward(q, k, v, d_output, **same keywords) -> (dq, dk, dv)` makes the gradient laws apply. Protocol
version 3's score modifiers are passed only when declared: softcap=True gives `softcap` (None or a float c > 0:
s = c·tanh(s/c) on the scaled score), alibi=True `alibi_slopes` (None or a float64 array [H]: s += slope_h·(j - p)),
sinks=True `sinks` (None or a float64 array [H] of sink logits, -inf meaning none: an extra softmax column with no
value) and bidirectional=True `causal` (True, or False: no causal rule); lse=True means fn also returns each row's
log-sum-exp, (out, lse) or (out, weights, lse) or a dict {"output", "weights", "lse"}, lse [B,H,T_q] or
[B,H,T_q,1]. With sinks=True the backward returns (dq, dk, dv, d_sinks), d_sinks [H]. paged=True (with
page_sizes and page_layouts) gives `paged`: None for a dense call; for a paged call (forward only) k and v are
None and `paged` is a PagedKV: k_pages and v_pages (the pools, [num_pages, page_size, H_kv, D] token-major or
[num_pages, H_kv, page_size, D] head-major), block_table (int32 [B, max_pages]), seq_lens (int64 [B]),
page_size, layout ("token-major" or "head-major"), num_pages, max_pages, T_k, and gather() -> dense (k, v).
The masks beyond causal, each passed only when declared: documents=True gives `q_doc_ids` and `k_doc_ids` (None,
or int32 arrays [B,T_q] and [B,T_k]: a query sees only keys of its own document), chunked_local=True `chunk_size`
(0: none), prefix=True `prefix_length` (0: none) and right_window=True `window_right` (None: none);
dense_mask=True gives `dense_mask` (None, or a bool array [B or 1, H or 1, T_q, T_k]: key j visible to query i of
(b,h) where True; an extent of 1 broadcasts) and block_mask=True `block_mask` (None, or a BlockMask: block_q, block_k,
kinds uint8 [B or 1, H or 1, ceil(T_q/block_q), ceil(T_k/block_k)] of EMPTY, PARTIAL, FULL, the partial cells, and
to_dense() -> the bool array it stands for).
Only numpy (Debian's python3-numpy) is needed; framework="torch" (torch tensors of the case's dtype, on `device`)
needs torch (python3-torch).
"""

import inspect
import os
import struct
import sys
import traceback

try:
    import numpy as np
except ImportError:  # the interpreter that runs the client has no numpy: say which one, and what to do
    raise ModuleNotFoundError(
        "attncheck_plugin needs numpy, which this Python cannot import: %s (Python %d.%d). Install it for this "
        "interpreter (Debian: apt-get install python3-numpy, which serves /usr/bin/python3)%s"
        % (sys.executable, sys.version_info[0], sys.version_info[1],
           "" if sys.executable in ("/usr/bin/python3", os.path.realpath("/usr/bin/python3"))
           else ", or run the client with /usr/bin/python3: --impl exec:'/usr/bin/python3 my_attention.py'"),
        name="numpy") from None

PROTOCOL_VERSION = 4  # the newest this client speaks; it answers an older attncheck in that one's version
MAGIC = b"ATNC"
HELLO, CAPS, REFUSE, FORWARD, RESULT, BYE, BACKWARD, GRADIENTS = 1, 2, 3, 4, 5, 6, 7, 8
OK, ERROR, UNSUPPORTED, WRONG_SIZE = 0, 1, 2, 3
# Version 2's capability extension of the caps frame (flags2): the bit of each serve() declaration, and its
# empty-rows codes. FLAGS2 and FLAGS3 are attncheck's feature table (properties/include/attncheck/features.hpp):
# a test (Contract.pythonClientNamesEveryFeatureAsTheTableDoes) compares them, and serve()'s keywords, with it.
FLAGS2 = {"gqa": 1, "key_lengths": 2, "window": 4, "backward": 8}
EMPTY_ROWS_CODES = {None: 0, "zero": 1, "nan": 2, "any": 3}
# Version 3's cross-length regimes (the caps frame's u32 after flags3).
CROSS_LENGTHS_CODES = {True: 0, "T_q<=T_k": 1, "T_q>=T_k": 2}
KEYWORDS = ("scale", "alignment", "dtype", "key_lengths", "window")
# Version 3: the flags3 bits (ATTNCHECK_CAP3_*) of each serve() declaration, and the keyword fn gets for it.
FLAGS3 = {"lse": 0x1, "sinks": 0x2, "softcap": 0x4, "alibi": 0x8, "paged": 0x10, "documents": 0x20,
          "chunked_local": 0x40, "prefix": 0x80, "bidirectional": 0x100, "right_window": 0x200, "block_mask": 0x400,
          "dense_mask": 0x800, "strided": 0x2000, "layout_invariant": 0x4000, "batch_invariant": 0x8000,
          "query_documents": 0x20000, "v_head_dim": 0x1000}
# Version 4: the flags4 bits (ABI 4's ATTNCHECK_CAP4_* bits, docs/abi4.md) of each serve() declaration.
FLAGS4 = {"bias": 0x1, "bias_grad": 0x2, "temperature": 0x4, "rope": 0x8, "rope_interleaved": 0x10, "qk_norm": 0x20,
          "qk_norm_eps_outside": 0x40, "dropout": 0x80, "rope_ntk": 0x100, "rope_llama3": 0x200, "kv_e4m3fn": 0x400,
          "kv_e5m2": 0x800, "kv_int8": 0x1000, "kv_scale_per_head": 0x2000, "kv_scale_per_token": 0x4000,
          "kv_zero_points": 0x8000, "kv_ggml_q8_0": 0x10000, "kv_ggml_q4_0": 0x20000, "kv_ggml_q4_1": 0x40000,
          "kv_ggml_q5_0": 0x80000, "kv_ggml_q5_1": 0x100000, "q_dot_ggml_q8": 0x200000,
          "q_quant": 0x400000, "p_fp8": 0x800000, "paged_quant": 0x1000000,
          "index_list": 0x2000000, "index_list_blocks": 0x4000000, "index_list_per_query_head": 0x8000000,
          "tree": 0x10000000, "tree_bitmask": 0x20000000, "index_list_physical": 0x40000000}
# Version 4's second word, flags4b (ABI 4's ATTNCHECK_CAP4B_* bits: flags4 has none left), after flags4.
FLAGS4B = {"index_list_counted": 0x1, "index_list_current_block": 0x2}
MODIFIER_KEYWORDS = {"sinks": ("sinks",), "softcap": ("softcap",), "alibi": ("alibi_slopes",),
                     "bidirectional": ("causal",), "paged": ("paged",), "documents": ("q_doc_ids", "k_doc_ids"),
                     "chunked_local": ("chunk_size",), "prefix": ("prefix_length",), "right_window": ("window_right",),
                     "block_mask": ("block_mask",), "dense_mask": ("dense_mask",), "bias": ("bias",),
                     "temperature": ("temperature",), "rope": ("rope",), "rope_interleaved": ("rope",),
                     "qk_norm": ("qk_norm",), "qk_norm_eps_outside": ("qk_norm",), "dropout": ("dropout",),
                     "rope_ntk": ("rope",), "rope_llama3": ("rope",), "kv_e4m3fn": ("quant",),
                     "kv_e5m2": ("quant",), "kv_int8": ("quant",), "kv_scale_per_head": ("quant",),
                     "kv_scale_per_token": ("quant",), "kv_zero_points": ("quant",), "kv_ggml_q8_0": ("quant",),
                     "kv_ggml_q4_0": ("quant",), "kv_ggml_q4_1": ("quant",), "kv_ggml_q5_0": ("quant",),
                     "kv_ggml_q5_1": ("quant",), "q_quant": ("quant",), "paged_quant": ("paged", "quant"),
                     "index_list": ("index_list",), "index_list_blocks": ("index_list",),
                     "index_list_per_query_head": ("index_list",), "tree": ("tree",), "tree_bitmask": ("tree",),
                     "index_list_physical": ("index_list",), "index_list_counted": ("index_list",),
                     "index_list_current_block": ("index_list",)}
# The declarations whose keyword a forward call alone carries (paged and quantised caches are forward only).
FORWARD_ONLY = ("paged", "kv_e4m3fn", "kv_e5m2", "kv_int8", "kv_scale_per_head", "kv_scale_per_token",
                "kv_zero_points", "kv_ggml_q8_0", "kv_ggml_q4_0", "kv_ggml_q4_1", "kv_ggml_q5_0", "kv_ggml_q5_1",
                "q_quant", "paged_quant")
# Every on/off declaration serve() takes, by family: each is a keyword (`window=True`) and a name for `features=`
# (`features=("gqa", "window", "lse")`), the feature table's names (properties/include/attncheck/features.hpp).
FEATURE_FAMILIES = {
    "heads and lengths": ("gqa", "key_lengths", "v_head_dim"),
    "masks beyond causal": ("window", "right_window", "chunked_local", "prefix", "documents", "query_documents",
                            "block_mask", "dense_mask", "bidirectional"),
    "score modifiers": ("softcap", "alibi", "sinks", "bias", "temperature", "dropout"),
    "prologues": ("rope", "rope_interleaved", "rope_ntk", "rope_llama3", "qk_norm", "qk_norm_eps_outside"),
    "what fn returns": ("returns_weights", "lse", "custom_scale", "nonfinite_safe", "bias_grad"),
    "how K and V come": ("paged", "strided", "layout_invariant"),
    "quantised caches": ("kv_e4m3fn", "kv_e5m2", "kv_int8", "kv_scale_per_head", "kv_scale_per_token",
                         "kv_zero_points", "kv_ggml_q8_0", "kv_ggml_q4_0", "kv_ggml_q4_1", "kv_ggml_q5_0",
                         "kv_ggml_q5_1", "q_quant", "paged_quant"),
    "selected keys": ("index_list", "index_list_blocks", "index_list_per_query_head", "index_list_physical",
                      "index_list_counted", "index_list_current_block", "tree", "tree_bitmask"),
    "claims about results": ("batch_invariant",),
    "compute precision": ("q_dot_ggml_q8", "p_fp8"),
}
FEATURES = tuple(name for names in FEATURE_FAMILIES.values() for name in names)
# The words attncheck's messages use for a declaration, as a C plug-in makes it (ATTNCHECK_CAP_*, ATTNCHECK_CAP3_*)
# or a C++ implementation (Feature::*, Capabilities::*), and the serve() keyword that makes it here: python_words()
# rewrites the one into the other.
ABI_WORDS = dict([("ATTNCHECK_CAP3_" + name.upper(), name) for name in FLAGS3]
                 + [("ATTNCHECK_CAP_" + name.upper(), name) for name in ("gqa", "key_lengths", "window")]
                 + [("ATTNCHECK_CAP4_" + name.upper(), name) for name in FLAGS4]
                 + [("ATTNCHECK_CAP4B_" + name.upper(), name) for name in FLAGS4B]
                 + [("Feature::" + name, name) for name in list(FLAGS3) + list(FLAGS4) + list(FLAGS4B)]
                 + [("Feature::" + member, name) for member, name in (
                     ("gqa", "gqa"), ("key_padding", "key_lengths"), ("window", "window"))]
                 + [("Capabilities::" + name, name) for name in (
                     "returns_weights", "custom_scale", "cross_lengths", "nonfinite_safe")])


def python_words(text):
    """attncheck's message in the words of serve(): "(ATTNCHECK_CAP3_ALIBI, _SINKS)" becomes "(alibi=True,
    sinks=True)", "(Feature::block_mask, dense_mask)" "(block_mask=True, dense_mask=True)"."""
    import re

    def group(match):
        first = match.group(1)
        rest = [r.strip() for r in (match.group(2) or "").split(",")[1:]]
        # "_SINKS" after "ATTNCHECK_CAP3_ALIBI" has its prefix; "dense_mask" after "Feature::block_mask" too.
        base = first[:first.rindex("_")] if first.startswith("ATTNCHECK_") else first[:first.index("::") + 2]
        words = [ABI_WORDS.get(n) for n in [first] + [base + r for r in rest]]
        return match.group(0) if None in words else ", ".join("%s=True" % w for w in words)

    return re.sub(r"((?:ATTNCHECK_CAP(?:4B|[34])?_|Feature::|Capabilities::)[A-Za-z_]+)((?:, _?[A-Za-z_]+)*)(?=\))", group,
                  text)


# Version 3's page layouts (the caps frame's u32 after the head dims, and a paged forward frame's layout field).
PAGE_LAYOUT_CODES = {"token-major": 1, "head-major": 2}
PAGE_LAYOUT_NAMES = {code: name for name, code in PAGE_LAYOUT_CODES.items()}
# The flags of a forward (and backward) frame, named as attncheck names them (its wire::CallFlags, call_<name>; a
# test, Contract.pythonClientNamesEveryFeatureAsTheTableDoes, compares the two): version 2's key lengths and window;
# version 3's softcap, ALiBi slopes and sinks (in this order), the LSE, no causal rule, the paging (K and V then come
# as page pools), the masks beyond causal (an i64 prefix length, an i64 right window, an i64 chunk size, then B*T_q
# and B*T_k int32 document ids, in this order, after the sinks), block and dense masks, laid-out inputs (declared
# strided=True: the u32 after the flags names the layout) and V with a head dimension of its own (declared
# v_head_dim=True: an i64 D_v follows k's shape, and v, and in a backward frame dO, have it).
CALL_FLAGS = {"scale": 1, "weights": 2, "key_lengths": 4, "window": 8, "softcap": 16, "alibi": 32, "sinks": 64,
              "lse": 128, "not_causal": 256, "paged": 512, "prefix": 1024, "window_right": 2048, "chunk": 4096,
              "documents": 8192, "block_mask": 16384, "dense_mask": 32768, "layout": 65536, "v_head_dim": 131072,
              "bias": 262144, "temperature": 524288, "rope": 1048576, "qk_norm": 2097152, "dropout": 4194304,
              "quant": 8388608, "quant_q": 16777216, "index_list": 33554432, "tree": 67108864}
PAGED, PREFIX, WINDOW_RIGHT, CHUNK, DOCUMENTS = (CALL_FLAGS[k] for k in ("paged", "prefix", "window_right", "chunk",
                                                                        "documents"))
LAYOUT, V_HEAD_DIM = CALL_FLAGS["layout"], CALL_FLAGS["v_head_dim"]
# The caps frame's flags (every version), a result frame's and a gradients frame's.
CAPS_FLAGS = {"returns_weights": 1, "custom_scale": 2, "cross_lengths": 4, "nonfinite_safe": 8}
RESULT_FLAGS = {"weights": 1, "lse": 2}
GRADIENTS_D_SINKS, GRADIENTS_D_BIAS = 1, 2
LAYOUT_NAMES = {1: "token-major", 2: "padded", 3: "kv-broadcast", 4: "kv-interleaved", 5: "v-is-k"}


def _layout_plan(arrays, layout):
    """q, k, v in `layout`, with the strides attncheck's own server gives (attncheck/layouts.hpp), as (buffers, views):
    each buffer a NaN-filled 1-D array at least as long as a contiguous tensor, so that a kernel that misreads stays
    inside it; each view (buffer index, shape, strides and offset in elements) over one of them."""
    from numpy.lib.stride_tricks import as_strided

    def strides_of(shape, kv):
        B, H, T, D = shape
        if layout == "token-major":
            return (T * H * D, D, H * D, 1)
        if layout == "padded":
            row = D + 3
            head = T * row + 5
            return (H * head + 7, head, row, 1)
        if layout == "kv-broadcast" and kv:
            return (T * D, 0, D, 1)
        if layout == "kv-interleaved" and kv:
            return (T * H * 2 * D, 2 * D, H * 2 * D, 1)
        return (H * T * D, T * D, D, 1)

    buffers = []

    def fill(buf, x, st, at=0):
        byte_strides = tuple(s * x.itemsize for s in st)
        if st[1] == 0:  # one head in memory: head 0's values, read by every head
            as_strided(buf[at:], (x.shape[0], x.shape[2], x.shape[3]),
                       (byte_strides[0], byte_strides[2], byte_strides[3]))[...] = x[:, 0]
        else:
            as_strided(buf[at:], x.shape, byte_strides)[...] = x

    def place(x, kv):
        st = strides_of(x.shape, kv)
        extent = sum((n - 1) * s for n, s in zip(x.shape, st)) + 1
        buffers.append(np.full(max(extent, x.size) + x.size, np.nan, dtype=x.dtype))
        fill(buffers[-1], x, st)
        return (len(buffers) - 1, x.shape, st, 0)

    q, k, v = arrays[:3]
    views = [place(q, False)]
    if layout == "kv-interleaved":  # each token's k and v of a head side by side: rows of D + D_v elements
        B, H, T, D = k.shape
        row = D + v.shape[3]
        buffers.append(np.full(B * H * T * row + row, np.nan, dtype=k.dtype))
        st = (T * H * row, row, H * row, 1)
        fill(buffers[-1], k, st)
        fill(buffers[-1], v, st, D)
        views += [(len(buffers) - 1, k.shape, st, 0), (len(buffers) - 1, v.shape, st, D)]
    else:
        views.append(place(k, True))
        # v-is-k: V the view K is, or K's first D_v columns (MLA's V inside its latent K)
        views.append((views[1][0], v.shape, views[1][2], 0) if layout == "v-is-k" else place(v, True))
    return buffers, views


def _laid_out(arrays, layout):
    """q, k, v as numpy views in `layout` (_layout_plan), then the other arrays as they are."""
    from numpy.lib.stride_tricks import as_strided
    buffers, views = _layout_plan(arrays, layout)
    out = []
    for index, shape, st, at in views:
        buf = buffers[index]
        out.append(as_strided(buf[at:], shape, tuple(s * buf.itemsize for s in st), writeable=st[1] != 0))
    return out + list(arrays[3:])
# Then a block mask (its blocks, kinds and partial cells) and a dense mask (its B and H, then its cells).
BLOCK_MASK, DENSE_MASK = CALL_FLAGS["block_mask"], CALL_FLAGS["dense_mask"]

DTYPE_CODES = {"float32": 1, "float64": 2, "float16": 4, "bfloat16": 8}
DTYPE_NAMES = {code: name for name, code in DTYPE_CODES.items()}
ALIGNMENT_CODES = {"top-left": 1, "bottom-right": 2}
ALIGNMENT_NAMES = {code: name for name, code in ALIGNMENT_CODES.items()}
# Little-endian numpy dtype of each wire dtype; bfloat16 travels as raw uint16 bits.
WIRE = {"float32": "<f4", "float64": "<f8", "float16": "<f2", "bfloat16": "<u2"}


class ProtocolError(RuntimeError):
    """The other side sent something that does not follow PROTOCOL.md."""


def _bf16_to_f32(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _f32_to_bf16(x):
    # Round to nearest even on the float32 bits, as every bfloat16 conversion does; NaN stays NaN.
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = ((bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    rounded[nan] = ((bits[nan] >> 16) | np.uint32(0x40)).astype(np.uint16)
    return rounded


def _decode(raw, dtype, shape):
    a = np.frombuffer(raw, dtype=WIRE[dtype]).reshape(shape)
    return _bf16_to_f32(a) if dtype == "bfloat16" else a.copy()


def _encode(array, dtype):
    if dtype == "bfloat16":
        return _f32_to_bf16(np.asarray(array, dtype=np.float32)).tobytes()
    return np.ascontiguousarray(array, dtype=WIRE[dtype]).tobytes()


class _Tee:
    """A text stream that writes to several (stderr and a file), flushing each write."""

    def __init__(self, *streams):
        self.streams = streams

    def write(self, text):
        for stream in self.streams:
            stream.write(text)
            stream.flush()
        return len(text)

    def flush(self):
        for stream in self.streams:
            stream.flush()

    def fileno(self):
        return self.streams[0].fileno()

    def isatty(self):
        return False


class _Channel:
    """Frames over the inherited stdin/stdout; stdout is moved aside so that a stray print() goes to stderr."""

    def __init__(self):
        self.inp = os.fdopen(os.dup(0), "rb")
        self.out = os.fdopen(os.dup(1), "wb")
        os.dup2(2, 1)
        sys.stdout = sys.stderr
        # $ATTNCHECK_PYTHON_OUTPUT: the function's prints and tracebacks also go to that file (the pytest fixture
        # shows them as the test's captured stderr; attncheck keeps only stderr's tail, for its messages).
        path = os.environ.get("ATTNCHECK_PYTHON_OUTPUT")
        if path:
            sys.stdout = sys.stderr = _Tee(sys.stderr, open(path, "a", buffering=1))

    def read(self):
        header = self.inp.read(16)
        if len(header) == 0:
            return None, b""
        if len(header) < 16 or header[:4] != MAGIC:
            raise ProtocolError("expected a frame starting with ATNC, got %r" % header)
        ftype, length = struct.unpack("<IQ", header[4:])
        payload = self.inp.read(length)
        if len(payload) != length:
            raise ProtocolError("input ended inside a frame")
        return ftype, payload

    def write(self, ftype, payload):
        self.out.write(MAGIC + struct.pack("<IQ", ftype, len(payload)) + payload)
        self.out.flush()


def _name(fn):
    """What to call a function in a message: its name, or a partial's function's, or its type's."""
    inner = getattr(fn, "func", None)  # functools.partial
    return getattr(fn, "__name__", None) or (_name(inner) if inner is not None else type(fn).__name__)


def _string(s):
    b = s.encode("utf-8")
    return struct.pack("<I", len(b)) + b


def _failure(status, message):
    return struct.pack("<iI", status, 0) + _string(message)


def _keywords(fn, role, modifiers=()):
    """The keywords among KEYWORDS that `fn` declares (they are passed only to a function that has them), and
    the modifier keywords of the declared `modifiers`, which it must have."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError) as e:
        raise TypeError("serve: cannot read the signature of %s %r: %s" % (role, fn, e))
    takes = {p for p in KEYWORDS if p in params}
    for declared in modifiers:
        for keyword in MODIFIER_KEYWORDS[declared]:
            if keyword not in params and not any(p.kind == p.VAR_KEYWORD for p in params.values()):
                raise TypeError("serve: %s=True but %s %s has no `%s` parameter"
                                % (declared, role, _name(fn), keyword))
            takes.add(keyword)
    return takes


def _read_call(payload, backward):
    """The arrays and keywords of a forward or backward frame (PROTOCOL.md, "forward")."""
    dcode, acode, fflags, lcode, scale = struct.unpack_from("<IIIId", payload)
    qs = struct.unpack_from("<4q", payload, 24)
    ks = struct.unpack_from("<4q", payload, 56)
    off = 88
    vs = ks
    if fflags & V_HEAD_DIM:  # version 3: V's own head dimension follows k's shape
        (d_v,) = struct.unpack_from("<q", payload, off)
        off += 8
        vs = (ks[0], ks[1], ks[2], d_v)
    os_ = (qs[0], qs[1], qs[2], vs[3])  # the output's shape (and dO's)
    key_lengths = window = None
    if fflags & CALL_FLAGS["key_lengths"]:
        key_lengths = np.frombuffer(payload, dtype="<i8", count=qs[0], offset=off).astype(np.int64)
        off += 8 * qs[0]
    if fflags & CALL_FLAGS["window"]:
        (window,) = struct.unpack_from("<q", payload, off)
        off += 8
    softcap = alibi_slopes = sinks = None
    if fflags & CALL_FLAGS["softcap"]:  # version 3: softcap, ALiBi slopes, sinks, in this order
        (softcap,) = struct.unpack_from("<d", payload, off)
        off += 8
    if fflags & CALL_FLAGS["alibi"]:
        alibi_slopes = np.frombuffer(payload, dtype="<f8", count=qs[1], offset=off).astype(np.float64)
        off += 8 * qs[1]
    if fflags & CALL_FLAGS["sinks"]:
        sinks = np.frombuffer(payload, dtype="<f8", count=qs[1], offset=off).astype(np.float64)
        off += 8 * qs[1]
    prefix_length, window_right, chunk_size, q_doc_ids, k_doc_ids = 0, None, 0, None, None
    if fflags & PREFIX:  # version 3: the masks beyond causal, in this order
        (prefix_length,) = struct.unpack_from("<q", payload, off)
        off += 8
    if fflags & WINDOW_RIGHT:
        (window_right,) = struct.unpack_from("<q", payload, off)
        off += 8
    if fflags & CHUNK:
        (chunk_size,) = struct.unpack_from("<q", payload, off)
        off += 8
    if fflags & DOCUMENTS:
        q_doc_ids = np.frombuffer(payload, dtype="<i4", count=qs[0] * qs[2], offset=off).astype(np.int32)
        off += 4 * qs[0] * qs[2]
        k_doc_ids = np.frombuffer(payload, dtype="<i4", count=ks[0] * ks[2], offset=off).astype(np.int32)
        off += 4 * ks[0] * ks[2]
        q_doc_ids, k_doc_ids = q_doc_ids.reshape(qs[0], qs[2]), k_doc_ids.reshape(ks[0], ks[2])
    block_mask = dense_mask = None
    T_q, T_k = qs[2], ks[2]
    if fflags & BLOCK_MASK:  # i64 block_q, block_k, B_m, H_m, nq, nk; kinds; i64 B_p, H_p; partial cells
        block_q, block_k, Bm, Hm, nq, nk = struct.unpack_from("<6q", payload, off)
        off += 48
        kinds = np.frombuffer(payload, dtype=np.uint8, count=Bm * Hm * nq * nk, offset=off).reshape(Bm, Hm, nq, nk)
        off += kinds.size
        Bp, Hp = struct.unpack_from("<2q", payload, off)
        off += 16
        partial = None
        if Bp:
            partial = np.frombuffer(payload, dtype=np.uint8, count=Bp * Hp * T_q * T_k, offset=off)
            partial = partial.reshape(Bp, Hp, T_q, T_k) != 0
            off += partial.size
        block_mask = BlockMask(int(block_q), int(block_k), kinds.copy(), partial, T_q, T_k)
    if fflags & DENSE_MASK:  # i64 B_d, H_d, then the cells
        Bd, Hd = struct.unpack_from("<2q", payload, off)
        off += 16
        dense_mask = np.frombuffer(payload, dtype=np.uint8, count=Bd * Hd * T_q * T_k, offset=off)
        dense_mask = dense_mask.reshape(Bd, Hd, T_q, T_k) != 0
        off += dense_mask.size
    dtype = DTYPE_NAMES[dcode]
    size = np.dtype(WIRE[dtype]).itemsize
    bias = None
    if fflags & CALL_FLAGS["bias"]:  # version 4: i64 B_b, H_b, then the values at the call's dtype
        Bb, Hb = struct.unpack_from("<2q", payload, off)
        off += 16
        n = Bb * Hb * T_q * T_k
        bias = _decode(payload[off:off + n * size], dtype, (Bb, Hb, T_q, T_k))
        off += n * size
    temperature = None
    if fflags & CALL_FLAGS["temperature"]:  # version 4: i64 B_t, H_t, then B_t*H_t*T_q f64 values
        Bt, Ht = struct.unpack_from("<2q", payload, off)
        off += 16
        temperature = np.frombuffer(payload, dtype="<f8", count=Bt * Ht * T_q, offset=off).reshape(Bt, Ht, T_q)
        off += 8 * Bt * Ht * T_q
        # q's own type, so that q / temperature[..., None] stays at it (bfloat16's float32 holds the value as is)
        temperature = temperature.astype(np.float32 if dtype == "bfloat16" else WIRE[dtype])
    rope = None
    if fflags & CALL_FLAGS["rope"]:  # version 4: u32 variant, u32 scaling, i64 rotary_dim, f64 base, f64 factor,
        # Llama 3's three f64 (scaling 4), then the positions
        vcode, scode, rotary_dim, base, factor = struct.unpack_from("<IIqdd", payload, off)
        off += 32
        llama3 = (1.0, 4.0, 8192.0)
        if scode == 4:
            llama3 = struct.unpack_from("<ddd", payload, off)
            off += 24
        q_positions = np.frombuffer(payload, dtype="<i8", count=qs[0] * T_q, offset=off).reshape(qs[0], T_q)
        off += 8 * qs[0] * T_q
        k_positions = np.frombuffer(payload, dtype="<i8", count=qs[0] * T_k, offset=off).reshape(qs[0], T_k)
        off += 8 * qs[0] * T_k
        rope = Rope("half-split" if vcode == 1 else "interleaved", int(rotary_dim), float(base), float(factor),
                    q_positions.astype(np.int64), k_positions.astype(np.int64),
                    {0: "linear", 2: "ntk", 4: "llama3"}[scode], *(float(x) for x in llama3))
    qk_norm = None
    if fflags & CALL_FLAGS["qk_norm"]:  # version 4: u32 placement, u32 sides, f64 eps, then D f64 per side
        placement, sides, eps = struct.unpack_from("<IId", payload, off)
        off += 16
        D = qs[3]
        weights = []
        for side in (1, 2):
            if sides & side:
                weights.append(np.frombuffer(payload, dtype="<f8", count=D, offset=off).copy())
                off += 8 * D
            else:
                weights.append(None)
        qk_norm = QkNorm(weights[0], weights[1], float(eps), placement == 2)
    dropout = None
    if fflags & CALL_FLAGS["dropout"]:  # version 4: f64 p, u64 seed, u64 offset
        prob, seed, offset = struct.unpack_from("<dQQ", payload, off)
        off += 24
        dropout = Dropout(float(prob), int(seed), int(offset))
    index_list = None
    if fflags & CALL_FLAGS["index_list"]:  # version 4: u32 space, u32 per, i64 block size, heads, max_k; the entries
        space, per, block_size, heads, max_k = struct.unpack_from("<IIqqq", payload, off)
        off += 32
        shape = (qs[0], heads, qs[2], max_k)
        n = int(np.prod(shape))
        index_list = IndexList(np.frombuffer(payload, dtype="<i4", count=n, offset=off).reshape(shape).copy(),
                               int(block_size), "query_head" if per == 2 else "kv_head",
                               "physical" if space == 2 else "logical")
        off += 4 * n
    tree = None
    if fflags & CALL_FLAGS["tree"]:  # version 4: u32 form, u32 bit order; the parents, or B + 1 offsets and the bits
        form, order = struct.unpack_from("<II", payload, off)
        off += 8
        prefix = (np.full(qs[0], ks[2], dtype=np.int64) if key_lengths is None else key_lengths) - qs[2]
        if form == 1:
            parents = np.frombuffer(payload, dtype="<i4", count=qs[0] * qs[2], offset=off).reshape(qs[0], qs[2])
            off += 4 * qs[0] * qs[2]
            tree = Tree(prefix, qs[2], parents=parents.copy())
        else:
            offsets = np.frombuffer(payload, dtype="<i8", count=qs[0] + 1, offset=off).astype(np.int64)
            off += 8 * (qs[0] + 1)
            bits = np.frombuffer(payload, dtype=np.uint8, count=int(offsets[-1]), offset=off).copy()
            off += int(offsets[-1])
            tree = Tree(prefix, qs[2], bits=bits, offsets=offsets, bit_order="big" if order == 2 else "little")
    quant = None
    paging = None

    def read_paging():  # version 3: u32 layout, u32 0, i64 page size, pages, table width; the table
        nonlocal off
        lcode, _, page_size, num_pages, max_pages = struct.unpack_from("<IIqqq", payload, off)
        off += 32
        table = np.frombuffer(payload, dtype="<i4", count=qs[0] * max_pages, offset=off)
        off += 4 * qs[0] * max_pages
        layout = PAGE_LAYOUT_NAMES[lcode]
        # k's pool rows D wide, v's D_v (a V head dimension of its own: vs[3])
        shapes = [(num_pages, page_size, ks[1], x[3]) if layout == "token-major" else (num_pages, ks[1], page_size, x[3])
                  for x in (ks, vs)]
        return table.astype(np.int32).reshape(qs[0], max_pages), int(page_size), layout, shapes

    if fflags & CALL_FLAGS["quant"]:  # version 4: u32 format; per side u32 granularity, u32 zero points, f32 scales,
        # i8 zero points; then q at the dtype and K's and V's codes in place of k and v (paged: the paging first, and
        # K's and V's scales and codes their pools', over the pool's axes)
        if fflags & PAGED:
            paging = read_paging()
        (fcode,) = struct.unpack_from("<I", payload, off)
        off += 4
        sides = []
        q_quantised = bool(fflags & CALL_FLAGS["quant_q"])  # Q's scales follow V's, its codes replace q
        shapes = (paging[3][0], paging[3][1]) if paging else (ks, vs)
        for i, shape in enumerate((*shapes, qs) if q_quantised else shapes):
            gcode, has_zp = struct.unpack_from("<II", payload, off)
            off += 8
            if gcode == 3:  # ggml's blocks hold their scales
                sides.append(("block32", None, None))
                continue
            if paging and i < 2:  # the pool's first three axes: the head's is axis 2 token-major, 1 head-major
                head_axis = 2 if paging[2] == "token-major" else 1
                extents = {0: (1, 1, 1), 1: tuple(shape[a] if a == head_axis else 1 for a in range(3)),
                           2: tuple(shape[:3])}[gcode]
            else:
                extents = {0: (1, 1, 1), 1: (1, shape[1], 1), 2: (shape[0], shape[1], shape[2])}[gcode]
            n = int(np.prod(extents))
            scales = np.frombuffer(payload, dtype="<f4", count=n, offset=off).reshape(extents).copy()
            off += 4 * n
            zero_points = None
            if has_zp:
                zero_points = np.frombuffer(payload, dtype="i1", count=n, offset=off).reshape(extents).copy()
                off += n
            sides.append((QUANT_GRANULARITIES[gcode], scales, zero_points))
        if q_quantised:
            n = int(np.prod(qs))
            q_codes = np.frombuffer(payload, dtype="u1", count=n, offset=off).reshape(tuple(qs)).copy()
            off += n
            q = None
        else:
            nq = int(np.prod(qs)) * size
            q = _decode(payload[off:off + nq], dtype, qs)
            off += nq
        codes = []
        block = GGML_BLOCK_BYTES.get(QUANT_FORMATS[fcode])
        for shape in shapes:
            # ggml's blocks: [B, H_kv, T_k, D/32, its bytes]; the other formats one byte an element
            shape = tuple(shape[:3]) + (shape[3] // 32, block) if block else tuple(shape)
            n = int(np.prod(shape))
            codes.append(np.frombuffer(payload, dtype="u1", count=n, offset=off).reshape(shape).copy())
            off += n
        quant = QuantizedKV(QUANT_FORMATS[fcode], *(QuantCache(QUANT_FORMATS[fcode], c, g, sc, z)
                                                    for c, (g, sc, z) in zip(codes, sides)),
                            q=QuantCache(QUANT_FORMATS[fcode], q_codes, *sides[2]) if q_quantised else None)
    paged = None
    if quant is not None:
        arrays = [q, None, None]
        nq = nk = nv = 0
        if paging:  # the pools are the codes'
            paged = PagedKV(quant.k.codes, quant.v.codes, paging[0], key_lengths, paging[1], paging[2], ks[2])
    elif fflags & PAGED:  # version 3: the paging, then q and the two pools in place of k and v
        table, page_size, layout, shapes = read_paging()
        nq, nk, nv = (int(np.prod(qs)) * size, int(np.prod(shapes[0])) * size, int(np.prod(shapes[1])) * size)
        q = _decode(payload[off:off + nq], dtype, qs)
        pools = [_decode(payload[off + nq:off + nq + nk], dtype, shapes[0]),
                 _decode(payload[off + nq + nk:off + nq + nk + nv], dtype, shapes[1])]
        paged = PagedKV(pools[0], pools[1], table, key_lengths, page_size, layout, ks[2])
        arrays = [q, None, None]
    else:
        nq, nk, nv = int(np.prod(qs)) * size, int(np.prod(ks)) * size, int(np.prod(vs)) * size
        arrays = [_decode(payload[off:off + nq], dtype, qs), _decode(payload[off + nq:off + nq + nk], dtype, ks),
                  _decode(payload[off + nq + nk:off + nq + nk + nv], dtype, vs)]
    if backward:
        off += nq + nk + nv
        arrays.append(_decode(payload[off:off + int(np.prod(os_)) * size], dtype, os_))
    kwargs = {"scale": scale if fflags & CALL_FLAGS["scale"] else None, "alignment": ALIGNMENT_NAMES[acode], "dtype": dtype,
              "key_lengths": key_lengths, "window": window, "softcap": softcap, "alibi_slopes": alibi_slopes,
              "sinks": sinks, "causal": not fflags & CALL_FLAGS["not_causal"], "paged": paged, "prefix_length": prefix_length,
              "window_right": window_right, "chunk_size": chunk_size, "q_doc_ids": q_doc_ids, "k_doc_ids": k_doc_ids,
              "block_mask": block_mask, "dense_mask": dense_mask, "bias": bias,
              "temperature": temperature, "rope": rope, "qk_norm": qk_norm, "dropout": dropout, "quant": quant,
              "index_list": index_list, "tree": tree}
    # version 3, declared strided=True: q, k, v come as views with the layout's strides (_Frameworks.inputs)
    layout = LAYOUT_NAMES[lcode] if fflags & LAYOUT else None
    return arrays, kwargs, dtype, bool(fflags & CALL_FLAGS["weights"]), bool(fflags & CALL_FLAGS["lse"]), layout


class BlockMask:
    """A block mask (serve(..., block_mask=True); FlexAttention's BlockMask). Query block m holds queries
    m*block_q .. (m+1)*block_q - 1 and key block n keys n*block_k .. (n+1)*block_k - 1 (the last of each may be
    short). kinds, uint8 [B or 1, H or 1, num_q_blocks, num_k_blocks] (1 broadcasts over the batch or the heads),
    says of each block EMPTY (every key hidden), FULL (every key visible) or PARTIAL (`partial` says, cell by cell:
    a bool array [B or 1, H or 1, T_q, T_k], read only inside partial blocks; None when no block is partial).
    to_dense() is the bool array [B or 1, H or 1, T_q, T_k] the mask stands for."""

    EMPTY, PARTIAL, FULL = 0, 1, 2  # attncheck/plugin.h's ATTNCHECK_BLOCK_*

    def __init__(self, block_q, block_k, kinds, partial, T_q, T_k):
        self.block_q, self.block_k, self.kinds, self.partial = block_q, block_k, kinds, partial
        self.T_q, self.T_k = T_q, T_k
        self.num_q_blocks, self.num_k_blocks = kinds.shape[2], kinds.shape[3]

    def to_dense(self):
        """The bool array [B or 1, H or 1, T_q, T_k] of the keys the mask lets each query see (its batch and head
        extents the larger of the kinds' and the partial cells')."""
        return block_mask_to_dense(self)

    def __repr__(self):
        return "BlockMask(blocks %d x %d, kinds %s, partial %s)" % (
            self.block_q, self.block_k, list(self.kinds.shape), None if self.partial is None else list(self.partial.shape))


def block_mask_to_dense(mask):
    """The bool array [B or 1, H or 1, T_q, T_k] a BlockMask stands for: key j visible to query i where its block is
    FULL, or PARTIAL and the partial cell is True."""
    if isinstance(mask.kinds, np.ndarray):
        kinds = np.repeat(np.repeat(mask.kinds, mask.block_q, axis=2), mask.block_k, axis=3)
        partial = mask.partial if mask.partial is not None else np.zeros((1, 1, mask.T_q, mask.T_k), dtype=bool)
    else:  # torch tensors (serve(..., framework="torch")), on their device
        import torch
        kinds = mask.kinds.repeat_interleave(mask.block_q, dim=2).repeat_interleave(mask.block_k, dim=3)
        partial = mask.partial if mask.partial is not None else torch.zeros(
            (1, 1, mask.T_q, mask.T_k), dtype=torch.bool, device=kinds.device)
    kinds = kinds[:, :, :mask.T_q, :mask.T_k]
    return (kinds == BlockMask.FULL) | ((kinds == BlockMask.PARTIAL) & partial)


class Rope:
    """Rotary position embeddings of q and k in the call (serve(..., rope=True) for half-split pairs,
    rope_interleaved=True for interleaved ones). Head dimensions below rotary_dim are rotated in pairs by the angle of
    their token's own position id, those past it untouched: pair m < rotary_dim // 2 is (m, m + rotary_dim // 2)
    ("half-split": GPT-NeoX, Llama's rotate_half) or (2m, 2m + 1) ("interleaved": GPT-J), rotated by
    theta = position * frequencies()[m]: x'_a = x_a cos - x_b sin, x'_b = x_b cos + x_a sin. The frequencies are
    base ** (-2m / rotary_dim) under the scaling: "linear" (the position divided by factor; factor 1: none), "ntk"
    (rope_ntk=True: the base grown to base * factor ** (r / (r - 2))) or "llama3" (rope_llama3=True: Llama 3.1's
    rope_scaling with low_freq_factor, high_freq_factor and original_max_position). q_positions [B, T_q] and
    k_positions [B, T_k] are int64 arrays (tensors with framework="torch")."""

    def __init__(self, variant, rotary_dim, base, factor, q_positions, k_positions, scaling="linear",
                 low_freq_factor=1.0, high_freq_factor=4.0, original_max_position=8192.0):
        self.variant, self.rotary_dim, self.base, self.factor = variant, rotary_dim, base, factor
        self.q_positions, self.k_positions = q_positions, k_positions
        self.scaling, self.low_freq_factor, self.high_freq_factor = scaling, low_freq_factor, high_freq_factor
        self.original_max_position = original_max_position

    def frequencies(self):
        """Each pair's angle per position, float64 [rotary_dim // 2], under the scaling (linear's factor included)."""
        import numpy as np
        r, m = self.rotary_dim, np.arange(self.rotary_dim // 2, dtype=np.float64)
        if self.scaling == "ntk":
            return (self.base * self.factor ** (r / (r - 2))) ** (-2 * m / r)
        w = self.base ** (-2 * m / r)
        if self.scaling == "linear":
            return w / self.factor
        wavelen = 2 * np.pi / w
        smooth = (self.original_max_position / wavelen - self.low_freq_factor) / (
            self.high_freq_factor - self.low_freq_factor)
        blended = (1 - smooth) * w / self.factor + smooth * w
        return np.where(wavelen < self.original_max_position / self.high_freq_factor, w,
                        np.where(wavelen > self.original_max_position / self.low_freq_factor, w / self.factor,
                                 blended))

    def pairs(self):
        """The head dimensions (a, b) of each pair, in pair order."""
        half = self.rotary_dim // 2
        return [(m, m + half) if self.variant == "half-split" else (2 * m, 2 * m + 1) for m in range(half)]

    def apply(self, x, positions, inverse=False):
        """x [B, H, T, D] (q with q_positions, k with k_positions; a numpy array or a torch tensor) with each token's
        pairs rotated by its position, in float64 (inverse: by minus it, R^T, as a gradient is turned back); the
        dimensions past rotary_dim as they are. Returns float64 of x's kind; round it to the call's dtype yourself."""
        import numpy as np
        torch = sys.modules.get("torch")
        is_torch = torch is not None and isinstance(x, torch.Tensor)
        theta = np.asarray(positions.cpu() if is_torch else positions, dtype=np.float64)[:, :, None] * \
            self.frequencies()  # [B, T, rotary_dim // 2]
        if is_torch:
            theta = torch.as_tensor(theta, dtype=torch.float64, device=x.device)
            x = x.to(torch.float64)
            cos, sin, out = torch.cos(theta)[:, None], torch.sin(theta)[:, None], x.clone()
        else:
            x = np.asarray(x, dtype=np.float64)
            cos, sin, out = np.cos(theta)[:, None], np.sin(theta)[:, None], x.copy()
        if inverse:
            sin = -sin
        a, b = (list(ix) for ix in zip(*self.pairs()))
        out[..., a] = x[..., a] * cos - x[..., b] * sin
        out[..., b] = x[..., b] * cos + x[..., a] * sin
        return out

    def __repr__(self):
        return "Rope(%s, rotary_dim %d, base %g, factor %g, positions %s and %s)" % (
            self.variant, self.rotary_dim, self.base, self.factor, list(self.q_positions.shape),
            list(self.k_positions.shape))


class QkNorm:
    """QK-norm of q and k in the call (serve(..., qk_norm=True) for eps inside the square root,
    qk_norm_eps_outside=True for eps outside it), applied first, before the rope: each row x of q (when q_weight is
    not None) and of k (when k_weight is not None) over its head dimension becomes w * x / r, with
    r = sqrt(mean(x**2) + eps), or sqrt(mean(x**2)) + eps when eps_outside. The weights are float64 arrays [D]
    (tensors with framework="torch")."""

    def __init__(self, q_weight, k_weight, eps, eps_outside):
        self.q_weight, self.k_weight, self.eps, self.eps_outside = q_weight, k_weight, eps, eps_outside

    def __repr__(self):
        return "QkNorm(q %s, k %s, eps %g%s)" % ("normalised" if self.q_weight is not None else "not",
                                               "normalised" if self.k_weight is not None else "not", self.eps,
                                               ", outside the root" if self.eps_outside else "")


class IndexList:
    """Selected keys (serve(..., index_list=True)): `indices`, int32 [B, H_kv, T_q, max_k] (`per` "kv_head"; with
    serve(..., index_list_per_query_head=True) [B, H, T_q, max_k] and `per` "query_head"), row (b, g, i) the keys (or,
    with block_size > 1, the blocks of block_size keys: serve(..., index_list_blocks=True)) that query i of batch entry
    b sees through any query head of kv head g; -1 pads a row anywhere and is never a key (not the last one). A key
    listed twice is listed once (with serve(..., index_list_counted=True) it weighs twice: a key listed n times weighs
    n·e^s, as a gather over every entry computes; with serve(..., index_list_current_block=True) each query's own
    block, that of its aligned position, is selected besides its row, as MoBA's current block), and the call's other
    rules (causal, padding, window, ...) still hide what they hide.
    to_mask(T_k, H) is the [B, H, T_q, T_k] boolean mask of the keys listed (other rules not applied). With
    serve(..., index_list_physical=True), a paged call's entries are slots of the pool (`space` "physical": page *
    page_size + slot, FlashMLA's sparse indices): k_pages viewed as [num_pages * page_size, ...] (token-major) reads
    them directly, and to_logical(paged) gives them as key positions (to_mask(T_k, H, paged) too)."""

    def __init__(self, indices, block_size=1, per="kv_head", space="logical"):
        self.indices, self.block_size, self.per, self.space = indices, block_size, per, space

    def to_logical(self, paged):
        """The entries as key positions (numpy int32), a physical list's slots read through paged's block table."""
        idx = self.indices if isinstance(self.indices, np.ndarray) else self.indices.cpu().numpy()
        if self.space != "physical":
            return idx
        out = np.full(idx.shape, -1, dtype=np.int32)
        table = np.asarray(paged.block_table)
        for b in range(idx.shape[0]):
            where = {}  # slot -> key position, for the keys of sequence b
            for m in range((int(paged.seq_lens[b]) + paged.page_size - 1) // paged.page_size):
                for slot in range(paged.page_size):
                    if m * paged.page_size + slot < int(paged.seq_lens[b]):
                        where[int(table[b, m]) * paged.page_size + slot] = m * paged.page_size + slot
            out[b] = np.vectorize(lambda s: where.get(int(s), -1))(idx[b]) if idx[b].size else idx[b]
        return out

    def to_mask(self, T_k, H, paged=None):
        idx = self.to_logical(paged)
        B, H_kv, T_q, _ = idx.shape
        mask = np.zeros((B, H_kv, T_q, T_k), dtype=bool)
        units = np.arange(T_k) // self.block_size
        for b in range(B):
            for g in range(H_kv):
                for i in range(T_q):
                    row = idx[b, g, i]
                    mask[b, g, i] = np.isin(units, row[row >= 0])
        return np.repeat(mask, H // H_kv, axis=1)  # per query head: H_kv here is H

    def __repr__(self):
        return "IndexList(%s, block size %d)" % (list(self.indices.shape), self.block_size)


class Tree:
    """A tree of draft tokens (speculative decoding's verification; serve(..., tree=True) for parent arrays,
    serve(..., tree_bitmask=True) for FlashInfer's packed bitmask): the call's T_q queries are the nodes, node n of
    batch entry b its query n and its key prefix_lengths[b] + n (the last T_q of the entry's keys: key_lengths[b],
    or T_k). Either `parents`, int32 [B, T_q] (node n's parent, < n, or -1 for a child of the prefix), or `bits`,
    uint8, with `offsets`, int64 [B + 1], and `bit_order` ("little", FlashInfer's, or "big", numpy.packbits'
    default): entry b's T_q rows of prefix_lengths[b] + T_q cells each (its row stride) from byte offsets[b]. A node
    sees the prefix, its ancestors and itself (with a bitmask: its 1 cells), and the call's other rules still hide
    what they hide. `nodes` is T_q. to_mask(T_k) is the [B, T_q, T_k] numpy boolean mask the tree shows (other rules
    not applied). A window and ALiBi read a node's place, the prefix's length plus its depth (the earlier nodes its
    row shows), not its index: places(T_k) gives the queries' places [B, T_q] and the keys' [B, T_k] (a prefix key
    at its index, a node's key at its node's place)."""

    def __init__(self, prefix_lengths, nodes, parents=None, bits=None, offsets=None, bit_order=None):
        self.prefix_lengths, self.nodes, self.parents = prefix_lengths, nodes, parents
        self.bits, self.offsets, self.bit_order = bits, offsets, bit_order

    def to_mask(self, T_k):
        B, T_q = len(self.prefix_lengths), self.nodes
        mask = np.zeros((B, T_q, T_k), dtype=bool)
        for b in range(B):
            P = int(self.prefix_lengths[b])
            L = P + T_q
            if self.parents is not None:
                mask[b, :, :P] = True
                for i in range(T_q):
                    n = i
                    while n >= 0:
                        mask[b, i, P + n] = True
                        n = int(self.parents[b, n])
            else:
                seg = self.bits[int(self.offsets[b]):int(self.offsets[b + 1])]
                cells = np.unpackbits(seg, bitorder=self.bit_order)[:T_q * L]
                mask[b, :, :L] = cells.reshape(T_q, L).astype(bool)
        return mask

    def places(self, T_k):
        mask = self.to_mask(T_k)
        B, T_q = mask.shape[0], self.nodes
        q_places = np.zeros((B, T_q), dtype=np.int64)
        k_places = np.tile(np.arange(T_k, dtype=np.int64), (B, 1))
        for b in range(B):
            P = int(self.prefix_lengths[b])
            depth = np.array([mask[b, n, P:P + n].sum() for n in range(T_q)], dtype=np.int64)
            q_places[b] = P + depth
            k_places[b, P:P + T_q] = P + depth
        return q_places, k_places

    def __repr__(self):
        return "Tree(%s)" % ("parents %s" % self.parents.tolist() if self.parents is not None else
                             "bitmask, %s bit order, offsets %s" % (self.bit_order, self.offsets.tolist()))


class Dropout:
    """Dropout on the weights (serve(..., dropout=True)): after the softmax each weight is kept and divided by 1 - p,
    or dropped to 0, by a keep mask fn draws from `seed` and `offset` (torch.Generator().manual_seed(seed), or a
    Philox counter at offset). The mask must be a function of the seed, the offset and the cell (b, h, i, j) only: not
    of the values, not of the batch entries after b. fn returns the dropped weights (attncheck reads the mask there;
    without returns_weights it recovers them by probing with one-hot V), the output from them, and the softmax's LSE;
    a backward with the same seed and offset uses the same mask."""

    def __init__(self, p, seed, offset):
        self.p, self.seed, self.offset = p, seed, offset

    def __repr__(self):
        return "Dropout(p %g, seed %d, offset %d)" % (self.p, self.seed, self.offset)


QUANT_FORMATS = {1: "e4m3fn", 2: "e5m2", 3: "int8", 4: "q8_0", 5: "q4_0", 6: "q4_1", 7: "q5_0", 8: "q5_1"}
QUANT_GRANULARITIES = {0: "tensor", 1: "kv_head", 2: "token_head", 3: "block32"}
# ggml's blocks of 32 along D: their sizes in bytes (ggml-common.h's block_q8_0 ... block_q5_1).
GGML_BLOCK_BYTES = {"q8_0": 34, "q4_0": 18, "q4_1": 20, "q5_0": 22, "q5_1": 24}


def fp8_values(fmt):
    """The 256 values of a format's bytes as float64 (NaN for e4m3fn's 0x7f and 0xff, e5m2's NaNs; e5m2's infinities),
    from the formats' definitions: e4m3fn S.EEEE.MMM (bias 7, no infinities, S.1111.111 NaN), e5m2 S.EEEEE.MM (bias
    15, IEEE-style: float16's top byte), int8 two's complement."""
    b = np.arange(256)
    if fmt in GGML_BLOCK_BYTES:  # an element's q from its byte (q8_0 an int8; the others n, less 8 or 16 for _0)
        q = b.astype(np.uint8).view(np.int8).astype(np.float64) if fmt == "q8_0" else b - {"q4_0": 8, "q5_0": 16}.get(fmt, 0)
        bits = {"q4_0": 4, "q4_1": 4, "q5_0": 5, "q5_1": 5}.get(fmt, 8)
        return np.where(b < (1 << bits), q, np.nan).astype(np.float64)
    if fmt == "int8":
        return b.astype(np.uint8).view(np.int8).astype(np.float64)
    if fmt == "e5m2":
        return (b.astype(np.uint16) << 8).view(np.float16).astype(np.float64)
    e, m = (b >> 3) & 0xF, (b & 7).astype(np.float64)
    mag = np.where(e == 0, m * 2.0 ** -9, (8 + m) * np.exp2(e.astype(np.float64) - 10))
    mag = np.where((e == 15) & (m == 7), np.nan, mag)
    return np.where(b & 0x80, -mag, mag)


def ggml_dequantize(fmt, blocks):
    """ggml's blocks [B, H_kv, T_k, D/32, bytes] (uint8) as float64 values [B, H_kv, T_k, D], as ggml's
    dequantize_row_q* computes them: d (and m) float16 at the block's start, then (Q5) the fifth bits qh, then qs."""
    d = blocks[..., 0:2].copy().view("<f2")[..., 0].astype(np.float64)[..., None]
    off, m = 2, 0.0
    if fmt in ("q4_1", "q5_1"):
        m = blocks[..., 2:4].copy().view("<f2")[..., 0].astype(np.float64)[..., None]
        off = 4
    if fmt == "q8_0":
        q = blocks[..., off:off + 32].copy().view(np.int8).astype(np.float64)
    else:
        qh = 0
        if fmt in ("q5_0", "q5_1"):
            qh = blocks[..., off:off + 4].copy().view("<u4")[..., 0].astype(np.int64)[..., None]
            off += 4
        qs = blocks[..., off:off + 16].astype(np.int64)
        j = np.arange(16)
        lo, hi = qs & 0x0F, qs >> 4
        if fmt in ("q5_0", "q5_1"):
            lo, hi = lo | (((qh >> j) & 1) << 4), hi | (((qh >> (j + 16)) & 1) << 4)
        q = np.concatenate([lo, hi], axis=-1).astype(np.float64) - {"q4_0": 8, "q5_0": 16}.get(fmt, 0)
    values = q * d + m
    return values.reshape(blocks.shape[:3] + (blocks.shape[3] * 32,))


class QuantCache:
    """One side (K, V, or a quantised Q) of a quantised cache (serve(..., kv_e4m3fn=True, ...)): `codes`, the stored bytes
    [B, H_kv, T_k, D] (uint8: view them as torch.float8_e4m3fn, torch.float8_e5m2 or int8), `scales` (float32,
    [1, 1, 1] per tensor, [1, H_kv, 1] per kv head, [B, H_kv, T_k] per token and kv head: `granularity`) and
    `zero_points` (int8, shaped as the scales, or None). In ggml's formats (q8_0, q4_0, q4_1, q5_0, q5_1) `codes` are
    the blocks as ggml stores them, [B, H_kv, T_k, D/32, the block's bytes], and `scales` is None (they are in the
    blocks; granularity "block32"). Element (b, g, t, c) means (value(code) - zero point) * scale,
    which dequantize() computes in float64 (exactly)."""

    def __init__(self, fmt, codes, granularity, scales, zero_points):
        self.format, self.codes, self.granularity = fmt, codes, granularity
        self.scales, self.zero_points = scales, zero_points

    def dequantize(self):
        if self.format in GGML_BLOCK_BYTES:  # decoded on the host, then put where the codes are
            out = ggml_dequantize(self.format, np.asarray(self.codes.cpu() if hasattr(self.codes, "cpu")
                                                          else self.codes))
            if isinstance(self.codes, np.ndarray):
                return out
            import torch
            return torch.from_numpy(out).to(self.codes.device)
        if isinstance(self.codes, np.ndarray):
            values = fp8_values(self.format)[self.codes.astype(np.int64)]
            z = 0.0 if self.zero_points is None else self.zero_points.astype(np.float64)[..., None]
            return (values - z) * self.scales.astype(np.float64)[..., None]
        import torch  # torch tensors (serve(..., framework="torch")), on their device
        table = torch.tensor(fp8_values(self.format), dtype=torch.float64, device=self.codes.device)
        values = table[self.codes.long()]
        z = 0.0 if self.zero_points is None else self.zero_points.double()[..., None]
        return (values - z) * self.scales.double()[..., None]

    def __repr__(self):
        return "QuantCache(%s %s, scales per %s%s)" % (self.format, list(self.codes.shape), self.granularity,
                                                       ", zero points" if self.zero_points is not None else "")


class QuantizedKV:
    """The K and V of a quantised call (serve(..., kv_e4m3fn=True, kv_e5m2=True, kv_int8=True)): k and v are None
    and `quant` holds both caches in one `format`, each a QuantCache with scales of its own. dequantize() gives the
    float64 (k, v) the call means; a kernel that dequantises in its own arithmetic is held to the bound of attncheck's
    tolerance step 12. With serve(..., q_quant=True) Q may come quantised too (FlashAttention 3's FP8 Q with its
    descale): q is None then and `quant.q` a QuantCache of q's shape [B, H, T_q, D], its scales per tensor, per query
    head ("kv_head": [1, H, 1]) or per query and head ("token_head": [B, H, T_q]); otherwise `quant.q` is None."""

    def __init__(self, fmt, k, v, q=None):
        self.format, self.k, self.v, self.q = fmt, k, v, q

    def dequantize(self):
        return self.k.dequantize(), self.v.dequantize()

    def __repr__(self):
        return "QuantizedKV(%s, k %r, v %r%s)" % (self.format, self.k, self.v,
                                                  "" if self.q is None else ", q %r" % (self.q,))


class PagedKV:
    """The K and V of a paged call (serve(..., paged=True)): two page pools and a block table, as a serving
    engine's KV cache holds them. Key t of sequence b lies in page block_table[b, t // page_size], slot
    t % page_size: k_pages[page, slot, g] token-major ([num_pages, page_size, H_kv, D], vLLM's and FlashInfer's
    NHD), k_pages[page, g, slot] head-major ([num_pages, H_kv, page_size, D], FlashInfer's HND). Only the keys
    t < seq_lens[b] are the call's: every other slot of the pools (NaN, Inf, anything) and every table entry past
    a sequence's ceil(seq_lens[b] / page_size) pages (-1, out of range, another sequence's page) must never be
    read. T_k is the call's key length (the dense k's shape [B, H_kv, T_k, D], which the alignment and the
    weights' shape use); every seq_lens[b] <= T_k."""

    def __init__(self, k_pages, v_pages, block_table, seq_lens, page_size, layout, T_k):
        self.k_pages, self.v_pages = k_pages, v_pages
        self.block_table, self.seq_lens = block_table, seq_lens
        self.page_size, self.layout, self.T_k = page_size, layout, T_k
        self.num_pages, self.max_pages = k_pages.shape[0], block_table.shape[1]

    def gather(self, k_pages=None, v_pages=None):
        """Dense (k, v) [B, H_kv, T_k, D] read through the table (0 past each sequence's length), as a reference
        to test a paged kernel against. Other pools of the same layout may be given: in a paged quantised call
        (k_pages and v_pages then the codes' pools), `paged.gather(*quant.dequantize())` is the dense float64 k and v."""
        k_pages = self.k_pages if k_pages is None else k_pages
        v_pages = self.v_pages if v_pages is None else v_pages
        B, H_kv = self.block_table.shape[0], k_pages.shape[2 if self.layout == "token-major" else 1]
        dense = []
        for pool in (k_pages, v_pages):
            if isinstance(pool, np.ndarray):
                out, arange = np.zeros((B, H_kv, self.T_k) + pool.shape[3:], dtype=pool.dtype), np.arange
            else:  # torch tensors (serve(..., framework="torch")), on their device; torch indexes with int64
                import torch
                out = torch.zeros((B, H_kv, self.T_k) + tuple(pool.shape[3:]), dtype=pool.dtype, device=pool.device)
                arange = lambda n: torch.arange(n, device=pool.device)  # noqa: E731
            for b in range(B):
                t = arange(int(self.seq_lens[b]))
                pages, slots = self.block_table[b, t // self.page_size], t % self.page_size
                pages = pages if isinstance(pool, np.ndarray) else pages.long()
                rows = pool[pages, slots] if self.layout == "token-major" else pool[pages, :, slots]
                out[b, :, :len(t)] = rows.swapaxes(0, 1)  # [len, H_kv, D...] -> [H_kv, len, D...]
            dense.append(out)
        return tuple(dense)

    def __repr__(self):
        return "PagedKV(%s, %d pages of %d, table %s, seq_lens %s, T_k %d)" % (
            self.layout, self.num_pages, self.page_size, list(self.block_table.shape), list(self.seq_lens), self.T_k)


def _tensors(*arrays):
    return b"".join(struct.pack("<4q", *a.shape) + _encode(a, dtype) for a, dtype in arrays)


class _Numpy:
    """How a call reaches a numpy function (serve's default, framework="numpy"): numpy arrays, bfloat16 values as
    float32; whatever fn returns is read with np.asarray."""

    name = "numpy"

    def check_device(self):
        return None

    def inputs(self, arrays, kwargs, dtype, layout):
        return (_laid_out(arrays, layout) if layout else arrays), kwargs

    @staticmethod
    def array(x):
        return np.asarray(x)


class _Torch:
    """How a call reaches a torch function (serve(..., framework="torch", device=...)): every array becomes a
    torch.Tensor on `device`, q, k, v (and dO, and the paged pools) at exactly the case's dtype (torch.float16 and
    torch.bfloat16 included: a bfloat16 value travels as a float32 holding it, so the conversion is exact), laid-out
    inputs as torch.as_strided views over one NaN-filled buffer, integer arrays as int32/int64 tensors, masks as
    bool, and the per-head ALiBi slopes and sink logits as float64 tensors (exact: cast them as the kernel does).
    What fn returns may be a tensor on any device and of any dtype, or a numpy array."""

    name = "torch"

    def __init__(self, device):
        try:
            import torch
        except ImportError:
            raise ModuleNotFoundError(
                "serve(framework=\"torch\") needs torch, which this Python cannot import: %s. Install it for this "
                "interpreter (Debian: apt-get install python3-torch, which serves /usr/bin/python3)" % sys.executable,
                name="torch") from None
        self.torch = torch
        self.device_name = "cpu" if device is None else str(device)
        self.dtypes = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
                       "bfloat16": torch.bfloat16}

    def check_device(self):
        """None when a tensor can be made on the device, else why not (a refusal attncheck shows)."""
        try:
            self.device = self.torch.device(self.device_name)
            self.torch.zeros(1, device=self.device)
        except Exception as e:  # a malformed name, no CUDA, an index past the devices
            return "serve(framework=\"torch\", device=%r): torch cannot make a tensor there: %s: %s" % (
                self.device_name, type(e).__name__, str(e).splitlines()[0] if str(e) else "")
        return None

    def tensor(self, a, dtype=None):
        """`a` (a numpy array) on the device, at the case's `dtype` or, without one, at its own."""
        t = self.torch.from_numpy(np.ascontiguousarray(a))
        return t.to(device=self.device, dtype=self.dtypes[dtype] if dtype else None)

    def inputs(self, arrays, kwargs, dtype, layout):
        torch = self.torch
        if layout:
            buffers, views = _layout_plan(arrays, layout)
            buffers = [self.tensor(b, dtype) for b in buffers]
            inputs = [torch.as_strided(buffers[index], shape, st, at) for index, shape, st, at in views]
            inputs += [None if a is None else self.tensor(a, dtype) for a in arrays[3:]]
        else:
            inputs = [None if a is None else self.tensor(a, dtype) for a in arrays]
        kw = dict(kwargs)
        for key in ("key_lengths", "alibi_slopes", "sinks", "q_doc_ids", "k_doc_ids", "dense_mask"):
            if kw[key] is not None:
                kw[key] = self.tensor(kw[key])
        for key in ("bias", "temperature"):  # at the call's dtype, as q, k and v
            if kw.get(key) is not None:
                kw[key] = self.tensor(kw[key], dtype)
        mask = kw["block_mask"]
        if mask is not None:
            kw["block_mask"] = BlockMask(mask.block_q, mask.block_k, self.tensor(mask.kinds),
                                         None if mask.partial is None else self.tensor(mask.partial), mask.T_q, mask.T_k)
        rope = kw.get("rope")
        if rope is not None:
            kw["rope"] = Rope(rope.variant, rope.rotary_dim, rope.base, rope.factor, self.tensor(rope.q_positions),
                              self.tensor(rope.k_positions), rope.scaling, rope.low_freq_factor,
                              rope.high_freq_factor, rope.original_max_position)
        index_list = kw.get("index_list")
        if index_list is not None:  # int32 entries on the device
            kw["index_list"] = IndexList(self.tensor(index_list.indices), index_list.block_size, index_list.per,
                                         index_list.space)
        norm = kw.get("qk_norm")
        if norm is not None:
            kw["qk_norm"] = QkNorm(None if norm.q_weight is None else self.tensor(norm.q_weight),
                                   None if norm.k_weight is None else self.tensor(norm.k_weight), norm.eps,
                                   norm.eps_outside)
        quant = kw.get("quant")
        if quant is not None:  # the codes as torch.uint8, scales float32, zero points int8, on the device
            def on_device(c):
                return None if c is None else QuantCache(c.format, self.tensor(c.codes), c.granularity,
                                                         None if c.scales is None else self.tensor(c.scales),
                                                         None if c.zero_points is None else self.tensor(c.zero_points))
            kw["quant"] = QuantizedKV(quant.format, on_device(quant.k), on_device(quant.v), q=on_device(quant.q))
        paged = kw["paged"]
        if paged is not None:
            pools = ((kw["quant"].k.codes, kw["quant"].v.codes) if quant is not None  # the codes' pools, on the device
                     else (self.tensor(paged.k_pages, dtype), self.tensor(paged.v_pages, dtype)))
            kw["paged"] = PagedKV(pools[0], pools[1], self.tensor(paged.block_table), self.tensor(paged.seq_lens), paged.page_size,
                                  paged.layout, paged.T_k)
        return inputs, kw

    def array(self, x):
        if isinstance(x, self.torch.Tensor):
            x = x.detach()
            if x.dtype == self.torch.bfloat16:  # numpy has no bfloat16: float32 holds it exactly
                x = x.float()
            return x.cpu().numpy()
        return np.asarray(x)

    def autograd(self, fn, inputs, kw, d_output, bias_grad=False):
        """(dq, dk, dv[, d_sinks][, d_bias]) of fn's output against d_output, by torch.autograd (serve(...,
        backward="autograd")): q, k, v (and the sinks, when the call has them, and the bias with `bias_grad`) become
        leaves that require grad, fn runs with grad enabled, and an input fn's output does not depend on gets a zero
        gradient."""
        torch = self.torch
        leaves = [t.detach().requires_grad_(True) for t in inputs[:3]]
        kw = dict(kw)
        for key in ("sinks",) + (("bias",) if bias_grad else ()):
            if kw.get(key) is not None:
                kw[key] = kw[key].detach().requires_grad_(True)
                leaves.append(kw[key])
        with torch.enable_grad():
            result = fn(*leaves[:3], **kw)
            out = result.get("output") if isinstance(result, dict) else result[0] if isinstance(result, tuple) else result
            if not isinstance(out, torch.Tensor) or not out.requires_grad:
                raise TypeError("backward=\"autograd\": %s returned %s, not a tensor autograd can differentiate "
                                "(a numpy array, a detached tensor or one computed under no_grad); return the torch "
                                "tensor itself" % (getattr(fn, "__name__", fn), type(out).__name__))
            grads = torch.autograd.grad(out, leaves, grad_outputs=d_output.to(device=out.device, dtype=out.dtype),
                                        allow_unused=True)
        return tuple(torch.zeros_like(leaf) if g is None else g for leaf, g in zip(leaves, grads))


def _framework(framework, device):
    if framework == "numpy":
        if device is not None:
            raise ValueError("serve: device=%r needs framework=\"torch\" (a numpy function runs where numpy does)"
                             % (device,))
        return _Numpy()
    if framework == "torch":
        return _Torch(device)
    raise ValueError("serve: framework is %r (expected \"numpy\" or \"torch\")" % (framework,))


class _Errors:
    """What fn raised, kept so that a thousand calls failing the same way print one traceback, not a thousand: each
    distinct (exception, message) prints its traceback once; at the end, how often each came. With
    $ATTNCHECK_PYTHON_STATS set, the counts go to that file as one JSON line per process (the pytest fixture reads
    it to turn "every call failed the same way" into one error)."""

    def __init__(self, name):
        self.name = name
        self.calls = {}   # dtype -> calls answered
        self.failed = {}  # dtype -> {message: [count, traceback]}

    def called(self, dtype):
        self.calls[dtype] = self.calls.get(dtype, 0) + 1

    def raised(self, dtype, e):
        # The first line only: pytest's rewritten asserts add lines that name the call's values.
        message = "%s: %s" % (type(e).__name__, (str(e).splitlines() or [""])[0])
        seen = self.failed.setdefault(dtype, {})
        if message in seen:
            seen[message][0] += 1
            return message
        tb = e.__traceback__  # from the function's own frame on: this client's frames are no help to its author
        while tb is not None and tb.tb_next is not None and tb.tb_frame.f_code.co_filename == __file__:
            tb = tb.tb_next
        text = "".join(traceback.format_exception(type(e), e, tb))
        if len(seen) < 5:  # a message that changes from call to call (sizes in it, say) prints five, then counts
            sys.stderr.write(text)
            sys.stderr.flush()
        seen[message] = [1, text]
        return message

    def close(self):
        for dtype, seen in self.failed.items():
            for message, (count, _) in seen.items():
                if count > 1:
                    sys.stderr.write("attncheck_plugin: %s raised %s %d times at %s (its traceback above, once)\n"
                                     % (self.name, message.splitlines()[0][:200], count, dtype))
        path = os.environ.get("ATTNCHECK_PYTHON_STATS")
        if path:
            import json
            with open(path, "a") as f:
                f.write(json.dumps({"calls": self.calls, "failed": self.failed}) + "\n")


def serve(fn, features=(), **declarations):
    """serve_declared(fn, **declarations), with every name in `features` (FEATURE_FAMILIES: "gqa", "window",
    "softcap", "lse", "paged", ...) declared True: `serve(fn, features=("gqa", "window", "lse"))` is
    `serve(fn, gqa=True, window=True, lse=True)`. The values that are not on/off (dtypes, alignments, page sizes,
    empty_rows, framework, device, backward, ...) stay keywords."""
    if isinstance(features, str):
        features = (features,)
    for name in features:
        if name not in FEATURES:
            raise ValueError("serve: features names %r, which is no feature (expected names among %s)" % (
                name, "; ".join("%s: %s" % (family, ", ".join(names)) for family, names in FEATURE_FAMILIES.items())))
        if declarations.get(name) is False:
            raise ValueError("serve: %r is in features but %s=False as well" % (name, name))
        declarations[name] = True
    return serve_declared(fn, **declarations)


def serve_declared(fn, name="python", description="", dtypes=("float32", "float64"), returns_weights=False,
          custom_scale=None, alignments=("top-left",), cross_lengths=True, max_T=0, nonfinite_safe=False,
          gqa=False, key_lengths=None, window=None, backward=None, empty_rows=None, head_dim_multiple=1,
          max_head_dim=0, head_dims=None, lse=False, sinks=False, softcap=False, alibi=False, bidirectional=False,
          paged=False, page_sizes=(16,), page_layouts=("token-major", "head-major"), documents=False,
          chunked_local=False, prefix=False, right_window=False, block_mask=False, dense_mask=False,
          batch_invariant=False, query_documents=False, strided=False, layout_invariant=False, v_head_dim=False,
          bias=False, bias_grad=False, temperature=False, rope=False, rope_interleaved=False, qk_norm=False,
          qk_norm_eps_outside=False, dropout=False, rope_ntk=False, rope_llama3=False, kv_e4m3fn=False,
          kv_e5m2=False, kv_int8=False, kv_scale_per_head=False, kv_scale_per_token=False, kv_zero_points=False,
          kv_ggml_q8_0=False, kv_ggml_q4_0=False, kv_ggml_q4_1=False, kv_ggml_q5_0=False, kv_ggml_q5_1=False,
          q_dot_ggml_q8=False, q_quant=False, p_fp8=False, paged_quant=False, index_list=False,
          index_list_blocks=False, index_list_per_query_head=False, tree=False, tree_bitmask=False,
          index_list_physical=False, index_list_counted=False, index_list_current_block=False, framework="numpy",
          device=None):
    """Answers attncheck's calls with `fn` until attncheck is done, then exits 0.

    `framework="torch"` gives fn torch.Tensors instead of numpy arrays: q, k, v (and dO, the paged pools) at exactly
    the case's dtype (torch.float32, float64, float16, bfloat16) on `device` ("cpu" by default, "cuda", "cuda:1",
    ...), strided layouts as torch.as_strided views, key lengths and document ids as integer tensors, masks as bool
    tensors, ALiBi slopes and sinks as float64 tensors; fn may return tensors on any device and of any dtype. With it,
    `backward="autograd"` checks the gradients torch.autograd takes through fn (no backward to write). The server is
    a process of its own, started fresh (never forked), so CUDA is initialised in it and nowhere else.

    The keywords declare what `fn` accepts, so the generators only produce such cases: `dtypes`, whether it
    returns (out, weights), whether it honours `scale` (default: whether fn has a `scale` parameter),
    the causal `alignments` it implements when T_q != T_k, the largest T (`max_T`, 0: no limit), and
    `nonfinite_safe` when a NaN or Inf in a future key or value never reaches an output (a select mask).
    Protocol version 2 adds: `gqa` (k and v may have H_kv heads, H_kv dividing H), `key_lengths` and
    `window` (honours key padding and a sliding window; default: whether fn has that parameter), `backward`
    (a function returning (dq, dk, dv), dk and dv shaped like k) and `empty_rows` (None, "zero" or "nan":
    what a query row that sees no key returns; None: either, and reports say which).
    Protocol version 3 adds declarations, so that attncheck never draws a case fn does not support:
    `cross_lengths` may also be "T_q<=T_k" or "T_q>=T_k" (only that regime), `head_dim_multiple`,
    `max_head_dim` (0: no limit) and `head_dims` (a list: only those D), and `empty_rows` may be "any" (the
    output of a row that sees no key is unspecified: laws skip those rows). An attncheck that speaks only
    version 2 cannot honour them; the client then refuses to serve, saying so.
    Version 3 also carries the score modifiers (applied in the order softcap, ALiBi, mask, sink) and the LSE,
    each only when declared: `softcap=True` (fn gets `softcap`, None or c > 0), `alibi=True` (`alibi_slopes`,
    None or [H]), `sinks=True` (`sinks`, None or [H]; the backward then returns d_sinks [H] as a fourth
    gradient), `bidirectional=True` (`causal`, True or False) and `lse=True` (fn returns the log-sum-exp of
    every row too: (out, lse), (out, weights, lse) or a dict with "output", "weights", "lse").
    `paged=True` declares paged K and V, in the `page_sizes` (keys per page) and `page_layouts` ("token-major",
    "head-major") given: fn gets `paged`, None for a dense call; in a paged call (half the cases of every forward
    law, and the paged laws; never a backward) k and v are None and `paged` is a PagedKV (its pools, block table,
    seq_lens, page size and layout). `key_lengths`, when fn takes it, then holds seq_lens too.
    Masks beyond causal, each only when declared (fn, and a backward, then need the keywords): `documents=True`
    (packed sequences: `q_doc_ids` and `k_doc_ids`, None or int32 arrays [B,T_q] and [B,T_k]: a query sees only
    keys of its own document; key ids are non-decreasing, and a query's id is the one of the key at its aligned
    position p clamped to [0, T_k - 1]; with `query_documents=True` as well, the query ids are free instead:
    non-decreasing (an id past the last key's is an empty document at the end), FlashAttention varlen's cu_seqlens_q beside cu_seqlens_k, and
    each document's queries are aligned on its own lengths: document d's query i, with d's queries [qs, qe) and
    keys [ks, ke), sits at p = ks + (i - qs), plus (ke - ks) - (qe - qs) bottom-right), `chunked_local=True` (`chunk_size`, 0 for none: query p sees only keys j
    with j // chunk_size == p // chunk_size), `prefix=True` (`prefix_length`, 0 for none: keys j < prefix_length are
    visible to every query despite the causal rule) and `right_window=True` (`window_right`, None or wr >= 0: query
    p sees keys j <= p + wr only), `dense_mask=True` (`dense_mask`, None or a bool array [B or 1, H or 1, T_q, T_k]:
    key j visible to query i of (b, h) where True, an extent of 1 broadcasting) and `block_mask=True` (`block_mask`,
    None or a BlockMask: kinds per block, the partial cells, to_dense()). Every family present must allow a key.
    `strided=True` declares that fn reads q, k and v through any strides: it then also gets them as numpy views in
    other layouts (padded with NaN gaps, [B,T,H,D], K and V broadcast over heads with stride 0, interleaved in one
    buffer, or V the very array K is; the layout-invariance law), and `layout_invariant=True` that its results are
    then bit-identical to the contiguous call's. fn gets no keyword for them.
    `batch_invariant=True` declares that a sequence's results are bit-identical whatever else is in the batch, the
    batch size and the number of its queries in a call (the batch-invariance law; fn gets no keyword for it).
    `v_head_dim=True` declares that v may have a head dimension D_v of its own (MLA's 576 and 512): v is then
    [B,H_kv,T_k,D_v] and the output (and dO) [B,H,T_q,D_v]; fn reads it from v's shape (no keyword), or, in a
    paged call, from the last extent of paged.v_pages (its rows D_v wide).
    Protocol version 4 (ABI 4) adds `bias=True`: fn (and a backward) gets `bias`, None or an array [B or 1, H or 1,
    T_q, T_k] at the call's dtype, added to each score after the softcap, where ALiBi's term is added, before the
    mask (an extent of 1 broadcasts); a value of -inf hides its cell as a mask does. `bias_grad=True` (with
    `bias=True` and a backward) declares that the backward returns dBias too, last: (dq, dk, dv[, d_sinks], d_bias)
    when the call has a bias, d_bias in the bias's shape (dS summed over the axes it broadcasts over); with
    backward="autograd" the bias is a leaf and its gradient is taken too. `temperature=True`: fn (and a backward) gets
    `temperature`, None or an array [B or 1, H or 1, T_q] of q's type, every value > 0: query i's scaled scores are
    divided by its temperature before the softcap, which is attention on q / temperature[..., None] (Llama 4's
    attention temperature tuning multiplies q by 1/temperature); a backward's dq is the gradient of q itself.
    `rope=True` (half-split pairs) and `rope_interleaved=True` (interleaved pairs): fn (and a backward) gets `rope`,
    None or a Rope (variant, rotary_dim, base, factor, q_positions [B, T_q], k_positions [B, T_k]): q and k are
    rotated by their tokens' positions before the scores (a backward's dq and dk are the gradients of q and k
    themselves); `rope_ntk=True` and `rope_llama3=True` declare those scalings too (Rope.scaling "ntk", "llama3";
    Rope.frequencies() computes each pair's). `qk_norm=True` (eps inside the square root) and `qk_norm_eps_outside=True`: fn (and a backward)
    gets `qk_norm`, None or a QkNorm (q_weight and k_weight, float64 [D] or None for a side not normalised, eps,
    eps_outside): each row of q and k is normalised first, before the rope. `dropout=True`: fn (and a backward) gets
    `dropout`, None or a Dropout (p, seed, offset): each weight kept and divided by 1 - p or dropped, by a mask that
    depends on the seed, the offset and the cell only; fn returns the dropped weights (or attncheck probes for them),
    and a backward with the same seed and offset uses the forward's mask. An attncheck that speaks only version 3
    cannot send them: the client then refuses to serve, saying so.
    `kv_e4m3fn=True`, `kv_e5m2=True`, `kv_int8=True` declare quantised K and V caches in those formats
    (with `kv_scale_per_head=True`, `kv_scale_per_token=True` their scales per kv head or per token and kv head, and
    `kv_zero_points=True` int8 zero points; `kv_ggml_q8_0=True` ... `kv_ggml_q5_1=True` ggml's blocks): fn gets
    `quant`, None for a dense call; in a quantised call (the
    kv-quant-* laws, forward only) k and v are None and `quant` is a QuantizedKV (its format, and k and v as
    QuantCache: codes, scales, zero points, dequantize()).
    `q_dot_ggml_q8=True` declares a compute precision, with ggml's blocks: fn rounds each row of q to ggml's Q8_0
    blocks (Q8_1 with Q4_1 and Q5_1) for its dot with K, as ggml's CPU kernel does; attncheck's bounds widen by it.
    `q_quant=True` (with an FP8 or int8 format) declares Q quantised too: in such a call fn's q is None and
    `quant.q` a QuantCache (FlashAttention 3's FP8 Q and its descale). `p_fp8=True` declares a compute precision
    in quantised calls: P = exp(s - m) cast to FP8 e4m3 for its product with V, as FlashAttention 3's FP8 forward does.
    `paged_quant=True` (with paged=True and a format) declares quantised caches in paged pools, as an FP8 or int8
    paged KV cache holds them: in such a call `paged` and `quant` are both given, quant.k.codes and quant.v.codes are
    the pools (paged.k_pages and paged.v_pages, [num_pages, page_size, H_kv, D] token-major or [num_pages, H_kv,
    page_size, D] head-major, uint8; ggml's [..., D/32, the block's bytes]) and their scales are over the pool's first
    three axes, a key's at its page and slot (per kv head [1, 1, H_kv] or [1, H_kv, 1], per token and head the
    pool's own): `paged.gather(*quant.dequantize())` is the dense float64 k and v.
    `index_list=True` declares selected keys (DeepSeek's DSA, NSA's selection): fn (and a backward) gets
    `index_list`, None or an IndexList (`indices` int32 [B, H_kv, T_q, max_k], -1 padding; `block_size`; to_mask());
    `index_list_blocks=True` declares block indices too (block_size > 1), `index_list_per_query_head=True` one list
    per query head (`per` "query_head", [B, H, T_q, max_k]) where K and V have fewer heads.
    `tree=True` declares trees of draft tokens given by their parents, `tree_bitmask=True` as FlashInfer's packed
    bitmask: fn (and a backward) gets `tree`, None or a Tree (the last T_q keys of each entry are its nodes;
    `parents`, or `bits`, `offsets` and `bit_order`; to_mask(T_k)). Never with ALiBi, windows, chunks or documents.
    """
    declared = {key: bool(on) for key, on in (("lse", lse), ("sinks", sinks), ("softcap", softcap),
                                              ("alibi", alibi), ("bidirectional", bidirectional), ("paged", paged),
                                              ("documents", documents), ("chunked_local", chunked_local),
                                              ("prefix", prefix), ("right_window", right_window),
                                              ("block_mask", block_mask), ("dense_mask", dense_mask),
                                              ("batch_invariant", batch_invariant),
                                              ("query_documents", query_documents), ("strided", strided),
                                              ("layout_invariant", layout_invariant), ("v_head_dim", v_head_dim),
                                              ("bias", bias), ("bias_grad", bias_grad),
                                              ("temperature", temperature), ("rope", rope),
                                              ("rope_interleaved", rope_interleaved), ("qk_norm", qk_norm),
                                              ("qk_norm_eps_outside", qk_norm_eps_outside), ("dropout", dropout),
                                              ("rope_ntk", rope_ntk), ("rope_llama3", rope_llama3),
                                              ("kv_e4m3fn", kv_e4m3fn), ("kv_e5m2", kv_e5m2), ("kv_int8", kv_int8),
                                              ("kv_scale_per_head", kv_scale_per_head),
                                              ("kv_scale_per_token", kv_scale_per_token),
                                              ("kv_zero_points", kv_zero_points), ("kv_ggml_q8_0", kv_ggml_q8_0),
                                              ("kv_ggml_q4_0", kv_ggml_q4_0), ("kv_ggml_q4_1", kv_ggml_q4_1),
                                              ("kv_ggml_q5_0", kv_ggml_q5_0), ("kv_ggml_q5_1", kv_ggml_q5_1),
                                              ("q_dot_ggml_q8", q_dot_ggml_q8), ("q_quant", q_quant),
                                              ("p_fp8", p_fp8), ("paged_quant", paged_quant),
                                              ("index_list", index_list), ("index_list_blocks", index_list_blocks),
                                              ("index_list_per_query_head", index_list_per_query_head),
                                              ("tree", tree), ("tree_bitmask", tree_bitmask),
                                              ("index_list_physical", index_list_physical),
                                              ("index_list_counted", index_list_counted),
                                              ("index_list_current_block", index_list_current_block))}
    if layout_invariant and not strided:
        raise ValueError("serve: layout_invariant=True needs strided=True (the layouts come only to a function "
                         "that declares it reads strided inputs)")
    if bias_grad and not (bias and backward is not None):
        raise ValueError("serve: bias_grad=True needs bias=True and a backward (dBias is what the backward returns "
                         "for the bias it was given)")
    if kv_zero_points and not kv_int8:
        raise ValueError("serve: kv_zero_points=True needs kv_int8=True (only int8 caches have zero points)")
    if (kv_scale_per_head or kv_scale_per_token) and not (kv_e4m3fn or kv_e5m2 or kv_int8):
        raise ValueError("serve: kv_scale_per_head or kv_scale_per_token without a cache format (kv_e4m3fn=True, "
                         "kv_e5m2=True or kv_int8=True)")
    if p_fp8 and not (kv_e4m3fn or kv_e5m2 or kv_int8):
        raise ValueError("serve: p_fp8=True needs an FP8 or int8 cache format (kv_e4m3fn=True, kv_e5m2=True or "
                         "kv_int8=True): P is cast to FP8 only in such a call")
    if (index_list_blocks or index_list_per_query_head or index_list_physical or index_list_counted
            or index_list_current_block) and not index_list:
        raise ValueError("serve: index_list_blocks=True, index_list_per_query_head=True, index_list_physical=True, "
                         "index_list_counted=True and index_list_current_block=True need index_list=True (they say "
                         "how an index list comes and what it means)")
    if paged_quant and not (paged and (kv_e4m3fn or kv_e5m2 or kv_int8 or kv_ggml_q8_0 or kv_ggml_q4_0 or
                                       kv_ggml_q4_1 or kv_ggml_q5_0 or kv_ggml_q5_1)):
        raise ValueError("serve: paged_quant=True needs paged=True and a cache format (kv_e4m3fn=True, ...): it "
                         "declares the two together")
    if q_quant and not (kv_e4m3fn or kv_e5m2 or kv_int8):
        raise ValueError("serve: q_quant=True needs an FP8 or int8 cache format (kv_e4m3fn=True, kv_e5m2=True or "
                         "kv_int8=True): Q comes quantised only with such a cache")
    if q_dot_ggml_q8 and not (kv_ggml_q8_0 or kv_ggml_q4_0 or kv_ggml_q4_1 or kv_ggml_q5_0 or kv_ggml_q5_1):
        raise ValueError("serve: q_dot_ggml_q8=True without a ggml block format (kv_ggml_q8_0=True ... "
                         "kv_ggml_q5_1=True): Q is rounded only for the dot with such a K")
    if query_documents and not documents:
        raise ValueError("serve: query_documents=True needs documents=True (query ids of their own come with the "
                         "key ids)")
    modifiers = [key for key in MODIFIER_KEYWORDS if declared[key]]
    takes = _keywords(fn, "fn", modifiers)
    calls = _framework(framework, device)
    autograd = isinstance(backward, str) and backward == "autograd"
    if isinstance(backward, str) and not (autograd and calls.name == "torch"):
        raise ValueError("serve: backward=%r (expected a function returning (dq, dk, dv), or \"autograd\" with "
                         "framework=\"torch\")" % (backward,))
    if custom_scale is None:
        custom_scale = "scale" in takes
    if key_lengths is None:
        key_lengths = "key_lengths" in takes
    if window is None:
        window = "window" in takes
    for flag, param in ((custom_scale, "scale"), (key_lengths, "key_lengths"), (window, "window")):
        if flag and param not in takes:
            raise TypeError("serve: %s=True but %s has no `%s` parameter" % (
                "custom_scale" if param == "scale" else param, _name(fn), param))
    if len(alignments) > 1 and "alignment" not in takes:
        raise TypeError("serve: two alignments declared but %s has no `alignment` parameter" % _name(fn))
    backward_takes = set()
    if autograd:  # the forward itself is differentiated, with the forward's keywords
        backward_takes = takes
    elif backward is not None:  # paged and quantised calls are forward only: a backward needs no `paged` or `quant`
        backward_takes = _keywords(backward, "backward", [m for m in modifiers if m not in FORWARD_ONLY])
        # A backward that ignores what the forward honours would differentiate another function.
        for flag, param in ((custom_scale, "scale"), (len(alignments) > 1, "alignment"),
                            (key_lengths, "key_lengths"), (window, "window")):
            if flag and param not in backward_takes:
                raise TypeError("serve: %s honours `%s` but backward %s has no `%s` parameter"
                                % (_name(fn), param, _name(backward), param))
    for d in dtypes:
        if d not in DTYPE_CODES:
            raise ValueError("serve: unknown dtype %r (expected one of %s)" % (d, ", ".join(DTYPE_CODES)))
    if empty_rows not in EMPTY_ROWS_CODES:
        raise ValueError("serve: empty_rows is %r (expected None, 'zero', 'nan' or 'any')" % (empty_rows,))
    if cross_lengths is not False and cross_lengths not in CROSS_LENGTHS_CODES:
        raise ValueError("serve: cross_lengths is %r (expected True, False, 'T_q<=T_k' or 'T_q>=T_k')"
                         % (cross_lengths,))
    if not isinstance(max_T, int) or isinstance(max_T, bool) or max_T < 0:
        raise ValueError("serve: max_T is %r (expected 0 for no limit, or the largest T_q and T_k fn accepts)"
                         % (max_T,))
    page_sizes = [int(size) for size in page_sizes] if paged else []
    page_layouts = tuple(page_layouts) if paged else ()
    if paged and (not page_sizes or not page_layouts or any(size < 1 or size > 1 << 20 for size in page_sizes)
                  or any(layout not in PAGE_LAYOUT_CODES for layout in page_layouts)):
        raise ValueError("serve: paged=True with page_sizes %r and page_layouts %r (expected at least one page size in "
                         "[1, 2^20] and at least one of 'token-major', 'head-major')" % (page_sizes, page_layouts))
    head_dims = [int(d) for d in head_dims] if head_dims is not None else []
    if (not isinstance(head_dim_multiple, int) or head_dim_multiple < 1 or not isinstance(max_head_dim, int)
            or max_head_dim < 0 or any(d < 1 for d in head_dims)):
        raise ValueError("serve: head_dim_multiple %r, max_head_dim %r, head_dims %r (expected an int >= 1, an int "
                         ">= 0 (0: no limit), and positive ints)" % (head_dim_multiple, max_head_dim, head_dims))
    # What only version 3 can carry, for the refusal below.
    needs_v3 = [what for what, on in (("cross_lengths=%r" % (cross_lengths,), isinstance(cross_lengths, str)),
                                      ("head_dim_multiple=%d" % head_dim_multiple, head_dim_multiple > 1),
                                      ("max_head_dim=%d" % max_head_dim, max_head_dim > 0),
                                      ("head_dims=%r" % (head_dims,), bool(head_dims)),
                                      ("empty_rows='any'", empty_rows == "any"))
                + tuple(("%s=True" % key, on) for key, on in declared.items()) if on]
    needs_v4 = ["%s=True" % key for key in list(FLAGS4) + list(FLAGS4B) if declared[key]]  # and what only 4 can

    ch = _Channel()
    ftype, payload = ch.read()
    if ftype != HELLO:
        raise ProtocolError("expected a hello frame first, got type %r" % ftype)
    # u32 1 (for version-1 clients), then the newest version attncheck speaks (absent before version 2). The
    # two sides speak the lower of their newest versions.
    first = struct.unpack_from("<I", payload)[0]
    newest = struct.unpack_from("<I", payload, 4)[0] if len(payload) >= 8 else first
    version = min(newest, PROTOCOL_VERSION) if first >= 1 else PROTOCOL_VERSION
    declared1 = {"returns_weights": returns_weights, "custom_scale": custom_scale, "cross_lengths": cross_lengths,
                 "nonfinite_safe": nonfinite_safe}
    flags = sum(CAPS_FLAGS[key] for key, on in declared1.items() if on)
    caps = struct.pack("<IIIIq", version, sum(DTYPE_CODES[d] for d in dtypes),
                       sum(ALIGNMENT_CODES[a] for a in alignments), flags, max_T)
    caps += _string(name) + _string(description)
    if version >= 2:
        declared2 = {"gqa": gqa, "key_lengths": key_lengths, "window": window, "backward": backward is not None}
        flags2 = sum(FLAGS2[key] for key, on in declared2.items() if on)
        caps += struct.pack("<II", flags2, EMPTY_ROWS_CODES[empty_rows] if version >= 3 or empty_rows != "any" else 0)
    if version >= 3:
        flags3 = sum(FLAGS3[key] for key, on in declared.items() if on and key in FLAGS3)
        caps += struct.pack("<IIqqI", flags3, CROSS_LENGTHS_CODES.get(cross_lengths, 0), head_dim_multiple,
                            max_head_dim, len(head_dims))
        caps += b"".join(struct.pack("<qq", d, 0) for d in head_dims)
        caps += struct.pack("<II", sum(PAGE_LAYOUT_CODES[layout] for layout in set(page_layouts)), len(page_sizes))
        caps += b"".join(struct.pack("<q", size) for size in page_sizes)
        if version >= 4:
            caps += struct.pack("<II", sum(FLAGS4[key] for key, on in declared.items() if on and key in FLAGS4),
                                sum(FLAGS4B[key] for key, on in declared.items() if on and key in FLAGS4B))
        elif needs_v4:
            ch.write(REFUSE, _string("this client declares %s, which needs exec protocol version 4, but this "
                                     "attncheck speaks version %d; use a newer attncheck"
                                     % (", ".join(needs_v4), version)))
            sys.exit(2)
    elif needs_v3:
        ch.write(REFUSE, _string("this client declares %s, which needs exec protocol version 3, but this attncheck "
                                 "speaks version %d; use a newer attncheck" % (", ".join(needs_v3), version)))
        sys.exit(2)
    refusal = calls.check_device()
    if refusal:
        ch.write(REFUSE, _string(refusal))
        sys.exit(2)
    ch.write(CAPS, caps)
    if first < 1:
        sys.exit(2)

    fn_name = _name(fn)
    errors = _Errors(fn_name)
    while True:
        ftype, payload = ch.read()
        if ftype is None or ftype == BYE:
            errors.close()
            sys.exit(0)
        if ftype == BACKWARD:
            _answer_backward(ch, fn if autograd else backward, backward_takes, payload, calls, errors, autograd,
                             bias_grad)
            continue
        if ftype != FORWARD:
            raise ProtocolError("expected a forward or backward frame, got type %d" % ftype)
        (q, k, v), kwargs, dtype, want_weights, want_lse, layout = _read_call(payload, backward=False)
        (q, k, v), kwargs = calls.inputs([q, k, v], kwargs, dtype, layout)
        errors.called(dtype)
        try:
            result = fn(q, k, v, **{key: kwargs[key] for key in takes})
            out, weights, row_lse, problem = _unpack_result(result, returns_weights, lse, fn_name, calls.array)
        except Exception as e:  # the implementation's own failure: reported, and the next call goes on
            ch.write(RESULT, _failure(ERROR, errors.raised(dtype, e)))
            continue
        if problem is None and row_lse is not None and row_lse.ndim == 3:
            row_lse = row_lse[..., None]  # [B,H,T_q] -> [B,H,T_q,1], as the wire carries it
        if problem is None and (out.ndim != 4 or (weights is not None and weights.ndim != 4)
                                or (row_lse is not None and row_lse.ndim != 4)):
            problem = "%s returned arrays of shapes %s; expected 4-D [B,H,T_q,D]%s%s" % (
                _name(fn), [a.shape for a in (out, weights, row_lse) if a is not None],
                ", weights [B,H,T_q,T_k]" if weights is not None else "",
                ", lse [B,H,T_q] or [B,H,T_q,1]" if row_lse is not None else "")
        if problem is not None:
            ch.write(RESULT, _failure(WRONG_SIZE, problem))
            continue
        send_w = weights is not None and want_weights
        send_lse = row_lse is not None and want_lse
        reply = struct.pack("<iI", OK, (RESULT_FLAGS["weights"] if send_w else 0)
                            | (RESULT_FLAGS["lse"] if send_lse else 0)) + _string("")
        reply += _tensors((out, dtype), *([(weights, dtype)] if send_w else []),
                          *([(row_lse, "float64")] if send_lse else []))
        ch.write(RESULT, reply)


def _unpack_result(result, returns_weights, returns_lse, name, array=np.asarray):
    """(out, weights or None, lse or None, None) from what fn returned, or (..., message) when it is not what its
    declarations say: out; (out, weights); (out, lse); (out, weights, lse); or a dict of those keys."""
    if isinstance(result, dict):
        unknown = set(result) - {"output", "weights", "lse"}
        if "output" not in result or unknown:
            return None, None, None, "%s returned a dict with keys %s; expected \"output\" and optionally " \
                "\"weights\", \"lse\"" % (name, sorted(result))
        parts = [result["output"], result.get("weights") if returns_weights else None,
                 result.get("lse") if returns_lse else None]
    elif isinstance(result, tuple):
        expected = 1 + bool(returns_weights) + bool(returns_lse)
        if len(result) != expected:
            return None, None, None, "%s returned a tuple of %d; its declarations (returns_weights=%s, lse=%s) " \
                "say %s" % (name, len(result), bool(returns_weights), bool(returns_lse),
                            ["out", "(out, weights)", "(out, lse)", "(out, weights, lse)"][
                                (1 if returns_weights else 0) + (2 if returns_lse else 0)])
        parts = [result[0], result[1] if returns_weights else None, result[-1] if returns_lse else None]
    else:
        parts = [result, None, None]
    out, weights, lse = (None if a is None else array(a) for a in parts)
    return out, weights, lse, None


def _answer_backward(ch, backward, takes, payload, calls, errors, autograd, bias_grad=False):
    """One gradients frame for a backward frame: (dq, dk, dv) from `backward` (or, with `autograd`, from
    torch.autograd through the forward `backward` then is), or the failure; with `bias_grad` and a bias in the call,
    d_bias last."""
    if backward is None:
        raise ProtocolError("got a backward frame, but serve() was given no backward function")
    arrays, kwargs, dtype, _, _, layout = _read_call(payload, backward=True)
    (q, k, v, d_output), kwargs = calls.inputs(arrays, kwargs, dtype, layout)
    errors.called(dtype)
    try:
        keywords = {key: kwargs[key] for key in takes}
        # With a bias in the call and bias_grad=True: d_bias last (its gradient, the bias's shape).
        with_sinks, with_bias = kwargs["sinks"] is not None, bias_grad and kwargs.get("bias") is not None
        if autograd:
            grads = calls.autograd(backward, [q, k, v], keywords, d_output, with_bias)
        else:
            grads = backward(q, k, v, d_output, **keywords)
        # With sinks in the call: (dq, dk, dv, d_sinks), d_sinks [H] (a backward declared with sinks=True); without,
        # a fourth gradient (None, say) is dropped, and so is a last one (a d_bias of None) where no bias came.
        if isinstance(grads, (tuple, list)):
            grads = list(grads)
            d_bias = grads.pop() if with_bias and grads else None
            if bias_grad and not with_bias and len(grads) == 4 + with_sinks and grads[-1] is None:
                grads.pop()  # the d_bias of a call without a bias
            if len(grads) == 4 and not with_sinks:
                grads = grads[:3]
            grads = [calls.array(g) for g in grads] + ([] if d_bias is None else [calls.array(d_bias)])
        else:
            grads = []
    except Exception as e:
        ch.write(GRADIENTS, _failure(ERROR, errors.raised(dtype, e)))
        return
    bias_shape = tuple(kwargs["bias"].shape) if with_bias else None
    if (len(grads) != 3 + with_sinks + with_bias or any(g.ndim != 4 for g in grads[:3])
            or (with_sinks and grads[3].ndim != 1) or (with_bias and tuple(grads[-1].shape) != bias_shape)):
        ch.write(GRADIENTS, _failure(WRONG_SIZE, "%s returned %s; expected (dq, dk, dv%s%s), dq, dk, dv 4-D%s%s"
                                     % (getattr(backward, "__name__", "backward"), [g.shape for g in grads] or "no tuple",
                                        ", d_sinks" if with_sinks else "", ", d_bias" if with_bias else "",
                                        " and d_sinks [H]" if with_sinks else "",
                                        " and d_bias the bias's shape %s" % (list(bias_shape),) if with_bias else "")))
        return
    flags = (GRADIENTS_D_SINKS if with_sinks else 0) | (GRADIENTS_D_BIAS if with_bias else 0)
    reply = struct.pack("<iI", OK, flags) + _string("") + _tensors(*((g, dtype) for g in grads[:3]))
    if with_sinks:
        reply += struct.pack("<q", grads[3].size) + np.ascontiguousarray(grads[3], dtype="<f8").tobytes()
    if with_bias:
        reply += _tensors((grads[-1], dtype))
    ch.write(GRADIENTS, reply)
