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


# A learned additive bias (T5's buckets, a FlexAttention score_mod written out) with its gradient: autograd takes
# d_bias too (bias_grad=True makes the bias a leaf), summed over the axes the bias broadcasts over by torch itself.
def biased(q, k, v, scale=None, bias=None):
    s = (q.float() @ k.float().transpose(-1, -2)) * (scale or q.shape[-1] ** -0.5)
    if bias is not None:
        s = s + bias.float()
    causal = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril()
    return (s.masked_fill(~causal, float("-inf")).softmax(-1) @ v.float()).to(q.dtype)


def test_a_learned_bias_and_its_gradient(attncheck):
    attncheck.check(biased, dtypes=("float32",), framework="torch", backward="autograd", bias=True, bias_grad=True,
                    laws=("oracle-agreement", "bias-row-shift", "bias-minus-inf", "grad-oracle", "grad-bias"))


# Llama 4's attention temperature tuning, in attention: each query's scores divided by its temperature (the
# position-dependent factor 1/τ multiplies q), with autograd taking dq through the division.
def tempered(q, k, v, scale=None, temperature=None):
    qf = q.float() if temperature is None else q.float() / temperature.float()[..., None]
    s = (qf @ k.float().transpose(-1, -2)) * (scale or q.shape[-1] ** -0.5)
    causal = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril()
    return (s.masked_fill(~causal, float("-inf")).softmax(-1) @ v.float()).to(q.dtype)


def test_a_per_query_temperature(attncheck):
    attncheck.check(tempered, dtypes=("bfloat16", "float32"), framework="torch", backward="autograd", temperature=True,
                    laws=("oracle-agreement", "temperature-as-query-scale", "grad-oracle", "causal-perturbation"))


# Rotary embeddings fused into attention, as Hugging Face's apply_rotary_pos_emb writes them (rotate_half: the
# half-split pairing), with the angles in float32; autograd takes dq and dk through the rotation.
def rotary(q, k, v, scale=None, rope=None):
    def rotate(x, positions):
        if rope is None:
            return x.float()
        half = rope.rotary_dim // 2
        inv_freq = rope.base ** (-torch.arange(half, dtype=torch.float64, device=x.device) * 2 / rope.rotary_dim)
        angles = (positions.double()[..., None] / rope.factor * inv_freq).float()  # [B, T, half]
        cos, sin = torch.cat([angles.cos()] * 2, -1)[:, None], torch.cat([angles.sin()] * 2, -1)[:, None]
        r, rest = x.float()[..., :rope.rotary_dim], x.float()[..., rope.rotary_dim:]
        rotated = r * cos + torch.cat([-r[..., half:], r[..., :half]], -1) * sin
        return torch.cat([rotated, rest], -1)
    qr, kr = rotate(q, None if rope is None else rope.q_positions), rotate(k, None if rope is None else rope.k_positions)
    s = (qr @ kr.transpose(-1, -2)) * (scale or q.shape[-1] ** -0.5)
    causal = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril()
    return (s.masked_fill(~causal, float("-inf")).softmax(-1) @ v.float()).to(q.dtype)


def test_rotary_embeddings(attncheck):
    attncheck.check(rotary, dtypes=("bfloat16", "float32"), framework="torch", backward="autograd", rope=True,
                    laws=("oracle-agreement", "rope-as-rotated-inputs", "rope-relative-positions", "grad-oracle",
                          "causal-perturbation"))


# Dropout on the weights, as a training step writes it: a keep mask from torch's own generator, seeded by the call's
# seed and offset (so the backward, called with the same ones, draws the same mask), kept weights over 1 - p. It
# returns no weights: attncheck reads the mask off the weights it recovers by probing with one-hot V.
def dropped(q, k, v, scale=None, dropout=None):
    s = (q.float() @ k.float().transpose(-1, -2)) * (scale or q.shape[-1] ** -0.5)
    causal = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril()
    w = s.masked_fill(~causal, float("-inf")).softmax(-1)
    if dropout is not None and dropout.p > 0:
        g = torch.Generator(device=w.device)
        g.manual_seed((dropout.seed ^ (dropout.offset * 0x9E3779B97F4A7C15)) % 2**64)
        keep = torch.rand(w.shape, generator=g, device=w.device) >= dropout.p
        w = w * keep / (1 - dropout.p)
    return (w @ v.float()).to(q.dtype)


def test_dropout_from_a_torch_generator(attncheck):
    attncheck.check(dropped, dtypes=("float32", "bfloat16"), framework="torch", backward="autograd", dropout=True,
                    laws=("dropout-as-its-mask", "dropout-mask-determinism", "dropout-keep-rate", "grad-dropout-mask"))


# A quantised KV cache read the way a serving kernel reads it: the codes arrive as uint8 and are decoded here from
# their bits (FP8 e4m3fn and e5m2 by sign, exponent and mantissa; torch.float8_e4m3fn would do it on torch >= 2.1),
# times each group's scale; ggml's blocks through the client's decoder. Both formats' scales per tensor, kv head or
# token, int8 zero points, and Q quantised too (FlashAttention 3's FP8 Q with its descale: q is None then and
# quant.q its cache), then plain attention in float32, returned in float32 (the client rounds it to the case's dtype).
def fp8_decode(codes, fmt):
    b = codes.long()
    if fmt == "int8":
        return torch.where(b >= 128, b - 256, b).float()
    man, bias = (3, 7) if fmt == "e4m3fn" else (2, 15)
    e, m = (b & 0x7F) >> man, (b & ((1 << man) - 1)).float()
    mag = torch.where(e == 0, m * 2.0 ** (1 - bias - man), (m + 2 ** man) * torch.pow(2.0, (e - bias - man).float()))
    return torch.where(b >= 128, -mag, mag)


def cached(q, k, v, scale=None, quant=None):
    if quant is not None:
        def read(cache):
            if cache.scales is None:  # ggml's blocks carry their scales
                return cache.dequantize().float()
            zero = 0 if cache.zero_points is None else cache.zero_points.float()[..., None]
            return (fp8_decode(cache.codes, quant.format) - zero) * cache.scales.float()[..., None]
        k, v = read(quant.k), read(quant.v)
        if quant.q is not None:
            q = read(quant.q)
    group = q.shape[1] // k.shape[1]
    k, v = k.float().repeat_interleave(group, 1), v.float().repeat_interleave(group, 1)
    s = (q.float() @ k.transpose(-1, -2)) * (scale or q.shape[-1] ** -0.5)
    causal = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril()
    return s.masked_fill(~causal, float("-inf")).softmax(-1) @ v


def test_a_quantised_kv_cache_decoded_from_its_bits(attncheck):
    attncheck.check(cached, dtypes=("float32", "bfloat16"), framework="torch", gqa=True, kv_e4m3fn=True, kv_e5m2=True,
                    kv_int8=True, kv_scale_per_head=True, kv_scale_per_token=True, kv_zero_points=True,
                    kv_ggml_q8_0=True, kv_ggml_q4_0=True, kv_ggml_q4_1=True, kv_ggml_q5_0=True, kv_ggml_q5_1=True,
                    q_quant=True, laws=("kv-quant-oracle", "kv-quant-k-scale", "kv-quant-v-scale", "kv-quant-requantise",
                          "kv-quant-dense"))
