"""The tracked notebooks stay in the form JupyterLab saves, without outputs (accel_kit.notebooks_meta)."""
import json

import nbformat
import pytest

from accel_kit import notebooks_meta

NOTEBOOKS = notebooks_meta.tracked_notebooks()


def test_the_seven_study_notebooks_the_report_what_if_and_tune_are_checked():
    assert {p.stem for p in NOTEBOOKS} == {"microbenchmark", "scaling", "seq_length", "gas", "sparsity", "genslm",
                                           "inference", "report", "what_if", "tune"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_tracked_notebook_is_clean(path):
    found = notebooks_meta.problems(path)
    assert not found, (f"notebooks/{path.name}: {'; '.join(found)}; "
                       f"run `make strip-notebooks` (python -m accel_kit.notebooks_meta) and commit the result")


def test_strip_cleans_what_a_run_and_an_old_save_leave(tmp_path):
    # What an executed notebook saved from JupyterLab or by papermill brings: outputs, counts,
    # papermill and view metadata, another kernelspec display name, another Python version.
    nb = nbformat.read(NOTEBOOKS[0], as_version=4)
    code = next(c for c in nb.cells if c.cell_type == "code")
    code.outputs = [nbformat.v4.new_output("stream", name="stdout", text="hello\n")]
    code.execution_count = 3
    code.metadata.update(scrolled=True, papermill={"duration": 1.0})
    nb.metadata.kernelspec.display_name = "Python 3"
    nb.metadata.language_info = dict(notebooks_meta.LANGUAGE_INFO, version="3.12.1")
    nb.metadata.papermill = {"parameters": {}}
    dirty = tmp_path / "dirty.ipynb"
    nbformat.write(nb, dirty)
    found = notebooks_meta.problems(dirty)
    assert found[:2] == ["has outputs", "has execution counts"]
    assert "kernelspec, language_info, papermill" in found[2] and found[3] == "cell metadata other than tags"

    assert notebooks_meta.main([str(dirty)]) == 0
    assert notebooks_meta.problems(dirty) == []
    assert notebooks_meta.main(["--check", str(dirty)]) == 0
    cleaned = json.loads(dirty.read_text())
    assert cleaned["metadata"]["language_info"]["version"] == notebooks_meta.PYTHON_VERSION
    tags = [c["metadata"].get("tags") for c in cleaned["cells"]]
    assert ["parameters"] in tags  # papermill's parameters cell keeps its tag


def test_check_reports_one_line_and_fails(tmp_path, capsys):
    dirty = tmp_path / "dirty.ipynb"
    dirty.write_text(NOTEBOOKS[0].read_text().replace('"nbformat_minor": 5', '"nbformat_minor": 4'))
    assert notebooks_meta.main(["--check", str(dirty)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out == [f"{dirty}: nbformat 4.4, not 4.5"]


def test_the_pre_save_hook_strips_a_tracked_notebook_and_keeps_the_users_own(tmp_path):
    import subprocess
    from types import SimpleNamespace

    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / "tracked.ipynb").write_text(NOTEBOOKS[0].read_text())
    subprocess.run(["git", "add", "tracked.ipynb"], cwd=tmp_path, check=True)
    nb = nbformat.read(NOTEBOOKS[0], as_version=4)
    code = next(c for c in nb.cells if c.cell_type == "code")
    code.outputs = [nbformat.v4.new_output("stream", name="stdout", text="hello\n")]
    code.execution_count = 1
    manager = SimpleNamespace(root_dir=str(tmp_path))
    for name in ("tracked.ipynb", "mine.ipynb"):
        model = {"type": "notebook", "content": json.loads(nbformat.writes(nb))}
        notebooks_meta.pre_save_hook(model, path=name, contents_manager=manager)
        saved = notebooks_meta.serialise(nbformat.from_dict(model["content"]))
        if name == "tracked.ipynb":  # what jupyter_server then writes: the committed notebook, byte for byte
            assert saved == NOTEBOOKS[0].read_text()
        else:
            assert "hello" in saved
    model = {"type": "file", "content": "text"}
    notebooks_meta.pre_save_hook(model, path="tracked.ipynb", contents_manager=manager)
    assert model == {"type": "file", "content": "text"}


def test_make_lab_loads_the_project_config_that_sets_the_hook():
    root = notebooks_meta.ROOT
    lab = (root / "Makefile").read_text().split("\nlab:")[1].split("\n\n")[0]
    assert "JUPYTER_CONFIG_PATH=$(CURDIR)" in lab
    config = (root / "jupyter_server_config.py").read_text()
    assert 'c.ContentsManager.pre_save_hook = "accel_kit.notebooks_meta.pre_save_hook"' in config
