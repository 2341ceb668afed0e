"""A child for the exec: tests that computes no attention: it echoes the masks' keyword arguments (protocol
version 3) into its outputs, as harness/tests/masks_echo_plugin.c does for the C ABI, so that a test can read
back what the Python client passed. float64 only, D >= 5.

Declares documents, chunked local attention, a prefix, a right window and bidirectional, unless the first
argument is `none` (then it declares none of them, and its function takes none of their keywords: the client
must not pass them). A keyword of the wrong type (ids not int32 [B,T_q]/[B,T_k] numpy arrays or None, chunk_size
or prefix_length not an int, window_right not None or an int) raises, so that the test sees the message.

forward: output (b,h,i,d) = d 0: q_doc_ids[b,i] (-100 for None), 1: prefix_length, 2: window_right (-1 for None),
         3: chunk_size, 4: causal, 5 and up: 0; weights (b,h,i,j) = k_doc_ids[b,j] (-100 for None).
backward: dq as forward's output, dk (b,g,j,d) = k_doc_ids[b,j], dv 0."""
import sys

import numpy as np

import attncheck_plugin

DECLARE = sys.argv[1:] != ["none"]


def check(q, k, kw):
    B, T_q, T_k = q.shape[0], q.shape[2], k.shape[2]
    problems = []
    for name, shape in (("q_doc_ids", (B, T_q)), ("k_doc_ids", (B, T_k))):
        ids = kw[name]
        if ids is not None and (not isinstance(ids, np.ndarray) or ids.dtype != np.int32 or ids.shape != shape):
            problems.append("%s is %r (expected None or int32 %s)" % (name, ids, shape))
    if (kw["q_doc_ids"] is None) != (kw["k_doc_ids"] is None):
        problems.append("one of q_doc_ids and k_doc_ids is None")
    for name in ("chunk_size", "prefix_length"):
        if not isinstance(kw[name], int):
            problems.append("%s is %r (expected an int)" % (name, kw[name]))
    if kw["window_right"] is not None and not isinstance(kw["window_right"], int):
        problems.append("window_right is %r (expected None or an int)" % (kw["window_right"],))
    if not isinstance(kw["causal"], bool):
        problems.append("causal is %r (expected a bool)" % (kw["causal"],))
    if problems:
        raise ValueError("masks call: " + "; ".join(problems))


def echo(q, k, kw):
    B, H, T_q, D = q.shape
    T_k = k.shape[2]
    if D < 5:
        raise ValueError("the echo client takes D >= 5")
    out = np.zeros((B, H, T_q, D))
    qd, kd = kw["q_doc_ids"], kw["k_doc_ids"]
    out[..., 0] = -100 if qd is None else qd[:, None, :]
    out[..., 1] = kw["prefix_length"]
    out[..., 2] = -1 if kw["window_right"] is None else kw["window_right"]
    out[..., 3] = kw["chunk_size"]
    out[..., 4] = 1 if kw["causal"] else 0
    kid = np.full((B, T_k), -100.0) if kd is None else kd.astype(np.float64)
    return out, kid


def attention(q, k, v, alignment="top-left", key_lengths=None, window=None, **kw):
    if not DECLARE:
        unexpected = set(kw) & {"q_doc_ids", "k_doc_ids", "prefix_length", "window_right", "chunk_size", "causal"}
        if unexpected:
            raise ValueError("passed %s without the declarations" % sorted(unexpected))
        kw = {"q_doc_ids": None, "k_doc_ids": None, "prefix_length": 0, "window_right": None, "chunk_size": 0,
              "causal": True}
    check(q, k, kw)
    out, kid = echo(q, k, kw)
    w = np.broadcast_to(kid[:, None, None, :], (q.shape[0], q.shape[1], q.shape[2], k.shape[2])).copy()
    return out, w


def backward(q, k, v, d_output, alignment="top-left", key_lengths=None, window=None, **kw):
    check(q, k, kw)
    dq, kid = echo(q, k, kw)
    dk = np.broadcast_to(kid[:, None, :, None], k.shape).copy()
    return dq, dk, np.zeros(v.shape)


if __name__ == "__main__":
    masks = dict(documents=True, chunked_local=True, prefix=True, right_window=True, bidirectional=True)
    attncheck_plugin.serve(attention, name="masks-client", dtypes=("float64",), returns_weights=True,
                           alignments=("top-left", "bottom-right"), key_lengths=True, window=True, empty_rows="zero",
                           backward=backward if DECLARE else None, **(masks if DECLARE else {}))
