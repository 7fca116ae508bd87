import dataclasses
import json
import subprocess
import sys
import textwrap

import pytest

from accel_kit import results


def _record(i=0, status="ok", **kw):
    return results.make_record(study="s", system="cpu", status=status, params={"batch_size": i}, run_id="r",
                               metrics={"tflops": float(i)}, **kw)


def test_make_record_fields():
    rec = _record(reason=None)
    for key in ("schema_version", "record_id", "run_id", "timestamp", "study", "system", "status", "params",
                "metrics", "times_s", "env"):
        assert key in rec.to_dict()
    with pytest.raises(ValueError, match="reason"):
        _record(status="oom")
    with pytest.raises(ValueError, match="status"):
        _record(status="fine")


def test_non_finite_metric_is_null():
    rec = results.make_record(study="s", system="cpu", status="ok", params={}, run_id="r",
                              metrics={"x": float("nan")})
    assert rec.metrics["x"] is None


def test_append_and_load(tmp_path):
    path = tmp_path / "s" / "cpu.jsonl"
    for i in range(3):
        results.append_record(path, _record(i))
    df = results.load(tmp_path)
    assert list(df["batch_size"]) == [0, 1, 2]
    assert list(df["tflops"]) == [0.0, 1.0, 2.0]


def test_partial_tail_is_skipped_then_repaired(tmp_path):
    path = tmp_path / "cpu.jsonl"
    results.append_record(path, _record(1))
    with open(path, "a") as f:  # a writer killed mid-record
        f.write('{"schema_version": 1, "stud')
    with pytest.warns(UserWarning, match="incomplete"):
        assert len(results.load(path)) == 1
    results.append_record(path, _record(2))
    lines = path.read_text().splitlines()
    assert len(lines) == 2 and all(json.loads(line) for line in lines)


# (a kill mid-line leaves a partial last line, which the reader skips with a warning: expected here)
@pytest.mark.filterwarnings("ignore:.*skipping an incomplete final record")
def test_kill_during_appends_leaves_only_whole_records(tmp_path):
    # A child appends records as fast as it can and is SIGKILLed; every line read back is whole.
    path = tmp_path / "cpu.jsonl"
    code = textwrap.dedent(f"""
        from accel_kit import results
        rec = results.make_record(study="s", system="cpu", status="ok", params={{"pad": "x" * 20000}},
                                  run_id="r", metrics={{}})
        while True:
            results.append_record({str(path)!r}, rec)
    """)
    import time

    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        # Until about ten records are written: bounded by time only against a hang, as a busy 2-core machine may
        # take many seconds to start the child's interpreter and imports.
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not (path.exists() and path.stat().st_size > 200_000):
            time.sleep(0.02)
        assert proc.poll() is None, "the appending child ended before it was killed"
    finally:
        proc.kill()
        proc.wait()
    assert path.exists(), "the child wrote no record within 300 s"
    n = sum(1 for _ in results.iter_records(path))
    assert n >= 1
    results.append_record(path, _record(9))
    assert sum(1 for _ in results.iter_records(path)) == n + 1


def test_latest_keeps_newest(tmp_path):
    path = tmp_path / "cpu.jsonl"
    a = dataclasses.replace(_record(1), timestamp="2026-01-01T00:00:00+00:00")
    b = dataclasses.replace(_record(1), timestamp="2026-01-02T00:00:00+00:00")
    b.metrics["tflops"] = 5.0
    results.append_record(path, a)
    results.append_record(path, b)
    df = results.latest(results.load(path))
    assert list(df["tflops"]) == [5.0]


def test_environment_has_provenance():
    from accel_kit.devices import get_adapter

    env = results.environment(get_adapter("cpu"))
    for key in ("python", "torch", "transformers", "host", "git", "device", "math_mode"):
        assert key in env
    assert env["device"]["adapter"] == "cpu"


def test_training_records_load_with_their_layout_columns(tmp_path):
    # Records from before the parallel layouts (no tp, pp, cp, dp, mesh) load at the defaults, with the
    # engine they name; a record with a layout keeps it; a block record gets none.
    def train(params, metrics):
        return results.make_record(study="scaling", system="cpu", status="ok", params=params, run_id="r",
                                   metrics=metrics)

    path = tmp_path / "cpu.jsonl"
    for rec in (train({"devices": 2}, {"data_parallel_size": 2}),
                train({"devices": 2, "engine": "deepspeed"}, {"data_parallel_size": 2}),
                train({"devices": 4, "tp": 2, "engine": "fsdp"},
                      {"data_parallel_size": 2, "dp": 2, "mesh": "pp 1 x dp 2 x tp 2"}),
                results.make_record(study="microbenchmark", system="cpu", status="ok", params={"batch_size": 4},
                                    run_id="r")):
        results.append_record(path, rec)
    df = results.load(path)
    layout = df[["tp", "pp", "cp", "engine", "dp", "mesh"]].iloc[:3].to_dict("records")
    assert layout == [{"tp": 1, "pp": 1, "cp": 1, "engine": "ddp", "dp": 2, "mesh": "pp 1 x dp 2 x cp 1 x tp 1"},
                      {"tp": 1, "pp": 1, "cp": 1, "engine": "deepspeed", "dp": 2, "mesh": "pp 1 x dp 2 x cp 1 x tp 1"},
                      {"tp": 2, "pp": 1, "cp": 1, "engine": "fsdp", "dp": 2, "mesh": "pp 1 x dp 2 x tp 2"}]
    assert df[["tp", "engine", "dp", "mesh"]].iloc[3].isna().all()
    assert "data_parallel_size" not in df.columns  # the old name read as dp, the one name records carry


def test_reading_the_checkouts_commit_writes_nothing_to_it(tmp_path):
    # A plain `git status` rewrites a stale index under .git/index.lock; a run killed meanwhile left the
    # lock behind in the user's checkout (the next commit failed). The record's git state is read only.
    import os
    import subprocess

    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                       capture_output=True)

    git("init", "-q")
    (tmp_path / "f.txt").write_text("a")
    git("add", "f.txt")
    git("commit", "-q", "-m", "one")
    index = tmp_path / ".git" / "index"
    os.utime(tmp_path / "f.txt", ns=(1, 1))  # the index's stat data is stale now: a refresh would rewrite it
    before = index.stat()
    state = results.git_state(tmp_path)
    assert state["commit"] and state["dirty"] is False
    after = index.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_a_record_reads_back_by_field_in_the_shape_it_was_written():
    rec = results.make_record(study="inference", kind="offline_generation", system="cpu", status="ok",
                              params={"prompt_len": 4}, run_id="r", metrics={"tflops_per_device": float("nan")})
    line = json.loads(json.dumps(rec.to_dict()))  # as a records file holds it
    typed = results.Record.from_dict(line)
    assert typed.kind == "offline_generation" and typed.metrics == {"tflops_per_device": None}  # NaN: not measured
    assert typed == rec and list(line) == list(results.RECORD_FIELDS)
    old = {k: v for k, v in line.items() if k != "kind"} | {"schema_version": 1, "study": "microbenchmark"}
    assert results.Record.from_dict(old).kind == "block"  # schema 1 named no kind: its study's
    with pytest.raises(ValueError, match="needs a reason"):
        results.Record(study="s", kind="train", system="cpu", status="error", params={}, run_id="r")
