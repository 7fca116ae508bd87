import json
import os
from pathlib import Path

import pytest

from accel_kit import atomic
from accel_kit.atomic import atomic_path, partial_path, remove_stale_partials, write_json_atomic, write_text_atomic


def _partials(folder: Path) -> list[Path]:
    return [p for p in folder.iterdir() if ".partial-" in p.name]


def test_write_creates_then_replaces(tmp_path):
    target = tmp_path / "sub" / "out.txt"  # the folder is created
    write_text_atomic(target, "first\n")
    write_text_atomic(target, "second ü\n")
    assert target.read_text(encoding="utf-8") == "second ü\n"
    assert not _partials(target.parent)


def test_write_json_atomic_stringifies_what_json_lacks(tmp_path):
    target = tmp_path / "result.json"
    write_json_atomic(target, {"path": Path("/x/y"), "n": 3})  # as the worker writes its result
    assert json.loads(target.read_text()) == {"path": "/x/y", "n": 3}


def test_exception_leaves_target_untouched_and_no_temp(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("old")
    with pytest.raises(RuntimeError, match="writer failed"):
        with atomic_path(target) as tmp:
            tmp.write_text("half of the ne")
            raise RuntimeError("writer failed")
    assert target.read_text() == "old"
    assert not _partials(tmp_path)


def test_exception_before_any_file_leaves_nothing(tmp_path):
    target = tmp_path / "out.txt"
    with pytest.raises(KeyboardInterrupt):
        with atomic_path(target):
            raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []


def test_block_that_writes_nothing_is_an_error(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("old")
    with pytest.raises(FileNotFoundError):
        with atomic_path(target):
            pass
    assert target.read_text() == "old"


def test_temp_is_a_hidden_sibling(tmp_path):
    target = tmp_path / "figure.html"
    with atomic_path(target) as tmp:
        # same folder, so os.replace is a rename within one filesystem
        assert tmp.parent == tmp_path and tmp.name.startswith(".figure.html.partial-")
        tmp.write_text("x")
    assert target.read_text() == "x"


def test_stale_partials_of_dead_processes_are_removed(tmp_path):
    target = tmp_path / "run[1].json"  # glob characters in the name must not break the search
    dead = tmp_path / ".run[1].json.partial-999999999-dead"  # the older "<pid>-<random>" form
    dead_dir = tmp_path / f".run[1].json.partial-999999999@{atomic._HOST}-beef"
    dead_dir.mkdir()
    (dead_dir / "train.bin").write_bytes(b"\0")
    mine = partial_path(target)  # this process: may still be writing it
    elsewhere = tmp_path / ".run[1].json.partial-999999999@some-other-node-cafe"  # pid means nothing here
    for path in (dead, mine, elsewhere):
        path.write_text("x")
    remove_stale_partials(target)
    assert sorted(_partials(tmp_path)) == sorted([mine, elsewhere])


def test_partial_names_differ_within_a_process(tmp_path):
    names = {partial_path(tmp_path / "a").name for _ in range(20)}
    assert len(names) == 20
    assert all(n.split(".partial-")[1].startswith(f"{os.getpid()}@") for n in names)
