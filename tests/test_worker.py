"""The worker's own entry (python -m accel_kit.engine.worker): bad input is one line and status 2."""
from __future__ import annotations

import json

import pytest

from accel_kit.engine import worker
from accel_kit.engine.result import Result


@pytest.mark.parametrize("content, says", [(None, "No such file"), ("{not json", "Expecting"),
                                           ('{"kind": "train"}', "validation error")])
def test_a_bad_point_file_is_one_line_and_status_2(tmp_path, capsys, content, says):
    point = tmp_path / "point.json"
    if content is not None:
        point.write_text(content)
    assert worker.main(["--point", str(point), "--out", str(tmp_path / "r.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("accel_kit.engine.worker: error: --point") and says in err
    assert not (tmp_path / "r.json").exists()


def test_an_unwritable_result_is_one_line_and_status_2(tmp_path, capsys):
    point = tmp_path / "point.json"
    point.write_text(json.dumps({"kind": "peak", "system": "cpu", "precision": "fp32"}))
    assert worker.main(["--point", str(point), "--out", "/proc/nope/r.json"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "/proc/nope" in err


def test_a_full_disk_at_the_result_is_one_line_and_status_2(tmp_path, capsys, monkeypatch):
    import errno
    import os
    from pathlib import Path

    point = tmp_path / "point.json"
    point.write_text(json.dumps({"kind": "peak", "system": "cpu", "precision": "fp32"}))
    monkeypatch.setattr(worker, "run_point", lambda *a: Result(status="ok"))

    def full(self, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(Path, "write_bytes", full)
    out = tmp_path / "r.json"
    assert worker.main(["--point", str(point), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    # The sweep puts this line in the point's record as the reason the worker gave no result.
    assert err == (f"accel_kit.engine.worker: error: cannot write the result file {str(out)!r}: "
                   "No space left on device\n")
    assert list(tmp_path.iterdir()) == [point]  # no partial left beside it
