"""Bytes from a plug-in are data: a name, an error message or stderr output that is not UTF-8 (0xFF, 0xFE, a
lone continuation byte) is kept as \\xHH text in every report format and on the terminal, and never costs
the run."""
import json

from conftest import PYTHON, HERE, bad_plugin, run

CLIENT = HERE.parent / "harness" / "tests" / "bad_client.py"


def every_report_is_valid_utf8(folder):
    files = [f for f in folder.rglob("*") if f.is_file()]
    assert files, f"no reports in {folder}"
    for f in files:
        text = f.read_bytes().decode("utf-8")  # strict: raises on any invalid byte
        if f.suffix == ".json":
            json.loads(text)
    return files


def test_non_utf8_name_message_and_stderr_of_a_plugin(tmp_path, marker):
    r = run(["check", "--impl", f"plugin:{bad_plugin('non_utf8')}", "--cases", "20", "--no-corpus",
             "--report-dir", tmp_path / "r"], tmp_path)
    assert r.rc == 1, r
    assert "internal error" not in r.text, r
    assert "bad-\\xFF-plugin" in r.out, r  # the name, as \xHH
    assert "bad \\xFF\\xFE bytes \\x80 in the message" in r.out, r
    files = every_report_is_valid_utf8(tmp_path / "r")
    assert any(f.suffix == ".html" for f in files) and any(f.name == "junit.xml" for f in files)
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert "\\xFF" in json.dumps(summary)


def test_non_utf8_stderr_of_an_exec_client_that_dies(tmp_path, marker):
    r = run(["check", "--impl", f"exec:{PYTHON} {CLIENT} nonutf8", "--dtype", "float64", "--property",
             "oracle-agreement", "--no-corpus", "--report-dir", tmp_path / "r"], tmp_path)
    assert r.rc == 1, r
    assert "stderr \\xFF\\xFE\\x80 before dying" in r.out + (tmp_path / "r" / "oracle-agreement.md").read_text(), r
    every_report_is_valid_utf8(tmp_path / "r")
