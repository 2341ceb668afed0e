"""pytest with the `attncheck` fixture on PyTorch's own causal attention (torch_attention.py); skipped with
the reason when torch cannot be imported (Debian: apt-get install python3-torch)."""
import pytest

pytest.importorskip("torch", reason="PyTorch is not installed (Debian: apt-get install python3-torch)")

from torch_attention import attention  # noqa: E402  (after the skip: it imports torch)


def test_torch_sdpa_obeys_every_law(attncheck):
    attncheck.check(attention, dtypes=("float32",))
