"""The inference study end to end on the CPU: the CLI's smoke run (offline points, and a serve point against a
stand-in server), bad input (offline and serving), the notebook (papermill), the kind's own answers (a family
without a KV cache, percentiles), and the study's tables, figures and findings from records."""
import socket
import sys
import textwrap

import pytest
from cli_checks import fail_one_line

from accel_kit import cli, metrics, results

# An OpenAI-compatible stand-in: healthy at once, streams max_tokens one-word chunks, then the usage and [DONE]
# (the real server's start is ~11 s; tests/test_serving.py runs transformers serve itself)
_STREAMING_SERVER = textwrap.dedent("""
    import http.server, json, sys, time
    class H(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass
        def do_GET(self):
            self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            self.send_response(200); self.send_header("Content-Type", "text/event-stream"); self.end_headers()
            for _ in range(body["max_tokens"]):
                time.sleep(0.002)
                self.wfile.write(b'data: {"choices": [{"text": " a"}]}\\n\\n'); self.wfile.flush()
            usage = {"choices": [], "usage": {"completion_tokens": body["max_tokens"], "prompt_tokens": 4}}
            self.wfile.write(b"data: " + json.dumps(usage).encode() + b"\\n\\ndata: [DONE]\\n\\n")
    http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
""")


def _stand_in_server(monkeypatch, tmp_path) -> None:
    from accel_kit.serving import server as S

    script = tmp_path / "server.py"
    script.write_text(_STREAMING_SERVER)
    monkeypatch.setattr(S, "check_engine", lambda engine: None)
    monkeypatch.setattr(S, "server_command", lambda engine, model_dir, port, **kw: [sys.executable, str(script),
                                                                                    str(port)])


@pytest.mark.slow  # a stand-in server's start
def test_a_serve_point_runs_where_an_event_loop_already_runs(monkeypatch, tmp_path):
    # A Jupyter kernel runs its cells inside an asyncio loop, where asyncio.run refuses to start another:
    # make run's notebook served nothing but "asyncio.run() cannot be called from a running event loop".
    import asyncio

    from accel_kit.engine import serve_measure as SM

    _stand_in_server(monkeypatch, tmp_path)
    point = SM.ServePoint(system="cpu", precision="fp32", preset="gpt2-debug", concurrency=2, n_requests=3,
                          prompt_tokens=4, output_tokens=3, warmup_requests=0, start_timeout_s=60)

    async def a_cell():
        return SM.measure_points([point], tmp_path / "models")

    (result,) = asyncio.run(a_cell())
    assert result.status == "ok", (result.reason, result.traceback)


