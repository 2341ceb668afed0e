#!/usr/bin/env python3
"""Writes the fuzz targets' seed corpora (fuzz/corpus/<input kind>/): valid protocol frames built from
harness/PROTOCOL.md's layout, and the counterexample reports in reports/examples. Rerun after a format change."""
import glob
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DTYPES = {"f32": (1, "<f", 4), "f64": (2, "<d", 8)}  # the codes and layouts of PROTOCOL.md


def frame(kind, payload):
    return b"ATNC" + struct.pack("<IQ", kind, len(payload)) + payload


def text(s):
    b = s.encode()
    return struct.pack("<I", len(b)) + b


def shape(*s):
    return struct.pack("<4q", *s)


def tensor(fmt, n, seed):
    return b"".join(struct.pack(fmt, ((i * 7 + seed) % 11 - 5) / 4) for i in range(n))


def write(target, name, data):
    with open(os.path.join(HERE, "corpus", target, name), "wb") as f:
        f.write(data)


def call(code, fmt, align, q_shape, k_shape, key_lengths=None, window=None, weights=True):
    """A forward frame's payload (PROTOCOL.md): header fields, shapes, version 2's key lengths and window, q, k, v."""
    flags = 1 | (2 if weights else 0) | (4 if key_lengths is not None else 0) | (8 if window is not None else 0)
    p = struct.pack("<IIIId", code, align, flags, 0, 0.5) + shape(*q_shape) + shape(*k_shape)
    if key_lengths is not None:
        p += struct.pack("<%dq" % len(key_lengths), *key_lengths)
    if window is not None:
        p += struct.pack("<q", window)
    nq, nk = prod(q_shape), prod(k_shape)
    return p + tensor(fmt, nq, 3) + tensor(fmt, nk, 4) + tensor(fmt, nk, 5)


def prod(s):
    n = 1
    for x in s:
        n *= x
    return n


