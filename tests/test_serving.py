"""The serve kind: its bad input (one line each), its statistics against hand counts, a server that dies, and a real
``transformers serve`` of a tiny preset under three loads on the loopback, with no process left behind."""
from __future__ import annotations

import os
import signal
import socket
import sys
import textwrap
import time
from pathlib import Path

import pytest

from accel_kit import metrics as M
from accel_kit.engine import serve_measure as SM
from accel_kit.errors import ParameterError
from accel_kit.serving import server as S
from accel_kit.serving import stats
from accel_kit.serving.load import Load, RequestResult, check_load


# ---- bad input ------------------------------------------------------------------------------------

def test_a_request_rate_of_zero_is_one_line():
    with pytest.raises(ParameterError, match="request_rate must be a positive"):
        check_load(None, 0)
    with pytest.raises(ParameterError, match="request_rate must be a positive"):
        Load(n_requests=1, prompt_tokens=1, output_tokens=1, request_rate=0.0)
    with pytest.raises(ValueError, match="request_rate must be a positive"):
        SM.ServePoint(system="cpu", precision="fp32", preset="gpt2-debug", request_rate=0)
    with pytest.raises(ParameterError, match="exactly one"):
        check_load(2, 1.0)


@pytest.mark.parametrize("bad", ["2000ms", [0, 0.1], ["2s", "-1ms"], ["fast", "slow"], "2000ms,100ms,5ms", [True, 1],
                                 None, ["nan", "1"]])
def test_an_slo_that_is_not_two_positive_durations_is_one_line(bad):
    with pytest.raises(ParameterError, match="two positive durations"):
        stats.parse_slo(bad)


def test_an_slo_reads_seconds_or_units():
    assert stats.parse_slo("2000ms,100ms") == (2.0, 0.1)
    assert stats.parse_slo([2, "30 ms"]) == (2.0, 0.03)
    assert stats.parse_slo("0.5s/30ms") == (0.5, 0.03)


def test_an_engine_not_installed_names_its_make_target(monkeypatch, tmp_path):
    import importlib.util

    monkeypatch.setattr(S, "VLLM_VENV", tmp_path / "no-venv")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("vllm", "fastapi") else real(name, *a))
    with pytest.raises(ParameterError, match="engine vllm is not installed.*make vllm"):
        S.check_engine("vllm")
    with pytest.raises(ParameterError, match="transformers serve needs fastapi.*not installed.*make install"):
        S.check_engine("transformers")
    with pytest.raises(ParameterError, match="not known"):
        S.check_engine("tgi")