@pytest.mark.slow  # about 20 s on 2 busy cores: the bandwidth, the fork server with transformers, the reference
def test_a_smoke_run_through_the_cli_gives_ok_records_with_percentiles_mfu_and_mbu(out_dir, monkeypatch, tmp_path):
    # one preset of the smoke profile (the notebook's nbval run covers both): two points, the first with the
    # transformers reference (which the smoke profile leaves off); then one serve point, against the stand-in
    _stand_in_server(monkeypatch, tmp_path)
    assert cli.main(["run", "inference", "--system", "cpu", "--profile", "smoke", "-p", "presets", "[llama3-debug]",
                     "-p", "hf_reference", "true", "-p", "concurrencies", "[2]", "-p", "n_requests", "3",
                     "-p", "serve_input_lens", "[8]", "-p", "serve_output_lens", "[4]", "--output-dir", str(out_dir),
                     "-q"]) == 0
    recs = list(results.iter_records(out_dir / "inference" / "cpu.jsonl"))
    served = recs.pop()
    assert (served["status"], served["kind"], served["params"]["concurrency"]) == ("ok", "serve", 2), served["reason"]
    m = served["metrics"]
    assert m["serve_requests_ok"] == 3 and m["serve_output_tokens"] == 12 and not metrics.undeclared(m)
    assert 0 < m["serve_tpot_p50_s"] <= m["serve_tpot_p99_s"] and m["goodput_requests_per_s"] > 0
    assert (m["slo_ttft_s"], m["slo_tpot_s"]) == (2.0, 0.1)  # MLPerf Inference's Llama 3.1 8B server limits
    assert [(r["status"], r["kind"], r["params"]["batch_size"]) for r in recs] == [("ok", "generate", 1),
                                                                                  ("ok", "generate", 2)]
    for rec in recs:
        m = rec["metrics"]
        assert not metrics.undeclared(m), metrics.undeclared(m)
        assert m["ttft_s"] > 0 and m["prefill_tokens_per_s"] > 0 and m["decode_tokens_per_s"] > 0
        assert 0 < m["tpot_p50_s"] <= m["tpot_p90_s"] <= m["tpot_p99_s"]
        assert len(m["decode_tokens_per_s_trials"]) == rec["params"]["trials"] == len(rec["times_s"])
        for figure, reason in (("mfu_pct", "mfu_reason"), ("mfu_measured_pct", "mfu_measured_reason"),
                               ("mbu_pct", "mbu_reason"), ("mbu_measured_pct", "mbu_measured_reason")):
            assert m[figure] is not None or m.get(reason), (figure, m)  # a figure, or why there is none
        assert m["energy_per_output_token_j"] is not None or m["energy_reason"]
        assert m["mem_peak_gib"] is None or m["mem_peak_gib"] > 0
        # bytes a decode run reads: the weights once per step at least
        assert m["decode_bytes"] >= (rec["params"]["output_len"] - 1) * m["kv_cache_gib"] * 2**30 / 2
    first = recs[0]["metrics"]
    assert first["hf_decode_tokens_per_s"] > 0 and recs[0]["params"]["impl"] == "eager"  # a CPU's default
    # the token check: fp32 greedy tokens equal (fp32 run here too), teacher-forced top-1 agreement and logits
    assert first["tokens_equal_fp32"] is True and first["first_difference"] is None
    assert first["top1_agreement"] == 1.0 and 0 <= first["max_logit_diff"] < 1e-3
    assert recs[1]["metrics"].get("hf_decode_tokens_per_s") is None  # one reference per preset


def test_bad_input_is_one_line(capsys):
    err = fail_one_line(["run", "inference", "--system", "cpu", "--profile", "smoke", "-p", "output_lens", "[250]"],
                        capsys)
    assert "output_lens" in err and "exceed the 256 positions of gpt2-debug" in err
    err = fail_one_line(["run", "inference", "--system", "cpu", "--profile", "smoke", "-p", "presets", "[nope]"],
                        capsys)
    assert "unknown model preset 'nope'" in err


_SMOKE = ["run", "inference", "--system", "cpu", "--profile", "smoke"]


def test_a_request_rate_of_zero_is_one_line(capsys):
    err = fail_one_line(_SMOKE + ["-p", "request_rates", "[0]"], capsys)
    assert "request_rates" in err and "request_rate must be a positive number of requests per second" in err


_TINY_BERT = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, vocab_size=256,
                  max_position_embeddings=64)


# An encoder's config: transformers has a causal-LM class for model_type bert (BertLMHeadModel), so only the
# config's own architecture, or the attention it builds, says it does not generate.
@pytest.mark.parametrize("parameter", ["presets", "serve_presets"])
@pytest.mark.parametrize("encoder", [
    (dict(architectures=["BertModel"]), "its architecture BertModel has no causal-LM head"),
    (dict(), "BertLMHeadModel attends both ways for this config, as an encoder does")])
def test_an_encoder_only_config_is_refused_in_one_line_before_any_point(capsys, tmp_path, parameter, encoder):
    from transformers import BertConfig

    from hf_configs import write

    fields, why = encoder
    preset = write(tmp_path / "bert", BertConfig(**_TINY_BERT, **fields))
    err = fail_one_line(_SMOKE + ["--output-dir", str(tmp_path / "out"), "-p", parameter, f"[{preset}]"], capsys)
    assert f"parameter '{parameter}': model preset {preset} does not generate: {why}" in err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("*.jsonl"))  # no point ran


def test_a_decoder_bert_and_a_causal_lm_config_generate(tmp_path):
    from transformers import BertConfig, Qwen2Config

    from accel_kit import studies
    from hf_configs import write

    decoder = write(tmp_path / "bert", BertConfig(**_TINY_BERT, is_decoder=True, architectures=["BertLMHeadModel"]))
    qwen = write(tmp_path / "qwen",
                 Qwen2Config(**_TINY_BERT, num_key_value_heads=1, architectures=["Qwen2ForCausalLM"]))
    params = studies.resolve("inference", "smoke", presets=[qwen, "gpt2-debug"], serve_presets=[decoder, qwen])
    assert params.serve_presets == [decoder, qwen]


