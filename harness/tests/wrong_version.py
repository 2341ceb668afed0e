"""A child for the exec: tests that answers the hello with protocol version 5, which this attncheck lacks."""
import os
import struct
import sys

sys.stdin.buffer.read(24)  # the hello frame: 16-byte header + two versions
payload = struct.pack("<IIIIq", 5, 2, 1, 0, 0) + struct.pack("<I", 0) + struct.pack("<I", 0)
os.write(1, b"ATNC" + struct.pack("<IQ", 2, len(payload)) + payload)
sys.stdin.buffer.read()
