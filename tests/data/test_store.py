"""accel_kit.data.store: reuse when unchanged, damaged folders, atomic output, foreign folders."""
import pytest

from accel_kit.data import prepare_text, read_meta
from accel_kit.errors import DataError

from .common import DOCS, write_jsonl


def test_rerun_reuses_and_changes_invalidate(tmp_path):
    corpus = write_jsonl(tmp_path / "c.jsonl", DOCS)
    out = tmp_path / "out"
    first = prepare_text([corpus], out, progress=False)
    stamp = (out / "train.bin").stat().st_mtime_ns
    again = prepare_text([str(corpus)], out, progress=False)
    assert again["reused"] and again["inputs_sha256"] == first["inputs_sha256"]
    assert (out / "train.bin").stat().st_mtime_ns == stamp
    assert not prepare_text([corpus], out, val_fraction=0.5, progress=False).get("reused")
    write_jsonl(corpus, DOCS + ["one more"])
    assert prepare_text([corpus], out, val_fraction=0.5, progress=False)["documents"] == 4


def test_damaged_output_is_redone(tmp_path):
    corpus = write_jsonl(tmp_path / "c.jsonl", DOCS)
    out = tmp_path / "out"
    prepare_text([corpus], out, progress=False)
    with open(out / "train.bin", "ab") as handle:
        handle.write(b"\0\0")
    with pytest.raises(DataError, match="damaged"):
        read_meta(out)
    assert not prepare_text([corpus], out, progress=False).get("reused")
    read_meta(out)


def test_foreign_output_folder_is_not_overwritten(tmp_path):
    corpus = write_jsonl(tmp_path / "c.jsonl", DOCS)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "precious.txt").write_text("keep me")
    with pytest.raises(DataError, match="not an accel-kit prepared data folder"):
        prepare_text([corpus], tmp_path / "out", progress=False)
    assert (tmp_path / "out" / "precious.txt").read_text() == "keep me"


def test_failed_rerun_keeps_old_output_and_stale_partials_are_removed(tmp_path):
    corpus = write_jsonl(tmp_path / "c.jsonl", DOCS)
    out = tmp_path / "out"
    prepare_text([corpus], out, progress=False)
    before = (out / "train.bin").read_bytes()
    stale = tmp_path / ".out.partial-999999999-dead"  # a killed run's leftovers (no such pid)
    stale.mkdir()
    (stale / "train.bin").write_bytes(b"junk")
    with open(corpus, "ab") as handle:
        handle.write(b"{broken\n")
    with pytest.raises(DataError, match=r":4: not valid JSON"):
        prepare_text([corpus], out, progress=False)
    assert (out / "train.bin").read_bytes() == before and read_meta(out)
    assert not stale.exists()
    assert not [p for p in tmp_path.iterdir() if ".partial-" in p.name]