@pytest.mark.parametrize("slo", ["[0, 100ms]", "2000ms", "fast,slow"])
def test_an_slo_that_is_not_two_positive_durations_is_one_line(capsys, slo):
    err = fail_one_line(_SMOKE + ["-p", "slo", slo], capsys)
    assert "parameter 'slo'" in err and "two positive durations" in err


def test_an_engine_not_installed_is_one_line_naming_its_make_target(capsys, monkeypatch, tmp_path):
    import importlib.util

    from accel_kit.serving import server as S

    monkeypatch.setattr(S, "VLLM_VENV", tmp_path / "no-venv")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    err = fail_one_line(_SMOKE + ["-p", "engine", "vllm", "-p", "concurrencies", "[1]"], capsys)
    assert "engine vllm is not installed" in err and "make vllm" in err


def test_a_server_port_already_taken_is_one_line(capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        err = fail_one_line(_SMOKE + ["-p", "port", str(port), "-p", "concurrencies", "[1]"], capsys)
    assert f"server port {port} is already taken" in err


def test_serve_points_share_a_server_per_preset_and_carry_the_slo():
    from accel_kit import studies
    from accel_kit.studies import inference
    from accel_kit.systems import load_system

    params = studies.resolve("inference", "quick", serve_presets=["gpt2-debug", "llama3-debug"], slo="500ms,30ms")
    points = inference.serve_points(params, load_system("cpu"))
    assert [(p.preset, p.concurrency, p.request_rate) for p in points] == [
        ("gpt2-debug", 1, None), ("gpt2-debug", 4, None), ("gpt2-debug", None, 4.0),
        ("llama3-debug", 1, None), ("llama3-debug", 4, None), ("llama3-debug", None, 4.0)]
    assert len({p.server_key() for p in points}) == 2 and {(p.slo_ttft_s, p.slo_tpot_s) for p in points} == {(.5, .03)}
    smoke = studies.resolve("inference", "smoke")
    assert smoke.serves() and len(inference.serve_points(smoke, load_system("cpu"))) == 1  # one server start


def test_a_family_without_a_kv_cache_is_unsupported_with_the_reason(tmp_path):
    from transformers import Qwen2Config

    from accel_kit.devices import get_adapter
    from accel_kit.engine import kinds
    from accel_kit.engine.generate_measure import GeneratePoint

    from hf_configs import write

    hf = write(tmp_path / "m", Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                           num_attention_heads=2, num_key_value_heads=1, vocab_size=512))
    point = GeneratePoint(system="cpu", precision="fp32", preset=hf, batch_size=1, input_len=4, output_len=2)
    why = kinds.kind_of(point).unsupported(get_adapter("cpu"), point)
    assert "no static-KV-cache forward" in why
    ok = point.model_copy(update={"preset": "gpt2-debug"})
    assert kinds.kind_of(ok).unsupported(get_adapter("cpu"), ok) is None
    # the measured bandwidth is the run's, not the point's identity
    assert ok.key() == ok.model_copy(update={"bandwidth": {"gbps": 1.0, "best_kernel": "copy"}}).key()


def test_the_study_table_figures_and_findings_from_records():
    import pandas as pd

    from accel_kit.studies import inference

    rows = [{"system": "cpu", "kind": "generate", "status": "ok", "preset": "gpt2-debug", "precision": "fp32",
             "batch_size": b, "input_len": 16, "output_len": 8, "record_id": f"r{b}", "point_key": f"k{b}",
             "timestamp": "2026-01-01T00:00:00", "run_id": "x", "ttft_s": 0.01 * b, "tpot_p50_s": 0.002,
             "tpot_p90_s": 0.003, "tpot_p99_s": 0.004, "prefill_tokens_per_s": 100.0 * b,
             "decode_tokens_per_s": 50.0 * b, "decode_tokens_per_s_trials": [49.0 * b, 50.0 * b, 51.0 * b],
             "hf_decode_tokens_per_s": 40.0 if b == 1 else None,
             "hf_decode_tokens_per_s_trials": [39.0, 40.0, 41.0] if b == 1 else None,
             "tokens_equal_fp32": True if b == 1 else None, "first_difference": None,
             "top1_agreement": 0.992 if b == 1 else None, "max_logit_diff": 0.0625 if b == 1 else None}
            for b in (1, 4)]
    df = pd.DataFrame(rows)
    assert list(inference.table(df)["batch_size"]) == [1, 4]
    figs = inference.figures(df)
    assert set(figs) == {"inference_decode_throughput", "inference_prefill_throughput", "inference_ttft",
                         "inference_tpot"}
    assert figs["inference_ttft"].layout.yaxis.title.text == "TTFT (ms)"
    said = [f["text"] for f in inference.findings(df)]
    assert "decode at batch 4 gives 4.00x (95 % CI" in said[0]
    assert "our decode gives 1.25x (95 % CI" in said[1] and "fp32 greedy tokens equal" in said[1]
    assert "fp32 top-1 agreement 99.2 %, largest logit difference 0.0625" in said[1]


