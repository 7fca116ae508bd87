import pytest


@pytest.fixture
def out_dir(tmp_path, monkeypatch):
    """A scratch results root; also exported so notebooks and subprocesses write there."""
    monkeypatch.setenv("ACCEL_KIT_OUTPUT_DIR", str(tmp_path))
    return tmp_path
