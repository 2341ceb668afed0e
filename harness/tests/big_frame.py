"""A child for the exec: tests that completes the handshake, then answers the first call with a header that
announces a 2^40-byte result and stalls: attncheck must refuse the frame at once, not wait for it."""
import os
import struct
import sys
import time


def read_exactly(n):
    data = b""
    while len(data) < n:
        chunk = os.read(0, n - len(data))
        if not chunk:
            sys.exit(0)
        data += chunk
    return data


def frame(kind, payload):
    return b"ATNC" + struct.pack("<IQ", kind, len(payload)) + payload


hello = read_exactly(16)  # hello: header, then its payload (4 bytes from a version-1 attncheck, 8 from version 2)
read_exactly(struct.unpack("<Q", hello[8:16])[0])
name = b"big-frame"
caps = struct.pack("<IIIIq", 1, 2, 1, 0, 0) + struct.pack("<I", len(name)) + name + struct.pack("<I", 0)
os.write(1, frame(2, caps))
header = read_exactly(16)  # the forward frame: read it whole before answering
read_exactly(struct.unpack("<Q", header[8:16])[0])
os.write(1, b"ATNC" + struct.pack("<IQ", 5, 1 << 40))
time.sleep(1000)
