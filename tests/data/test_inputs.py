"""accel_kit.data.inputs: resolving input paths, reading (gzip) lines, decoding UTF-8: errors name file and line."""
import pytest

from accel_kit.data import prepare_text
from accel_kit.errors import DataError


def test_input_errors_name_the_file(tmp_path):
    with pytest.raises(DataError, match=r"missing\.jsonl: no such file"):
        prepare_text([tmp_path / "missing.jsonl"], tmp_path / "out", progress=False)
    (tmp_path / "t.txt").write_bytes(b"line one\nline \xff two\n")
    with pytest.raises(DataError, match=r"t\.txt:2: not valid UTF-8"):
        prepare_text([tmp_path / "t.txt"], tmp_path / "out", progress=False)
    (tmp_path / "data.csv").write_text("text\nhello\n")
    with pytest.raises(DataError, match=r"data\.csv: unsupported input"):
        prepare_text([tmp_path / "data.csv"], tmp_path / "out", progress=False)
    with pytest.raises(DataError, match="no input files"):
        prepare_text([], tmp_path / "out", progress=False)
    (tmp_path / "bad.jsonl.gz").write_bytes(b"not gzip at all")
    with pytest.raises(DataError, match=r"bad\.jsonl\.gz: not a valid gzip file"):
        prepare_text([tmp_path / "bad.jsonl.gz"], tmp_path / "out", progress=False)
