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
