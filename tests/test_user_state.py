"""Nothing `make test` runs writes outside the checkout and the temporary folders: the Cerebras kernel
goes into its venv's prefix (not the user's Jupyter data folder, where a removed checkout would leave a
dead kernel in every JupyterLab), and the tests' caches and profiles into a scratch folder (conftest)."""
import os
import re
import shlex
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MAKEFILE = (ROOT / "Makefile").read_text()


def _kernel_installs() -> list[list[str]]:
    return [shlex.split(line) for line in MAKEFILE.splitlines() if re.search(r"ipykernel\s+install", line)]


def test_the_makefile_installs_kernels_into_a_prefix_never_for_the_user():
    installs = _kernel_installs()
    assert installs, "no `ipykernel install` in the Makefile: this test checks nothing"
    for words in installs:
        assert "--user" not in words, f"a user-level kernel: {' '.join(words)}"
        assert "--sys-prefix" in words or "--prefix" in words, f"a kernel without a prefix: {' '.join(words)}"
    # make lab offers that prefix's kernels.
    lab = MAKEFILE[MAKEFILE.index("\nlab:"):].split("\n\n")[0]
    assert "JUPYTER_PATH=$(abspath $(CEREBRAS_VENV))/share/jupyter" in lab


def test_the_tests_caches_and_profiles_are_in_a_scratch_folder():
    from conftest import SCRATCH_DIRS, SCRATCH_HOME_ENV

    scratch = Path(os.environ[SCRATCH_HOME_ENV])
    assert scratch.parent == Path(tempfile.gettempdir()) and scratch.is_dir()
    for name in SCRATCH_DIRS:
        assert Path(os.environ[name]).is_relative_to(scratch), name


def test_the_cerebras_kernel_is_in_its_venv_not_in_the_users_data_folder():
    import sys

    venv = ROOT / ".venv-cerebras"
    name = re.search(r"^CEREBRAS_KERNEL \?= (\S+)", MAKEFILE, re.M).group(1)
    kernel = venv / "share" / "jupyter" / "kernels" / name / "kernel.json"
    # From the Cerebras environment (tests/cerebras, after make cerebras) the kernel must be there; from the
    # main one, make test may be building it meanwhile: checked once it is.
    if Path(sys.prefix).resolve() != venv.resolve() and not kernel.exists():
        pytest.skip("no Cerebras kernel here yet (make cerebras installs it; make test does, beside the tests)")
    from conftest import USER_JUPYTER_DATA_ENV

    assert kernel.exists(), f"make cerebras installed no kernel at {kernel}"
    user = Path(os.environ[USER_JUPYTER_DATA_ENV]) / "kernels" / name
    assert not user.exists(), (f"{user}: a user-level kernel from an earlier `make cerebras`; remove it with "
                               f"`jupyter kernelspec remove {name}`")


def test_a_kernel_installed_as_the_makefile_does_is_found_through_make_labs_jupyter_path(tmp_path):
    import json
    import subprocess
    import sys

    pytest.importorskip("ipykernel")
    # The Makefile's install, into a scratch prefix standing in for the Cerebras venv's (--sys-prefix is
    # --prefix sys.prefix), with this Python.
    words = _kernel_installs()[0]
    args = words[words.index("install") + 1:]
    args[args.index("--sys-prefix"):args.index("--sys-prefix") + 1] = ["--prefix", str(tmp_path)]
    args = [a.replace("$(CEREBRAS_KERNEL)", "accel-kit-cerebras") for a in args]
    subprocess.run([sys.executable, "-m", "ipykernel", "install", *args], check=True, capture_output=True)
    env = dict(os.environ, JUPYTER_PATH=str(tmp_path / "share" / "jupyter"))
    listed = subprocess.run([sys.executable, "-m", "jupyter_client.kernelspecapp", "list", "--json"], env=env,
                            check=True, capture_output=True, text=True).stdout
    spec = json.loads(listed)["kernelspecs"]["accel-kit-cerebras"]
    assert Path(spec["resource_dir"]).is_relative_to(tmp_path)
    assert spec["spec"]["display_name"] == "accel-kit (Cerebras cstorch)"