def main():
    # caps: version 1, and version 2 with flags2 (1 gqa, 2 key lengths, 4 window, 8 backward) and empty rows.
    caps = struct.pack("<IIIIq", 1, 0b1111, 0b11, 0b1111, 0) + text("seed") + text("a seed implementation")
    caps2 = (struct.pack("<IIIIq", 2, 0b1111, 0b11, 0b1111, 0) + text("seed") + text("a seed implementation") +
             struct.pack("<II", 0b1111, 1))
    write("protocol_parent", "caps", b"\x00" + caps)
    write("protocol_parent", "caps_frame", b"\x00" + frame(2, caps))
    write("protocol_parent", "caps_v2", b"\x00" + caps2)
    write("protocol_parent", "caps_v2_nan_rows", b"\x00" + caps2[:-4] + struct.pack("<I", 2))
    write("protocol_parent", "refusal", b"\x01" + struct.pack("<iI", 1, 0) + text("this kernel needs D % 4 == 0"))
    write("protocol_parent", "gradients_refusal",
          b"\x01" + struct.pack("<iI", 2, 0) + text("this kernel has no backward for a window"))
    hello1 = frame(1, struct.pack("<I", 1))
    hello2 = frame(1, struct.pack("<II", 1, 2))  # version 2's hello: 1 first, then the newest version
    for i, (dt, (code, fmt, size)) in enumerate(DTYPES.items()):
        B, H, H_kv, T, D = 1, 2, 1, 3, 2
        out = shape(B, H, T, D) + tensor(fmt, B * H * T * D, 1)
        weights = shape(B, H, T, T) + tensor(fmt, B * H * T * T, 2)
        write("protocol_parent", "result_" + dt, bytes([code - 1]) + struct.pack("<iI", 0, 0) + text("") + out)
        write("protocol_parent", "result_weights_" + dt,
              bytes([code - 1]) + struct.pack("<iI", 0, 1) + text("") + out + weights)
        # gradients (v2): dQ [B,H,T_q,D], then dK and dV [B,H_kv,T_k,D] (grouped heads: H_kv < H).
        kv = shape(B, H_kv, T, D) + tensor(fmt, B * H_kv * T * D, 6)
        write("protocol_parent", "gradients_gqa_" + dt,
              bytes([code - 1]) + struct.pack("<iI", 0, 0) + text("") + out + kv + kv)

        for align in (1, 2):
            T_q, T_k = (3, 3) if align == 1 else (2, 4)
            fwd = call(code, fmt, align, (B, H, T_q, D), (B, H, T_k, D))
            write("protocol_child", "session_%s_align%d" % (dt, align), hello1 + frame(4, fwd) + frame(6, b""))
        # Version 2: grouped heads, key lengths and a window in a forward frame, then a backward frame (the
        # same fields without weights, then dO), each answered before the next.
        B2, T_q, T_k = 2, 3, 4
        q_shape, k_shape = (B2, H, T_q, D), (B2, H_kv, T_k, D)
        fwd2 = call(code, fmt, 2, q_shape, k_shape, key_lengths=[4, 2], window=1)
        bwd2 = call(code, fmt, 2, q_shape, k_shape, key_lengths=[4, 2], window=1, weights=False)
        bwd2 += tensor(fmt, prod(q_shape), 7)
        write("protocol_child", "session_v2_%s" % dt, hello2 + frame(4, fwd2) + frame(7, bwd2) + frame(6, b""))
        bwd_plain = call(code, fmt, 1, (1, H, 3, D), (1, H, 3, D), weights=False) + tensor(fmt, H * 3 * D, 8)
        write("protocol_child", "backward_%s" % dt, hello2 + frame(7, bwd_plain) + frame(6, b""))
    # Version 3: a paged forward frame (flags 4 and 512; PROTOCOL.md, "Paged K and V"): two sequences of 3 and 2
    # keys in token-major pages of 2, tables {2, 0, -1} and {1, INT32_MAX, -1} (junk past each sequence's pages),
    # pools [3, 2, H_kv, D] with NaN in the free slots, then bye.
    hello3 = frame(1, struct.pack("<II", 1, 3))
    q_shape, k_shape = (2, 2, 2, 2), (2, 1, 3, 2)
    paged = struct.pack("<IIIId", 2, 1, 1 | 2 | 4 | 512, 0, 0.5) + shape(*q_shape) + shape(*k_shape)
    paged += struct.pack("<2q", 3, 2) + struct.pack("<IIqqq", 1, 0, 2, 3, 3)
    paged += struct.pack("<6i", 2, 0, -1, 1, 2 ** 31 - 1, -1) + tensor("<d", prod(q_shape), 3)
    nan = struct.pack("<d", float("nan"))
    for seed in (4, 5):  # page 0: sequence 0's key 2 and a free slot; page 1: sequence 1's keys; page 2: keys 0, 1
        slot = lambda n: tensor("<d", 2, seed + n)
        paged += slot(2) + nan * 2 + slot(3) + slot(4) + slot(0) + slot(1)
    write("protocol_child", "session_v3_paged_f64", hello3 + frame(4, paged) + frame(6, b""))
    # Version 3: the masks beyond causal (PROTOCOL.md, "Masks beyond causal") in a forward and a backward frame:
    # prefix 1, right window 0, chunks of 2, and documents: key ids {0, 0, 1} and {0, 1, 1}, query ids (top-left,
    # query i at key i) {0, 0} and {0, 1}; then bye.
    q_shape, k_shape = (2, 1, 2, 2), (2, 1, 3, 2)

    def masked(flags):
        m = struct.pack("<IIIId", 2, 1, flags | 1024 | 2048 | 4096 | 8192, 0, 0.5) + shape(*q_shape) + shape(*k_shape)
        m += struct.pack("<3q", 1, 0, 2) + struct.pack("<4i", 0, 0, 0, 1) + struct.pack("<6i", 0, 0, 1, 0, 1, 1)
        return m + tensor("<d", prod(q_shape), 1) + tensor("<d", prod(k_shape), 2) + tensor("<d", prod(k_shape), 3)

    write("protocol_child", "session_v3_masks_f64",
          hello3 + frame(4, masked(1 | 2)) + frame(7, masked(1) + tensor("<d", prod(q_shape), 4)) + frame(6, b""))
    # Version 3: a block mask and a dense mask (PROTOCOL.md, "Block and dense masks") in a forward and a backward
    # frame: blocks of 1 x 2 over T_q = 2, T_k = 3 (kinds {full, partial} and {empty, partial}, broadcast over batch
    # and heads), partial cells [1, 1, 2, 3], and a dense mask per batch entry [2, 1, 2, 3]; then bye.
    def cells(flags):
        m = struct.pack("<IIIId", 2, 1, flags | 16384 | 32768, 0, 0.5) + shape(*q_shape) + shape(*k_shape)
        m += struct.pack("<6q", 1, 2, 1, 1, 2, 2) + bytes([2, 1, 0, 1])
        m += struct.pack("<2q", 1, 1) + bytes([1, 0, 1, 0, 1, 0])
        m += struct.pack("<2q", 2, 1) + bytes([1, 1, 0, 1, 0, 1, 0, 1, 1, 1, 1, 1])
        return m + tensor("<d", prod(q_shape), 1) + tensor("<d", prod(k_shape), 2) + tensor("<d", prod(k_shape), 3)

    write("protocol_child", "session_v3_cell_masks_f64",
          hello3 + frame(4, cells(1 | 2)) + frame(7, cells(1) + tensor("<d", prod(q_shape), 4)) + frame(6, b""))
    write("protocol_child", "hello_only", hello1)
    write("protocol_child", "hello_v2_only", hello2)
    write("protocol_child", "wrong_version", frame(1, struct.pack("<I", 0)))

    for path in sorted(glob.glob(os.path.join(ROOT, "reports/examples/*/*.json"))):
        if path.endswith("summary.json") or os.path.getsize(path) > 64 * 1024:
            continue
        with open(path, "rb") as f:
            doc = f.read()
        name = os.path.basename(os.path.dirname(path)) + "_" + os.path.basename(path)
        # A report and a corpus entry are the same document: fuzz_counterexample and fuzz_corpus share these.
        write("counterexample", name, doc)

    # One seed per refusal of bad data: each is bad data the command must refuse with exit 2 (the reader, the
    # reproduce-string decode, the capability and bounds checks), never exit 3 or a verdict.
    import json
    base_path = os.path.join(ROOT, "reports/examples/mutant-mask-zero/zero-future-weight.json")
    if os.path.exists(base_path):
        with open(base_path) as f:
            base = json.load(f)

        def spoil(name, change):
            doc = json.loads(json.dumps(base))
            change(doc)
            write("counterexample", "refuse_" + name + ".json", json.dumps(doc, indent=1).encode())

        spoil("reproduce_garbage", lambda d: d.update(reproduce="!!!"))
        spoil("reproduce_base64_length", lambda d: d.update(reproduce="ABC"))
        spoil("reproduce_huge_length", lambda d: d.update(reproduce="B" + "/" * 20))
        spoil("exec_implementation", lambda d: d.update(implementation="exec:touch /tmp/attncheck-pwned; true"))
        spoil("plugin_implementation", lambda d: d.update(implementation="plugin:/tmp/attncheck-evil.so"))
        spoil("max_T_tail_2_40", lambda d: d["generator"].update(max_T_tail=2 ** 40))
        spoil("max_B_2_31", lambda d: d["generator"].update(max_B=2 ** 31 - 1))
        spoil("max_H_negative", lambda d: d["generator"].update(max_H=-1))
        spoil("max_size_huge", lambda d: d["generator"].update(max_size=2 ** 63))
        spoil("shape_huge", lambda d: d["generator"].update(shape=[100000, 100000, 1, 1, 1]))
        spoil("seed_negative", lambda d: d.update(seed=-1))
        for name, scale in (("nan", "nan"), ("inf", "inf"), ("zero", 0), ("negative", -1)):
            spoil("scale_" + name, lambda d, scale=scale: d["case"]["problem"].update(scale=scale))
        # A grouped-query case with key lengths and a window: outside most implementations' capabilities.
        def gqa(d):
            p = d["case"]["problem"]
            p["q"] = {"shape": [1, 2, 2, 1], "values": [[[[1], [2]], [[3], [4]]]]}
            for t in ("k", "v"):
                p[t] = {"shape": [1, 1, 2, 1], "values": [[[[1], [0]]]]}
            p["key_lengths"], p["window"] = [1], 0
            d["case"]["variant"] = None
        spoil("gqa_padding_window", gqa)


if __name__ == "__main__":
    main()
