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


def main():
    caps = struct.pack("<IIIIq", 1, 0b1111, 0b11, 0b1111, 0) + text("seed") + text("a seed implementation")
    write("protocol_parent", "caps", b"\x00" + caps)
    write("protocol_parent", "caps_frame", b"\x00" + frame(2, caps))
    write("protocol_parent", "refusal", b"\x01" + struct.pack("<iI", 1, 0) + text("this kernel needs D % 4 == 0"))
    for i, (dt, (code, fmt, size)) in enumerate(DTYPES.items()):
        B, H, T, D = 1, 2, 3, 2
        out = shape(B, H, T, D) + tensor(fmt, B * H * T * D, 1)
        weights = shape(B, H, T, T) + tensor(fmt, B * H * T * T, 2)
        write("protocol_parent", "result_" + dt, bytes([code - 1]) + struct.pack("<iI", 0, 0) + text("") + out)
        write("protocol_parent", "result_weights_" + dt,
              bytes([code - 1]) + struct.pack("<iI", 0, 1) + text("") + out + weights)

        hello = frame(1, struct.pack("<I", 1))
        for align in (1, 2):
            T_q, T_k = (3, 3) if align == 1 else (2, 4)
            fwd = struct.pack("<IIIId", code, align, 3, 0, 0.5) + shape(B, H, T_q, D) + shape(B, H, T_k, D)
            fwd += tensor(fmt, B * H * T_q * D, 3) + tensor(fmt, B * H * T_k * D, 4) + tensor(fmt, B * H * T_k * D, 5)
            write("protocol_child", "session_%s_align%d" % (dt, align), hello + frame(4, fwd) + frame(6, b""))
    write("protocol_child", "hello_only", frame(1, struct.pack("<I", 1)))
    write("protocol_child", "wrong_version", frame(1, struct.pack("<I", 2)))

    for path in sorted(glob.glob(os.path.join(ROOT, "reports/examples/*/*.json"))):
        if path.endswith("summary.json") or os.path.getsize(path) > 64 * 1024:
            continue
        with open(path, "rb") as f:
            doc = f.read()
        name = os.path.basename(os.path.dirname(path)) + "_" + os.path.basename(path)
        # A report and a corpus entry are the same document: fuzz_counterexample and fuzz_corpus share these.
        write("counterexample", name, doc)

if __name__ == "__main__":
    main()