def test_the_serving_table_figures_and_findings_from_records():
    import pandas as pd

    from accel_kit import tables
    from accel_kit.studies import inference

    def row(i, concurrency=None, rate=None, tpot_p99_s=0.05):
        return {"system": "cpu", "kind": "serve", "status": "ok", "engine": "transformers", "preset": "gpt2-debug",
                "precision": "fp32", "prompt_tokens": 8, "output_tokens": 4, "concurrency": concurrency,
                "request_rate": rate, "record_id": f"s{i}", "point_key": f"s{i}", "timestamp": "2026-01-01T00:00:00",
                "run_id": "x", "serve_requests_per_s": 2.0, "serve_output_tokens_per_s": 8.0 * (concurrency or 1),
                "serve_ttft_p99_s": 0.5, "serve_tpot_p50_s": 0.04, "serve_tpot_p99_s": tpot_p99_s,
                "goodput_requests_per_s": 2.0 if tpot_p99_s <= 0.1 else 0.0, "goodput_pct": 100.0,
                "slo_ttft_s": 2.0, "slo_tpot_s": 0.1}

    offline = {"system": "cpu", "kind": "generate", "status": "ok", "preset": "gpt2-debug", "precision": "fp32",
               "batch_size": 1, "input_len": 16, "output_len": 8, "record_id": "g1", "point_key": "g1",
               "timestamp": "2026-01-01T00:00:00", "run_id": "x", "decode_tokens_per_s": 50.0}
    df = pd.DataFrame([offline, row(1, 1), row(2, 4, tpot_p99_s=0.2), row(3, rate=4.0)])
    assert list(inference.table(df)["record_id"]) == ["g1"]  # the offline table has no serving row
    served = inference.serve_table(df)
    assert list(served["record_id"]) == ["s1", "s2", "s3"]  # concurrency points first, then the rates
    shown = tables.readable(served, df)
    assert {"TPOT p99 (s)", "goodput (requests/s)", "request rate (requests/s)"} <= set(shown.frame.columns)
    assert list(shown.frame["concurrency"]) == ["1", "4", ""] and shown.shared["input (tokens)"] == "8"
    figs = inference.figures(df)
    assert {"inference_serve_tpot_concurrency", "inference_serve_goodput_concurrency",
            "inference_serve_tpot_request_rate"} <= set(figs)
    assert figs["inference_serve_tpot_concurrency"].layout.yaxis.title.text == "TPOT p99 (ms)"
    said = [f["text"] for f in inference.findings(df)]
    assert any("the SLO (p99 TTFT <= 2000 ms and TPOT <= 100 ms) holds up to concurrency 1;" in t and
               "8.0 at concurrency 1, 32.0 at 4" in t for t in said), said


@pytest.mark.slow
def test_the_notebooks_cells_run_the_smoke_profile(out_dir):
    from training_notebooks import run_cells

    from accel_kit import studies

    # The notebook's cells in this process, offline only: nbval runs the committed notebook in a kernel
    # (papermill's injection is the other studies' tests'), and it serves the smoke profile's point through
    # a real server.
    df = run_cells("inference", out_dir, profile="smoke", presets=["llama3-debug"], batch_sizes=[1], concurrencies=[])
    assert list(df["status"]) == ["ok"] and df["tpot_p99_s"].notna().all()
    figs = studies.figures("inference", out_dir / "inference", save=False)
    assert "Decode throughput against batch" in figs["inference_decode_throughput"].layout.title.text
