"""After `make cerebras`, from the Cerebras environment: its Jupyter kernel is in its venv, none in the user's
data folder (tests/test_user_state.py; the main tests may run before the kernel is installed)."""
import pytest

pytest.importorskip("cerebras.pytorch", reason="needs the Cerebras environment: make cerebras, then "
                                               ".venv-cerebras/bin/python -m pytest tests/cerebras")

from test_user_state import test_the_cerebras_kernel_is_in_its_venv_not_in_the_users_data_folder  # noqa: E402,F401
