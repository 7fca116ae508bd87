"""A full disk, a size limit or an output folder removed mid-run: one line naming the path, exit 2, and
every record written before it intact (accel_kit.atomic.output_errors, results.append_record).

The in-process tests stand a fake worker in for the measurement (milliseconds a point) and make the
disk fail at a chosen write; the subprocess test fills a real file up to the kernel's size limit
(RLIMIT_FSIZE, with SIGXFSZ ignored the write fails with EFBIG), as a full disk does, without root.
"""
import errno
import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from cli_checks import fail_one_line

from accel_kit import results
from accel_kit.atomic import write_text_atomic
from accel_kit.errors import OutputError

GAS = ["run", "gas", "--profile", "smoke", "--no-figures", "-q"]  # 4 points


@pytest.fixture
def fake_worker(monkeypatch):
    """The sweep's worker replaced by an instant one; the list holds a hook called before each point."""
    from accel_kit.engine import sweep
    from accel_kit.engine.result import Result

    before = []

    def run_worker(point, **kw):
        for hook in before:
            hook()
        return Result(status="ok", metrics={"tokens_per_s": 10.0}, times_s=[1.0, 1.1])

    monkeypatch.setattr(sweep, "run_worker", run_worker)
    return before


def _records_fd(fd: int) -> bool:
    try:
        return os.readlink(f"/proc/self/fd/{fd}").endswith(".jsonl")
    except OSError:
        return False


def test_a_disk_full_mid_sweep_is_one_line_and_the_records_before_it_are_intact(fake_worker, monkeypatch, capsys,
                                                                                  tmp_path):
    if not Path("/proc/self/fd").is_dir():
        pytest.skip("needs /proc/self/fd to tell the records file's writes from others")
    real_write, calls = os.write, []

    def write(fd, data):
        if not _records_fd(fd):
            return real_write(fd, data)
        calls.append(len(data))
        if len(calls) == 3:  # the third record: half of it fits, as on a disk that fills up
            return real_write(fd, bytes(data[: len(data) // 2]))
        if len(calls) > 3:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)
    err = fail_one_line([*GAS, "--output-dir", str(tmp_path)], capsys)
    path = tmp_path / "gas" / "cpu.jsonl"
    assert err == f"accel-kit: error: cannot write the records {str(path)!r}: No space left on device\n"
    monkeypatch.setattr(os, "write", real_write)
    text = path.read_text()
    assert text.endswith("\n") and len(text.splitlines()) == 2  # the half line was cut off again
    assert [json.loads(line)["status"] for line in text.splitlines()] == ["ok", "ok"]
    assert len(results.load(path)) == 2


def test_the_output_folder_removed_mid_sweep_is_one_line_naming_it(fake_worker, capsys, tmp_path):
    import shutil

    study_dir, points = tmp_path / "gas", []
    # Before the third point, once two records are in the folder: the user removes it.
    fake_worker.append(lambda: points.append(1) or len(points) == 3 and shutil.rmtree(study_dir))
    err = fail_one_line([*GAS, "--output-dir", str(tmp_path)], capsys)
    assert err == (f"accel-kit: error: cannot write the records {str(study_dir / 'cpu.jsonl')!r}: "
                   f"its folder {str(study_dir)!r} is gone (removed during the run?)\n")
    assert not study_dir.exists()  # not made again to hold the rest of the sweep alone


def test_a_figure_on_a_full_disk_is_one_line_and_leaves_the_old_one(monkeypatch, tmp_path):
    target = tmp_path / "fig.html"
    target.write_text("old")

    def full(self, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(Path, "write_bytes", full)
    with pytest.raises(OutputError) as info:
        write_text_atomic(target, "new", what="figure")
    assert str(info.value) == f"cannot write the figure {str(target)!r}: No space left on device"
    assert info.value.errno == errno.ENOSPC and info.value.path == str(target)
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["fig.html"]


def test_an_error_that_is_not_the_disks_keeps_its_traceback(tmp_path):
    with pytest.raises(IsADirectoryError):
        record = results.make_record(study="s", system="cpu", status="ok", params={}, run_id="r")
        results.append_record(tmp_path, record)  # a folder given as the records file: a bug, not the disk


def _size_limit(limit_bytes: int):
    def apply():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of killing
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))
    return apply


@pytest.mark.slow
def test_a_real_size_limit_mid_study_is_one_line_exit_2_and_the_records_load(tmp_path):
    # The microbenchmark's records are about 3 KB each: 7000 bytes take two, the third meets the limit
    # part-way, as on a full disk. Its worker's result file (in the temporary folder) is smaller than that.
    limit = 7000
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parent.parent),
                                                        os.environ.get("PYTHONPATH", "")]))
    argv = [sys.executable, "-m", "accel_kit.cli", "run", "microbenchmark", "--profile", "smoke", "-p", "impls",
            "[native]", "-p", "precisions", "[fp32]", "-p", "measure_peak", "false", "--output-dir", str(tmp_path),
            "--no-figures", "-q"]  # four points on every CPU kind (auto's list differs), no peak point first
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600,
                          preexec_fn=_size_limit(limit))
    path = tmp_path / "microbenchmark" / "cpu.jsonl"
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr == f"accel-kit: error: cannot write the records {str(path)!r}: File too large\n"
    text = path.read_text()
    assert path.stat().st_size <= limit and text.endswith("\n")
    lines = text.splitlines()
    assert 1 <= len(lines) < 4  # some records were written, then the limit stopped the run
    assert all(json.loads(line)["status"] == "ok" for line in lines) and len(results.load(path)) == len(lines)
