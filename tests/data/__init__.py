"""Tests of accel_kit.data, one file per module (a package: test_cli.py is also a name in tests/)."""
