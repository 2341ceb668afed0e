"""pytest with the `attncheck` fixture on PyTorch: PyTorch's own causal attention (torch_attention.py), and the
README's hand-written attention at bfloat16 and float32 with torch.autograd as its backward; skipped with the
reason when torch cannot be imported (Debian: apt-get install python3-torch)."""
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (Debian: apt-get install python3-torch)")

from torch_attention import attention as sdpa  # noqa: E402  (after the skip: it imports torch)


def test_torch_sdpa_obeys_every_law(attncheck):
    attncheck.check(sdpa, dtypes=("float32", "float64"), framework="torch", gqa=True, empty_rows="nan")


# The README's example: torch tensors of the case's dtype in, softmax in float32, the output in that dtype.
def attention(q, k, v, scale=None):
    s = (q.float() @ k.float().transpose(-1, -2)) * (scale or q.shape[-1] ** -0.5)
    causal = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril()
    return (s.masked_fill(~causal, float("-inf")).softmax(-1) @ v.float()).to(q.dtype)


def test_attention(attncheck):
    attncheck.check(attention, dtypes=("bfloat16", "float32"), framework="torch", backward="autograd")