def test_a_server_port_already_taken_is_one_line():
    with socket.socket() as s:
        s.bind((S.HOST, 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(ParameterError, match=f"server port {port} is already taken"):
            S.pick_port(port)
    assert S.pick_port(None) > 0


class _CPUAdapter:
    def unsupported(self, kind, point):
        return None

    def is_host_cpu(self):
        return True


def test_vllm_on_cpu_without_a_kernel_for_the_head_width_is_unsupported():
    point = SM.ServePoint(system="cpu", precision="fp32", preset="gpt2-debug", engine="vllm", concurrency=1)
    reason = SM.unsupported_serve(_CPUAdapter(), point)
    assert reason and "head_dim 16" in reason
    genslm = point.model_copy(update={"preset": "genslm-debug", "engine": "transformers"})
    assert "vocabulary of 71 ids" in SM.unsupported_serve(_CPUAdapter(), genslm)


# ---- statistics -----------------------------------------------------------------------------------

def _request(ttft_s: float, gaps: list[float]) -> RequestResult:
    return RequestResult(ttft_s=ttft_s, itl_s=gaps, e2e_s=ttft_s + sum(gaps), output_tokens=len(gaps) + 1)


def test_load_metrics_against_hand_counts():
    # 3 requests over 2 s (end to end 0.6, 0.9, 3.1 s: p99 interpolated 98 % of the way from the second to the third): TPOTs 0.05, 0.2 (over the 0.1 s limit), 0.05; one TTFT (3 s) over the 2 s limit
    reqs = [_request(0.5, [0.05, 0.05]), _request(0.5, [0.2, 0.2]), _request(3.0, [0.05, 0.05]),
            RequestResult(error="HTTP 500")]
    m = stats.load_metrics(reqs, 2.0, stats.MLPERF_SLO_S)
    assert m["serve_requests_ok"] == 3 and m["serve_requests_failed"] == 1
    assert m["serve_requests_per_s"] == 1.5 and m["serve_output_tokens_per_s"] == 9 / 2
    assert m["goodput_requests_per_s"] == 0.5 and m["goodput_pct"] == 25.0
    assert m["serve_ttft_p50_s"] == 0.5 and m["serve_tpot_p50_s"] == pytest.approx(0.05)
    assert m["serve_itl_p50_s"] == pytest.approx(0.05) and m["serve_e2e_p99_s"] == pytest.approx(0.9 + 0.98 * 2.2)
    assert not M.undeclared(m)


def test_poisson_arrivals_are_seeded_at_the_set_rate():
    from accel_kit.serving.load import arrival_times_s

    times = arrival_times_s(4000, 8.0, seed=3)
    assert times == arrival_times_s(4000, 8.0, seed=3) and times != arrival_times_s(4000, 8.0, seed=4)
    assert times == sorted(times) and times[-1] / 4000 == pytest.approx(1 / 8, rel=0.05)  # mean gap 1/rate


def test_prompts_are_seeded_different_and_of_the_set_token_count(tmp_path):
    from tokenizers import Tokenizer

    from accel_kit.serving.load import make_prompts
    from accel_kit.serving.model_dir import write_tokenizer

    write_tokenizer(tmp_path, 512)  # the GPT-2 BPE cut to 512 ids (llama3-debug's vocabulary)
    prompts = make_prompts(tmp_path, 4, 12, seed=0)
    assert prompts == make_prompts(tmp_path, 4, 12, seed=0) and len(set(prompts)) == 4
    tok = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert all(len(ids) == 12 and max(ids) < 512 for ids in (tok.encode(p).ids for p in prompts))


# ---- a server that dies, and a real one -----------------------------------------------------------

_DYING_SERVER = textwrap.dedent("""
    import http.server, os, sys
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
        def do_POST(self):
            print("dying on the first request", flush=True); os._exit(3)
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
""")


def _started_groups(monkeypatch) -> list[int]:
    """The process group of every server started from now on (each server leads its own)."""
    groups: list[int] = []
    enter = S.Server.__enter__

    def spy(self):
        out = enter(self)
        groups.append(self.proc.pid)
        return out

    monkeypatch.setattr(S.Server, "__enter__", spy)
    return groups


def _gone(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return True
    return False


def _tiny_model_dir(preset: str, folder: Path, **kw) -> Path:
    """A model folder of tokenizer files only (what the load generator reads), for a server that loads nothing."""
    from tokenizer_files import write_tokenizer_json

    folder.mkdir(parents=True, exist_ok=True)
    write_tokenizer_json(folder / "tokenizer.json")
    return folder


def test_a_server_that_dies_is_an_error_with_its_log_tail_and_the_next_point_runs(monkeypatch, tmp_path):
    import accel_kit.serving.model_dir

    monkeypatch.setattr(accel_kit.serving.model_dir, "write_model_dir", _tiny_model_dir)
    script = tmp_path / "dying.py"
    script.write_text(_DYING_SERVER)
    monkeypatch.setattr(S, "check_engine", lambda engine: None)
    monkeypatch.setattr(S, "server_command", lambda engine, model_dir, port, **kw: [sys.executable, str(script),
                                                                                    str(port)])
    groups = _started_groups(monkeypatch)
    points = [SM.ServePoint(system="cpu", precision="fp32", preset="gpt2-debug", concurrency=1, n_requests=2,
                            prompt_tokens=4, output_tokens=2, warmup_requests=0, start_timeout_s=30) for _ in range(2)]
    t0 = time.monotonic()
    results = SM.measure_points(points, tmp_path)
    assert [r.status for r in results] == ["error", "error"]
    assert results[0].reason == "the transformers server exited with status 3: dying on the first request"
    assert "dying on the first request" in results[0].traceback
    assert len(groups) == 2 and all(_gone(g) for g in groups)  # restarted for the second point, both stopped
    assert time.monotonic() - t0 < 60


@pytest.mark.slow
def test_transformers_serve_under_three_loads(monkeypatch, tmp_path):
    for module in ("fastapi", "uvicorn", "openai"):
        pytest.importorskip(module, reason="transformers serve needs the serving extra: pip install -e '.[serving]'")
    groups = _started_groups(monkeypatch)
    load = dict(system="cpu", precision="fp32", preset="gpt2-debug", n_requests=3, prompt_tokens=8, output_tokens=4,
                start_timeout_s=120, request_timeout_s=60)
    points = [SM.ServePoint(concurrency=1, **load), SM.ServePoint(concurrency=2, **load),
              SM.ServePoint(request_rate=20.0, seed=1, **load)]  # Poisson arrivals, 20 per second
    try:
        results = SM.measure_points(points, tmp_path, deadline_s=120)
    finally:
        assert len(groups) == 1  # one server for the three points
        assert _gone(groups[0]), "the server's process group outlived its points"
    for r in results:
        assert r.status == "ok", r.reason
        m = r.metrics
        assert m["serve_requests_ok"] == 3 and m["serve_requests_failed"] == 0
        assert m["serve_output_tokens"] <= 3 * 4 and m["serve_output_tokens_per_s"] > 0
        for name in ("ttft", "tpot", "itl", "e2e"):
            p50, p90, p99 = (m[f"serve_{name}_p{q}_s"] for q in stats.PERCENTILES)
            assert 0 < p50 <= p90 <= p99 < 60, name
        assert m["serve_ttft_p99_s"] <= m["serve_e2e_p99_s"]
        assert 0 <= m["goodput_requests_per_s"] <= m["serve_requests_per_s"]
        assert not M.undeclared(m)
    assert results[0].metrics["serve_server_start_s"] > 0 and results[1].metrics["serve_server_start_s"] == 0
    assert len(results) == 3
    assert (tmp_path / "transformers-gpt2-debug.log").exists()


def test_a_server_stops_on_keyboard_interrupt(monkeypatch, tmp_path):
    script = tmp_path / "dying.py"
    script.write_text(_DYING_SERVER)
    monkeypatch.setattr(S, "check_engine", lambda engine: None)
    monkeypatch.setattr(S, "server_command", lambda engine, model_dir, port, **kw: [sys.executable, str(script),
                                                                                    str(port)])
    server = S.Server("transformers", tmp_path, tmp_path / "log.txt", start_timeout_s=30)
    with pytest.raises(KeyboardInterrupt):
        with server:
            group = server.proc.pid
            raise KeyboardInterrupt
    assert _gone(group)
    assert signal.SIGTERM  # the group was stopped by signal, not left to exit on its own


def test_a_server_dies_with_the_process_that_started_it(tmp_path):
    """A point's process killed (its timeout's SIGKILL) takes its server along: the server is in a session of its
    own, so the point's process-group kill misses it, and the kernel's parent-death signal ends it instead."""
    import subprocess

    script = tmp_path / "dying.py"
    script.write_text(_DYING_SERVER)
    starter = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from accel_kit.serving import server as S
        S.check_engine = lambda engine: None
        S.server_command = lambda engine, model_dir, port, **kw: [sys.executable, {str(script)!r}, str(port)]
        s = S.Server("transformers", Path({str(tmp_path)!r}), Path({str(tmp_path / "log.txt")!r})).__enter__()
        print(s.proc.pid, flush=True)
        time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", starter], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    try:
        group = int(proc.stdout.readline())
    finally:
        proc.kill()
        proc.wait(timeout=10)
    deadline = time.monotonic() + 10
    while not _gone(group) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(group)


def test_a_studys_serve_points_are_records_resumed_and_unsupported_where_they_cannot_run(monkeypatch, tmp_path):
    import accel_kit.serving.model_dir
    from accel_kit import results

    monkeypatch.setattr(accel_kit.serving.model_dir, "write_model_dir", _tiny_model_dir)
    script = tmp_path / "dying.py"
    script.write_text(_DYING_SERVER)
    monkeypatch.setattr(S, "check_engine", lambda engine: None)
    monkeypatch.setattr(S, "server_command", lambda engine, model_dir, port, **kw: [sys.executable, str(script),
                                                                                    str(port)])
    groups = _started_groups(monkeypatch)
    base = dict(system="cpu", precision="fp32", n_requests=1, prompt_tokens=4, output_tokens=2, warmup_requests=0)
    points = [SM.ServePoint(preset="gpt2-debug", concurrency=1, **base),
              SM.ServePoint(preset="genslm-debug", concurrency=1, **base),
              SM.ServePoint(preset="gpt2-debug", request_rate=5.0, **base)]
    path = tmp_path / "out" / "inference" / "cpu.jsonl"
    kw = dict(records_path=path, extra_params={"profile": "test"}, timeout_s=60, progress=False)
    from accel_kit.engine.sweep import run_sweep

    recs = run_sweep("inference", points, run_id="r1", **kw)  # through the sweep, in its process: one server a group
    assert [r.status for r in recs] == ["error", "unsupported", "error"]
    assert "vocabulary of 71 ids" in recs[1].reason and recs[0].kind == "serve"
    assert len(list(results.iter_records(path))) == 3 and len(groups) == 2 and all(_gone(g) for g in groups)
    again = run_sweep("inference", points, run_id="r2", **kw)  # the sweep's resume: errors run again
    assert again[1].record_id == recs[1].record_id and again[0].record_id != recs[0].record_id
    assert len(groups) == 4 and all(_gone(g) for g in groups)
