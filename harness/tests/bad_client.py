"""A Python implementation for the exec: tests that misbehaves in the way argv[1] names, once the case is big
enough (so shrinking has something to do), and is plain float64 causal attention otherwise."""
import os
import signal
import struct
import sys
import time

import numpy as np

import attncheck_plugin

MODE = sys.argv[1]


def attention(q, k, v, scale=None):
    T_q, T_k, D = q.shape[2], k.shape[2], q.shape[3]
    if MODE == "raise" and T_q >= 2:
        raise ZeroDivisionError("kernel blew up at T_q = %d" % T_q)
    if MODE == "exit" and T_q >= 2:
        os._exit(3)
    if MODE == "segv" and T_q >= 2:
        os.kill(os.getpid(), signal.SIGSEGV)
    if MODE == "hang" and T_k >= 2:
        time.sleep(1000)
    if MODE in ("nonutf8", "crashthenhang") and T_q >= 2:
        if MODE == "nonutf8":
            os.write(2, b"stderr \xff\xfe\x80 before dying\n")
        os._exit(3)
    if MODE == "print":
        print("debug output that must not reach the protocol", T_q)
    s = q @ k.swapaxes(-1, -2) * (scale or 1 / np.sqrt(D))
    s = np.where(np.tril(np.ones((T_q, T_k), dtype=bool)), s, -np.inf)
    w = np.exp(s - s.max(axis=-1, keepdims=True))
    w /= w.sum(axis=-1, keepdims=True)
    out = w @ v
    if MODE == "shape" and D >= 2:
        return out[..., :-1]
    if MODE == "nan" and T_q >= 2:
        out[..., -1, 0] = np.nan
    if MODE == "noweights" and T_q >= 2:
        return out
    return (out, w) if MODE in ("weights", "print", "noweights") else out


def backward(q, k, v, d_output, scale=None):
    """Zero gradients, but dk and dv with one head per query head instead of one per kv head."""
    return np.zeros(q.shape), np.zeros(q.shape[:2] + k.shape[2:]), np.zeros(q.shape[:2] + k.shape[2:])


def hanging_backward(q, k, v, d_output, scale=None):
    """Never answers once T_k reaches 2 (zero gradients below that: only the timeouts matter here)."""
    if k.shape[2] >= 2:
        time.sleep(1000)
    return np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)


def misanswer():
    """The answers go out wrong on the wire, whatever the kernel computed: "twice" sends every result frame two
    times (the second 5 ms after the first, and the next read 50 ms after that), "badstatus" with a status no version defines, "badflags" with a flag bit no version defines, "extravalues" with one
    value more than its shapes announce."""
    write = attncheck_plugin._Channel.write

    def patched(self, ftype, payload):
        if ftype == attncheck_plugin.RESULT and MODE == "badstatus":
            payload = struct.pack("<i", 9) + payload[4:]
        if ftype == attncheck_plugin.RESULT and MODE == "badflags":
            payload = payload[:4] + struct.pack("<I", struct.unpack_from("<I", payload, 4)[0] | 4) + payload[8:]
        if ftype == attncheck_plugin.RESULT and MODE == "extravalues":
            payload += struct.pack("<d", 1.0)  # one value more than the shapes it sent announce
        write(self, ftype, payload)
        if ftype == attncheck_plugin.RESULT and MODE == "twice":
            time.sleep(0.005)  # apart from the first, so that a reader may take it for the next call's answer...
            write(self, ftype, payload)
            time.sleep(0.05)  # ...and that call's own answer comes so much later that it cannot be taken for one frame

    attncheck_plugin._Channel.write = patched


if __name__ == "__main__":
    if MODE in ("twice", "badstatus", "badflags", "extravalues"):
        misanswer()
    if MODE == "slowstart":
        time.sleep(1000)  # a start-up that takes its time (loading weights, warming a device)
    if MODE == "crashthenhang":
        # The first process leaves a mark in the file argv[2] names; every one started after it hangs before
        # its handshake, as a client whose start-up waits on a device the crash left locked.
        if os.path.exists(sys.argv[2]):
            time.sleep(1000)
        open(sys.argv[2], "w").close()
    # Protocol-2 keywords only where a mode needs them: "weights" also runs under the frozen version-1 client.
    extra = {"gqa": True, "backward": backward} if MODE == "dkshape" else {}
    if MODE == "emptyrows":
        extra = {"empty_rows": "nans"}
    if MODE == "hangbackward":
        extra = {"backward": hanging_backward}
    if MODE == "negmaxt":
        extra = {"max_T": -1}  # "no limit", as some believe
    attncheck_plugin.serve(attention, name="bad-client-" + MODE, dtypes=("float64",),
                           returns_weights=MODE in ("weights", "print", "noweights"), **extra)
