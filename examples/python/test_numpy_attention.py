"""pytest with the `attncheck` fixture (harness/python/attncheck_pytest.py): the numpy example must obey every
law at every dtype it declares. Run: python3 -m pytest -p attncheck_pytest examples/python (with
harness/python on PYTHONPATH, or the package installed), attncheck on PATH or --attncheck-bin."""
from numpy_attention import attention


def test_numpy_attention_obeys_every_law(attncheck):
    attncheck.check(attention, dtypes=("float32", "float64"), returns_weights=True,
                    alignments=("top-left", "bottom-right"), nonfinite_safe=True)
