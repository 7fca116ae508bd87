"""accel_kit.data.cli: the prepare subcommands."""
import argparse

from accel_kit.data import read_meta
from accel_kit.data.cli import add_prepare_parser


def test_cli_hook(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    add_prepare_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["prepare", "synthetic-genome", "--out", str(tmp_path / "g.fa"), "--records", "2"])
    assert args.func(args) == 0
    args = parser.parse_args(["prepare", "fasta", str(tmp_path / "g.fa"), "--out", str(tmp_path / "f"),
                              "--block-size", "64", "-q"])
    assert args.func(args) == 0
    args = parser.parse_args(["prepare", "text", "--out", str(tmp_path / "t"), "--workers", "1", "-q"])
    assert args.func(args) == 0
    output = capsys.readouterr().out
    assert "2 synthetic genomes" in output and "rows" in output and "gpt2" in output
    assert read_meta(tmp_path / "t")["documents"] > 50
