"""A CLI call that must fail as bad input does: status 2, one line on stderr, no traceback (imported by
name by the CLI tests here and under tests/data/)."""
import pytest

from accel_kit import cli


def fail_one_line(argv, capsys) -> str:
    """Run ``accel-kit argv`` in this process; it must exit 2 with one ``accel-kit: error:`` line. That line."""
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    err = capsys.readouterr().err
    assert info.value.code == 2, err
    assert err.startswith("accel-kit: error:") and err.count("\n") == 1 and "Traceback" not in err
    return err
