# FROZEN: the Python client as it was at protocol version 1 (attncheck fd06874), never edited. exec_test
# runs a child with it first on PYTHONPATH, to prove that clients of version 1 keep working.
"""Serve a Python attention function to attncheck over its exec: protocol (harness/PROTOCOL.md).

    import attncheck_plugin

    def attention(q, k, v, scale=None):      # numpy arrays: q [B,H,T_q,D], k and v [B,H,T_k,D]
        ...                                  # your code
        return out                           # [B,H,T_q,D] (or (out, weights) with returns_weights=True)

    attncheck_plugin.serve(attention, name="my-attention", dtypes=("float32", "float64"))

then `attncheck check --impl exec:'/usr/bin/python3 my_attention.py'`. The function is called with the
keyword arguments it declares among `scale` (None: use 1/sqrt(D)), `alignment` ("top-left" or
"bottom-right", for T_q != T_k) and `dtype` ("float32", "float64", "float16", "bfloat16"). Arrays come as
float64, float32 or float16; bfloat16 comes as float32 holding bfloat16 values, and results are rounded
back to bfloat16. Only numpy (Debian's python3-numpy) is needed.
"""

import inspect
import os
import struct
import sys
import traceback

import numpy as np

PROTOCOL_VERSION = 1
MAGIC = b"ATNC"
HELLO, CAPS, REFUSE, FORWARD, RESULT, BYE = 1, 2, 3, 4, 5, 6
OK, ERROR, UNSUPPORTED, WRONG_SIZE = 0, 1, 2, 3

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


class _Channel:
    """Frames over the inherited stdin/stdout; stdout is moved aside so that a stray print() goes to stderr."""

    def __init__(self):
        self.inp = os.fdopen(os.dup(0), "rb")
        self.out = os.fdopen(os.dup(1), "wb")
        os.dup2(2, 1)
        sys.stdout = sys.stderr

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


def _string(s):
    b = s.encode("utf-8")
    return struct.pack("<I", len(b)) + b


def _failure(status, message):
    return struct.pack("<iI", status, 0) + _string(message)


def serve(fn, name="python", description="", dtypes=("float32", "float64"), returns_weights=False,
          custom_scale=None, alignments=("top-left",), cross_lengths=True, max_T=0, nonfinite_safe=False):
    """Answers attncheck's calls with `fn` until attncheck is done, then exits 0.

    The keywords declare what `fn` accepts, so the generators only produce such cases: `dtypes`, whether it
    returns (out, weights), whether it honours `scale` (default: whether fn has a `scale` parameter),
    the causal `alignments` it implements when T_q != T_k, the largest T (`max_T`, 0: no limit), and
    `nonfinite_safe` when a NaN or Inf in a future key or value never reaches an output (a select mask).
    """
    params = inspect.signature(fn).parameters
    takes = {p for p in ("scale", "alignment", "dtype") if p in params}
    if custom_scale is None:
        custom_scale = "scale" in takes
    if custom_scale and "scale" not in takes:
        raise TypeError("serve: custom_scale=True but %s has no `scale` parameter" % fn.__name__)
    if len(alignments) > 1 and "alignment" not in takes:
        raise TypeError("serve: two alignments declared but %s has no `alignment` parameter" % fn.__name__)
    for d in dtypes:
        if d not in DTYPE_CODES:
            raise ValueError("serve: unknown dtype %r (expected one of %s)" % (d, ", ".join(DTYPE_CODES)))

    ch = _Channel()
    ftype, payload = ch.read()
    if ftype != HELLO:
        raise ProtocolError("expected a hello frame first, got type %r" % ftype)
    (version,) = struct.unpack_from("<I", payload)
    flags = ((1 if returns_weights else 0) | (2 if custom_scale else 0) | (4 if cross_lengths else 0)
             | (8 if nonfinite_safe else 0))
    caps = struct.pack("<IIIIq", PROTOCOL_VERSION, sum(DTYPE_CODES[d] for d in dtypes),
                       sum(ALIGNMENT_CODES[a] for a in alignments), flags, max_T)
    ch.write(CAPS, caps + _string(name) + _string(description))
    if version != PROTOCOL_VERSION:
        sys.exit(2)

    while True:
        ftype, payload = ch.read()
        if ftype is None or ftype == BYE:
            sys.exit(0)
        if ftype != FORWARD:
            raise ProtocolError("expected a forward frame, got type %d" % ftype)
        dcode, acode, fflags, _, scale = struct.unpack_from("<IIIId", payload)
        qs = struct.unpack_from("<4q", payload, 24)
        ks = struct.unpack_from("<4q", payload, 56)
        dtype = DTYPE_NAMES[dcode]
        size = np.dtype(WIRE[dtype]).itemsize
        nq, nk = int(np.prod(qs)) * size, int(np.prod(ks)) * size
        off = 88
        q = _decode(payload[off:off + nq], dtype, qs)
        k = _decode(payload[off + nq:off + nq + nk], dtype, ks)
        v = _decode(payload[off + nq + nk:off + nq + 2 * nk], dtype, ks)
        kwargs = {"scale": scale if fflags & 1 else None, "alignment": ALIGNMENT_NAMES[acode], "dtype": dtype}
        try:
            result = fn(q, k, v, **{key: kwargs[key] for key in takes})
        except Exception as e:  # the implementation's own failure: reported, and the next call goes on
            traceback.print_exc()
            ch.write(RESULT, _failure(ERROR, "%s: %s" % (type(e).__name__, e)))
            continue
        weights = None
        if returns_weights and isinstance(result, tuple):
            result, weights = result
        out = np.asarray(result)
        if out.ndim != 4 or (weights is not None and np.asarray(weights).ndim != 4):
            ch.write(RESULT, _failure(WRONG_SIZE, "%s returned an array of shape %s; expected 4-D [B,H,T_q,D]"
                                      % (fn.__name__, out.shape)))
            continue
        send_w = weights is not None and bool(fflags & 2)
        reply = struct.pack("<iI", OK, 1 if send_w else 0) + _string("")
        reply += struct.pack("<4q", *out.shape) + _encode(out, dtype)
        if send_w:
            w = np.asarray(weights)
            reply += struct.pack("<4q", *w.shape) + _encode(w, dtype)
        ch.write(RESULT, reply)
