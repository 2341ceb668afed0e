"""pytest with the `attncheck` fixture (harness/python/attncheck_pytest.py): the numpy example must obey every
law at every dtype it declares. Run: /usr/bin/python3 -m pytest -p attncheck_pytest examples/python (with
harness/python on PYTHONPATH, or the package installed), attncheck on PATH or --attncheck-bin."""
from numpy_attention import attention


def test_numpy_attention_obeys_every_law(attncheck):
    attncheck.check(attention, dtypes=("float32", "float64"), returns_weights=True,
                    alignments=("top-left", "bottom-right"), nonfinite_safe=True)


def test_numpy_backward_obeys_the_gradient_laws(attncheck):
    """A backward pass crosses as a keyword, as serve(..., backward=fn) takes it."""
    from numpy_backward import attention as attention_with_gradients, backward
    attncheck.check(attention_with_gradients, dtypes=("float64",), laws=("grad-oracle", "grad-causality"),
                    returns_weights=True, alignments=("top-left", "bottom-right"), gqa=True, backward=backward,
                    empty_rows="zero")


def rotary(q, k, v, scale=None, rope=None):
    """Rotary embeddings with the client's own helper, Rope.apply, in every pairing and scaling it declares."""
    import numpy as np
    if rope is not None:
        q, k = rope.apply(q, rope.q_positions), rope.apply(k, rope.k_positions)
    T_q, T_k = q.shape[2], k.shape[2]
    s = np.asarray(q, np.float64) @ np.asarray(k, np.float64).swapaxes(-1, -2) * (scale or q.shape[-1] ** -0.5)
    s = np.where(np.tril(np.ones((T_q, T_k), dtype=bool)), s, -np.inf)
    w = np.exp(s - s.max(axis=-1, keepdims=True))
    return (w / w.sum(axis=-1, keepdims=True)) @ np.asarray(v, np.float64)


def test_rope_apply_in_every_pairing_and_scaling(attncheck):
    attncheck.check(rotary, dtypes=("float64",), rope=True, rope_interleaved=True, rope_ntk=True, rope_llama3=True,
                    laws=("oracle-agreement", "rope-as-rotated-inputs", "rope-relative-positions"))
