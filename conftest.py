"""pytest's settings for the whole checkout (tests/conftest.py holds the tests' own fixtures and hooks).

notebooks/tune.ipynb is left out of nbval's collection: tests/test_tune.py runs it under papermill with the same
smoke profile nbval would give it (make test's ACCEL_KIT_NOTEBOOK_PROFILE) and checks its records and the report's
section from them, so nbval's run of it would be the same 20 s of work again.
"""
collect_ignore = ["notebooks/tune.ipynb"]
