import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_checks import fail_one_line

from accel_kit import cli
from accel_kit.devices.cpu import CPUAdapter

TINY = ["-p", "preset", "gpt2-debug", "-p", "seq_len", "16", "-p", "batch_sizes", "[2]",
        "-p", "trials", "2", "-p", "warmup", "1", "-p", "measure_peak", "false", "-q"]


def test_unknown_parameter(capsys):
    assert "unknown parameter 'batch'" in fail_one_line(["run", "microbenchmark", "-p", "batch", "4"], capsys)


def test_wrong_type(capsys):
    assert "parameter 'batch_sizes'" in fail_one_line(["run", "microbenchmark", "-p", "batch_sizes", "four"], capsys)


def test_out_of_range(capsys):
    assert "parameter 'trials'" in fail_one_line(["run", "microbenchmark", "-p", "trials", "-1"], capsys)


def test_unknown_system(capsys):
    assert "unknown system 'tpu'" in fail_one_line(["run", "microbenchmark", "--system", "tpu"], capsys)


def test_unavailable_system(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert "system 'h200'" in fail_one_line(["run", "microbenchmark", "--system", "h200"], capsys)


def test_precision_the_device_lacks(capsys, monkeypatch, out_dir):
    monkeypatch.setattr(CPUAdapter, "supported_precisions", lambda self: ("fp32", "bf16"))
    err = fail_one_line(["run", "microbenchmark", *TINY, "-p", "precisions", "[fp16]"], capsys)
    assert "precision 'fp16' does not run on adapter 'cpu'" in err


@pytest.mark.slow
def test_run_writes_records(out_dir, capsys):
    assert cli.main(["run", "microbenchmark", *TINY, "-p", "precisions", "[fp32]", "-p", "impls", "[native, hf]"]) == 0
    lines = (out_dir / "microbenchmark" / "cpu.jsonl").read_text().splitlines()
    recs = [json.loads(line) for line in lines]
    assert len(recs) == 4  # 2 impls x 1 precision x 1 batch x 2 directions
    assert {r["status"] for r in recs} == {"ok"}
    assert (out_dir / "microbenchmark" / "figures" / "microbenchmark_forward.html").exists()


def test_console_script_entry_point(out_dir):
    proc = subprocess.run([sys.executable, "-m", "accel_kit.cli", "run", "microbenchmark", "-p", "nope", "1"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "unknown parameter 'nope'" in proc.stderr


# ----------------------------------------------------------------------------------- jobscript

JOB = ["jobscript", "scaling", "--system", "a100"]


@pytest.mark.parametrize("args, message", [
    (["--nodes", "0"], "--nodes must be at least 1, got 0"),
    (["--nodes", "-2"], "--nodes must be at least 1, got -2"),
    (["--nodes", "two"], "argument --nodes: invalid int value: 'two'"),
    (["--nodes", "2", "--walltime", "1:00"], "--walltime must be HH:MM:SS"),
    (["--nodes", "2", "--walltime", "01:75:00"], "--walltime must be HH:MM:SS"),
    (["--nodes", "2", "--walltime", "00:00:00"], "more than zero"),
    (["--nodes", "2", "--scheduler", "lsf"], "argument --scheduler: invalid choice: 'lsf'"),
    (["--nodes", "2", "--profile", "huge"], "unknown profile 'huge' for study 'scaling'"),
    (["--nodes", "2", "-p", "stepz", "3"], "unknown parameter 'stepz' for study 'scaling'"),
    (["--nodes", "2", "-p", "steps", "many"], "parameter 'steps'"),
    (["--nodes", "2", "-p", "rendezvous_port", "0"], "parameter 'rendezvous_port'"),
    (["--nodes", "2", "-p", "rendezvous_port", "70000"], "parameter 'rendezvous_port'"),
])
def test_jobscript_bad_values_write_nothing(args, message, capsys, tmp_path):
    out = tmp_path / "job.sh"
    assert message in fail_one_line([*JOB, *args, "--out", str(out)], capsys)
    assert list(tmp_path.iterdir()) == []


def test_jobscript_other_bad_arguments(capsys, tmp_path):
    out = ["--nodes", "1", "--out", str(tmp_path / "job.sh")]
    assert "unknown system 'tpu'" in fail_one_line(["jobscript", "scaling", "--system", "tpu", *out], capsys)
    assert "unknown study 'scalling'" in fail_one_line(["jobscript", "scalling", "--system", "a100", *out], capsys)
    # the script runs `-p launcher ...`, which the single-device microbenchmark does not take
    assert "job scripts are for scaling" in fail_one_line(["jobscript", "microbenchmark", "--system", "a100", *out], capsys)
    assert list(tmp_path.iterdir()) == []


def test_jobscript_writes_a_runnable_script(capsys, tmp_path):
    out = tmp_path / "job.sh"
    argv = [*JOB, "--nodes", "2", "--scheduler", "slurm", "--walltime", "36:00:00", "--out", str(out),
            "-p", "steps", "3", "-p", "data", "/data/it's here"]
    assert cli.main(argv) == 0
    assert out.stat().st_mode & 0o111 and "2 node(s) x 4 devices of a100" in capsys.readouterr().out
    text = out.read_text()
    assert "#SBATCH --nodes=2" in text and "#SBATCH --time=36:00:00" in text
    # the overrides reach `accel-kit run` as the same words, quotes and spaces included
    run_line = next(line for line in text.splitlines() if line.startswith("accel-kit run"))
    words = subprocess.run(["bash", "-c", f"printf '%s\\n' {run_line[len('accel-kit run '):]}"],
                           capture_output=True, text=True, check=True).stdout.splitlines()
    assert words[-6:] == ["-p", "steps", "3", "-p", "data", "/data/it's here"]


@pytest.mark.parametrize("value", ["0", "-2"])
def test_jobscript_bad_devices_per_node_is_one_line(value, capsys, tmp_path):
    out = tmp_path / "job.sh"
    err = fail_one_line([*JOB, "--nodes", "2", "--devices-per-node", value, "--out", str(out)], capsys)
    assert f"--devices-per-node must be at least 1, got {value}" in err
    assert list(tmp_path.iterdir()) == []


def _run_line(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("accel-kit run"))


def test_jobscript_tasks_per_node_from_the_nodes_devices(capsys, tmp_path):
    # The cpu system's nominal 8 devices per node asked 8 tasks of a 2-core node: the job never left the queue.
    out = tmp_path / "job.sh"
    base = ["jobscript", "scaling", "--system", "cpu", "--nodes", "2", "--scheduler", "slurm", "--profile", "smoke",
            "--out", str(out)]
    assert cli.main([*base, "--devices-per-node", "1"]) == 0
    text = out.read_text()
    assert "#SBATCH --ntasks-per-node=1" in text and "-p devices_per_node 1" in _run_line(text)
    assert "2 node(s) x 1 devices of cpu" in capsys.readouterr().out
    out.unlink()
    assert cli.main(base) == 0  # default on cpu: the cores this process may run on
    cores = len(os.sched_getaffinity(0))
    text = out.read_text()
    assert f"#SBATCH --ntasks-per-node={cores}" in text and f"-p devices_per_node {cores}" in _run_line(text)
    out.unlink()
    assert cli.main([*JOB, "--nodes", "2", "--scheduler", "slurm", "--out", str(out)]) == 0  # a100: its own 4
    assert "#SBATCH --ntasks-per-node=4" in out.read_text()


def test_jobscript_devices_per_node_spreads_the_points():
    from accel_kit import studies
    from accel_kit.studies.training import all_points, unresolved_precision
    from accel_kit.systems import load_system

    params = studies.resolve("scaling", "smoke", preset="gpt2-debug", device_counts=[2], devices_per_node=1,
                             launcher="srun", max_nodes=2)
    (point,) = all_points(params, load_system("cpu"), unresolved_precision)
    assert point.devices_per_node == 1 and point.nodes == 2
    default = studies.resolve("scaling", "smoke", preset="gpt2-debug", device_counts=[2])
    (local,) = all_points(default, load_system("cpu"), unresolved_precision)
    assert local.devices_per_node == 8 and local.nodes == 1  # without a job: the system's figure, keys unchanged


def _job_h200(tmp_path: Path, scheduler: str, *args: str) -> str:
    out = tmp_path / f"job.{scheduler}.sh"
    assert cli.main(["jobscript", "scaling", "--system", "h200", "--nodes", "2", "--scheduler", scheduler,
                     "--profile", "full", "--out", str(out), *args]) == 0
    return out.read_text()


def test_jobscript_for_gpus_asks_them_names_its_log_and_lists_what_the_job_holds(capsys, tmp_path):
    # Issue 40, item 7: a 2-node H200 script asked no GPUs, had no log, listed 32- and 64-device layouts in a
    # 16-device job, and asked one hour for points of an hour each.
    from accel_kit import studies
    from accel_kit.engine.launch import JOB_SETUP_S, format_walltime
    from accel_kit.engine.sweep import PEAK_TIMEOUT_S, TERM_GRACE_S
    from accel_kit.studies.training import all_points, unresolved_precision
    from accel_kit.systems import load_system

    text = _job_h200(tmp_path, "slurm")
    assert "#SBATCH --gpus-per-node=8" in text  # the system file's gpus_per_node
    assert f"#SBATCH --output={tmp_path / 'job.slurm.%j.log'}" in text
    assert "8 GPUs a node asked" in capsys.readouterr().out
    layouts = text[text.index("# Layouts:"):text.index("# Left out:")]
    assert " 16 (dp 16)" in layouts and "32" not in layouts and "64" not in layouts
    assert "#   left out: gpt2-xl bf16: ddp on 32, 64 devices, the job has 16" in text
    # The wall time: the listed points' timeouts (and grace) plus the setup and one bf16 peak, to a quarter hour.
    params = studies.resolve("scaling", "full")
    listed = [p for p in all_points(params, load_system("h200"), unresolved_precision) if p.devices <= 16]
    total_s = len(listed) * (params.timeout_s + TERM_GRACE_S) + JOB_SETUP_S + PEAK_TIMEOUT_S
    walltime = format_walltime(-(-total_s // 900) * 900)
    assert f"#SBATCH --time={walltime}" in text and walltime > "01:00:00"
    assert f"# Wall time {walltime} (jobscript --walltime sets another): {len(listed)} point(s) x" in text
    assert subprocess.run(["bash", "-n", "-c", text]).returncode == 0
    # PBS: the GPUs in the select line, and the log named
    pbs = _job_h200(tmp_path, "pbs")
    assert "#PBS -l select=2:ngpus=8\n" in pbs and f"#PBS -o {tmp_path / 'job.pbs.log'}" in pbs
    # A wall time given wins; the comment still says what the points' budgets add up to.
    given = _job_h200(tmp_path, "slurm", "--walltime", "02:00:00")
    assert "#SBATCH --time=02:00:00" in given and "# Wall time 02:00:00, as given (jobscript --walltime)" in given


def test_jobscript_for_a_cpu_asks_no_gpus_and_keeps_the_outputs_given_at_submission(capsys, tmp_path):
    # The two-node cluster tests (tests/test_cluster.py) submit this script unedited, with ACCEL_KIT_OUTPUT_DIR set.
    from accel_kit.paths import output_dir

    out = tmp_path / "job.sh"
    assert cli.main(["jobscript", "scaling", "--system", "cpu", "--nodes", "2", "--scheduler", "slurm", "--profile",
                     "smoke", "--devices-per-node", "1", "--out", str(out)]) == 0
    text = out.read_text()
    assert "gpus" not in text.lower() and "#SBATCH --time=00:15:00" in text  # 2 points of 120 s, and the setup
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("outputs="))
    snippet = "\n".join(lines[start:start + 2] + ['printf %s "$ACCEL_KIT_OUTPUT_DIR"'])
    env = {k: v for k, v in os.environ.items() if k != "ACCEL_KIT_OUTPUT_DIR"}
    default = subprocess.run(["bash", "-c", snippet], env=env, capture_output=True, text=True).stdout
    assert default == str(output_dir().resolve())  # the folder jobscript would write records to
    given = subprocess.run(["bash", "-c", snippet], env=env | {"ACCEL_KIT_OUTPUT_DIR": "/elsewhere"},
                           capture_output=True, text=True).stdout
    assert given == "/elsewhere"


def test_jobscript_with_no_point_the_job_holds_is_one_line(capsys, tmp_path):
    out = tmp_path / "job.sh"
    err = fail_one_line(["jobscript", "scaling", "--system", "h200", "--nodes", "2", "--out", str(out),
                         "-p", "device_counts", "[32]", "-p", "also", "[]"], capsys)
    assert "no point of scaling fits the job's 16 devices (2 node(s) x 8)" in err and "ask --nodes 4" in err
    # a log path a scheduler line cannot carry: one line too
    spaced = tmp_path / "my jobs"
    spaced.mkdir()
    assert "has a space" in fail_one_line([*JOB, "--nodes", "1", "--out", str(spaced / "job.sh")], capsys)
    assert list(tmp_path.iterdir()) == [spaced] and list(spaced.iterdir()) == []


def test_job_walltime_rounds_up_and_is_clipped():
    from accel_kit.engine.launch import MAX_WALLTIME_S, format_walltime, job_walltime

    assert format_walltime(3600 * 30 + 61.2) == "30:01:02"
    walltime, why = job_walltime(2, 120, grace_s=10)  # 860 s
    assert walltime == "00:15:00" and why[-1].endswith("rounded up to 15 minutes")
    walltime, why = job_walltime(100, 3600)
    assert walltime == format_walltime(MAX_WALLTIME_S) == "24:00:00"
    assert "= 100:10:00, more than the 24:00:00" in " ".join(why) and "submit the script again" in " ".join(why)
    assert all(len(line) <= 110 for line in why)


def test_jobscript_setup_lines(capsys, tmp_path, monkeypatch):
    out = tmp_path / "job.sh"
    argv = [*JOB, "--nodes", "1", "--scheduler", "pbs", "--out", str(out)]
    monkeypatch.setattr(sys, "prefix", "/opt/my env")  # a venv: prefix differs from base_prefix
    monkeypatch.setattr(sys, "base_prefix", "/usr")
    assert cli.main(argv) == 0
    lines = out.read_text().splitlines()
    assert lines[lines.index(_run_line(out.read_text())) - 1] == ". '/opt/my env/bin/activate'"
    out.unlink()
    assert cli.main([*argv, "--setup", "module load conda", "--setup", "conda activate accel-kit"]) == 0
    text = out.read_text()
    assert "module load conda\nconda activate accel-kit\naccel-kit run" in text and "activate'" not in text
    out.unlink()
    monkeypatch.setattr(sys, "prefix", "/usr")  # no venv: no line guessed
    assert cli.main(argv) == 0
    lines = out.read_text().splitlines()
    assert lines[lines.index(_run_line(out.read_text())) - 1].startswith("# The environment accel-kit")


def test_usage_errors_are_one_line(capsys):
    assert "the following arguments are required: --system" in fail_one_line(["jobscript", "scaling", "--nodes", "1"], capsys)
    assert "argument --val-fraction: must be in [0, 1)" in fail_one_line(
        ["prepare", "text", "--out", "x", "--val-fraction", "2"], capsys)


# ------------------------------------------------------------------- output folders that cannot be written

ROOT = Path(__file__).resolve().parents[1]


def _blocked(tmp_path):
    """A folder below a plain file: it cannot be created by anyone, root included."""
    (tmp_path / "a-file").write_text("")
    return tmp_path / "a-file" / "results"


def _never(*args, **kwargs):
    raise AssertionError("ran although its output folder cannot be written")


def test_unwritable_output_dir_from_the_environment_stops_before_running(capsys, monkeypatch, tmp_path):
    from accel_kit.studies import gas

    monkeypatch.setattr(gas, "run", _never)
    monkeypatch.setenv("ACCEL_KIT_OUTPUT_DIR", str(_blocked(tmp_path)))
    err = fail_one_line(["run", "gas", "--system", "cpu", "--profile", "smoke", "-q"], capsys)
    assert f"output folder ($ACCEL_KIT_OUTPUT_DIR={_blocked(tmp_path)})" in err
    assert f"'{tmp_path / 'a-file'}' is a file, not a folder" in err


def test_unwritable_output_dir_option_stops_before_running(capsys, monkeypatch, tmp_path):
    from accel_kit.studies import microbenchmark

    monkeypatch.setattr(microbenchmark, "run", _never)
    err = fail_one_line(["run", "microbenchmark", *TINY, "--output-dir", str(_blocked(tmp_path))], capsys)
    assert f"output folder (--output-dir / output_dir) '{_blocked(tmp_path) / 'microbenchmark'}' cannot be written" in err


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc")
def test_output_dir_in_proc_is_one_line_and_exit_2(tmp_path):
    """The reported case, as a user runs it: a folder /proc does not let anyone make."""
    env = dict(os.environ, ACCEL_KIT_OUTPUT_DIR="/proc/nope")
    proc = subprocess.run([sys.executable, "-m", "accel_kit.cli", "run", "gas", "--system", "cpu", "--profile", "smoke"],
                          capture_output=True, text=True, env=env, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == ("accel-kit: error: output folder ($ACCEL_KIT_OUTPUT_DIR=/proc/nope) '/proc/nope/gas' "
                           "cannot be written: No such file or directory: '/proc/nope'\n")


def test_papermill_unwritable_output_dir_ends_with_the_one_line(tmp_path):
    """The notebook's failed cell shows the CLI's line, not a traceback (papermill's own status is 1)."""
    import papermill

    with pytest.raises(papermill.PapermillExecutionError) as info:
        papermill.execute_notebook(str(ROOT / "notebooks" / "gas.ipynb"), str(tmp_path / "out.ipynb"),
                                   parameters={"profile": "smoke", "output_dir": str(_blocked(tmp_path))},
                                   progress_bar=False, kernel_name="python3")
    line = f"accel-kit: error: output folder (--output-dir / output_dir) '{_blocked(tmp_path) / 'gas'}' cannot be written"
    assert info.value.traceback[0].startswith(line) and len(info.value.traceback) == 1


def test_jobscript_unwritable_out(capsys, tmp_path):
    err = fail_one_line([*JOB, "--nodes", "1", "--out", str(_blocked(tmp_path) / "job.sh")], capsys)
    assert f"the folder of the job script '{_blocked(tmp_path)}' cannot be written" in err
    assert f"job script '{tmp_path}' is a folder" in fail_one_line([*JOB, "--nodes", "1", "--out", str(tmp_path)], capsys)


def test_jobscript_launcher_given_as_a_parameter(capsys, tmp_path):
    # The job runs `-p launcher srun` after the script's own `-p launcher ...`: the later one wins, checked here alike.
    out = tmp_path / "job.sh"
    assert cli.main([*JOB, "--nodes", "1", "--scheduler", "slurm", "--out", str(out), "-p", "launcher", "srun"]) == 0
    assert "-p launcher srun" in out.read_text()
    out.unlink()
    assert "parameter 'launcher'" in fail_one_line([*JOB, "--nodes", "1", "--out", str(out), "-p", "launcher", "ssh"], capsys)
    assert list(tmp_path.iterdir()) == []


def test_report_unwritable_out(capsys, monkeypatch, tmp_path):
    from accel_kit import report

    monkeypatch.setattr(report, "collect", _never)
    err = fail_one_line(["report", str(tmp_path), "--out", str(_blocked(tmp_path) / "r.html")], capsys)
    assert f"the folder of the report page (--out) '{_blocked(tmp_path)}' cannot be written" in err
    assert "report page (--out)" in fail_one_line(["report", str(tmp_path), "--out", str(tmp_path)], capsys)
    # without --out or sources, the page goes to the results folder, which is checked as well
    monkeypatch.setenv("ACCEL_KIT_OUTPUT_DIR", str(_blocked(tmp_path)))
    assert f"'{_blocked(tmp_path)}' cannot be written" in fail_one_line(["report"], capsys)


@pytest.mark.parametrize("argv", [
    ["prepare", "text", "--out", "{blocked}/text"],
    ["prepare", "fasta", "{tmp}", "--out", "{blocked}/fasta"],
    ["prepare", "synthetic-genome", "--out", "{blocked}/g.fasta"],
])
def test_prepare_unwritable_destination(argv, capsys, tmp_path):
    blocked = _blocked(tmp_path)
    err = fail_one_line([a.format(blocked=blocked, tmp=tmp_path) for a in argv], capsys)
    assert f"'{blocked}' cannot be written: '{tmp_path / 'a-file'}' is a file, not a folder" in err
    if argv[1] != "synthetic-genome":
        assert err.startswith(f"accel-kit: error: --out '{argv[-1].format(blocked=blocked)}': its folder '{blocked}'")


@pytest.mark.parametrize("argv, message", [
    (["prepare", "synthetic-genome", "--out", "g.fasta", "--seed", "-1"],
     "argument --seed: must be a non-negative integer, got -1"),
    (["prepare", "text", "--out", "x", "--val-fraction", "abc"], "argument --val-fraction: must be a number, got 'abc'"),
    (["prepare", "text", "--out", "x", "--workers", "many"], "argument --workers: must be an integer, got 'many'"),
    (["predict", "--system", "cpu", "--probe-link", "--probe-ranks", "1"], "argument --probe-ranks: must be at least 2"),
    (["predict", "--system", "cpu", "--probe-link", "--probe-ranks", "two"], "argument --probe-ranks: must be an integer"),
])
def test_bad_flag_values_are_usage_errors(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert message in fail_one_line(argv, capsys)
    assert list(tmp_path.iterdir()) == []


def test_predict_probe_link_unwritable_cache_stops_before_the_probe(capsys, monkeypatch, tmp_path):
    from accel_kit.predict import links

    monkeypatch.setattr(links, "probe_link", _never)
    monkeypatch.setenv("ACCEL_KIT_OUTPUT_DIR", str(_blocked(tmp_path)))
    err = fail_one_line(["predict", "--system", "cpu", "--probe-link"], capsys)
    assert f"the folder of the measured link '{_blocked(tmp_path) / 'what_if'}' cannot be written" in err


@pytest.mark.parametrize("argv", [["run", "gas", "-p", "steps", "[1"],
                                  ["jobscript", "scaling", "--system", "a100", "--nodes", "1", "-p", "steps", "[1"]])
def test_a_value_that_is_not_yaml_names_its_parameter(argv, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert "parameter 'steps': cannot parse value '[1': ParserError" in fail_one_line(argv, capsys)


def test_base60_looking_values_stay_strings(capsys):
    # YAML 1.1 reads 2:4 as 124; the 2:4 pattern must arrive as itself and meet the pair check that names both fields.
    err = fail_one_line(["run", "gas", "--profile", "smoke", "-p", "sparsity_pattern", "2:4", "-p", "sparsity", "0.3"], capsys)
    assert "parameters 'sparsity' and 'sparsity_pattern': sparsity_pattern '2:4' keeps 2 of every 4" in err
    assert "(given sparsity=0.3, sparsity_pattern='2:4')" in err


# ----------------------------------------------------------------------------------- benchmarks' scripts

@pytest.mark.parametrize("script, args, message", [
    ("cpu_allocator.py", ["--steps", "0"], "argument --steps: must be at least 1, got 0"),
    ("energy_check.py", ["{tmp}/none"], "is not a folder"),
    ("microbenchmark_vs_hf.py", ["--system", "tpu"], "unknown system 'tpu'"),
    ("predict_error.py", ["--run", "--out", "{tmp}/a-file/x"], "--out '{tmp}/a-file/x' cannot be written"),
    ("prepare_throughput.py", ["--repeats", "0"], "argument --repeats: must be at least 1, got 0"),
    ("sparsity_speed.py", ["--sparsities", "0.5,1.5"], "argument --sparsities: each sparsity must be in [0, 1)"),
    ("train_vs_hf.py", ["--precision", "fp7"], "argument --precision: invalid choice: 'fp7'"),
])
def test_benchmark_scripts_refuse_bad_values_in_one_line(script, args, message, capsys, monkeypatch, tmp_path):
    """Run in this process as `python benchmarks/<script>` would (runpy), for the exit status and stderr."""
    import runpy

    (tmp_path / "a-file").write_text("")
    monkeypatch.setattr(sys, "argv", [script, *(a.format(tmp=tmp_path) for a in args)])
    monkeypatch.setattr(sys, "path", list(sys.path))  # the scripts put the checkout first
    with pytest.raises(SystemExit) as info:
        runpy.run_path(str(ROOT / "benchmarks" / script), run_name="__main__")
    err = capsys.readouterr().err
    assert info.value.code == 2, err
    assert err.startswith(f"{script}: error: ") and err.count("\n") == 1, err
    assert message.format(tmp=tmp_path) in err
