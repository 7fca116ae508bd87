"""The inference study's offline-generation points end to end on the CPU: the CLI's smoke run, bad input, the
notebook (papermill), and the kind's own answers (a family without a KV cache, percentiles)."""
import pytest
from cli_checks import fail_one_line

from accel_kit import cli, metrics, results


@pytest.mark.slow  # about 20 s on 2 busy cores: the bandwidth, the fork server with transformers, the reference
def test_a_smoke_run_through_the_cli_gives_ok_records_with_percentiles_mfu_and_mbu(out_dir):
    # one preset of the smoke profile (the notebook's nbval run covers both): two points, the first with the
    # transformers reference (which the smoke profile leaves off)
    assert cli.main(["run", "inference", "--system", "cpu", "--profile", "smoke", "-p", "presets", "[llama3-debug]",
                     "-p", "hf_reference", "true", "--output-dir", str(out_dir), "-q"]) == 0
    recs = list(results.iter_records(out_dir / "inference" / "cpu.jsonl"))
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
    assert first["hf_tokens_equal"] is True and first["hf_decode_tokens_per_s"] > 0
    assert recs[1]["metrics"].get("hf_decode_tokens_per_s") is None  # one reference per preset


def test_bad_input_is_one_line(capsys):
    err = fail_one_line(["run", "inference", "--system", "cpu", "--profile", "smoke", "-p", "output_lens", "[250]"],
                        capsys)
    assert "output_lens" in err and "exceed the 256 positions of gpt2-debug" in err
    err = fail_one_line(["run", "inference", "--system", "cpu", "--profile", "smoke", "-p", "presets", "[nope]"],
                        capsys)
    assert "unknown model preset 'nope'" in err


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
             "hf_tokens_equal": True if b == 1 else None} for b in (1, 4)]
    df = pd.DataFrame(rows)
    assert list(inference.table(df)["batch_size"]) == [1, 4]
    figs = inference.figures(df)
    assert set(figs) == {"inference_decode_throughput", "inference_prefill_throughput", "inference_ttft",
                         "inference_tpot"}
    assert figs["inference_ttft"].layout.yaxis.title.text == "TTFT (ms)"
    said = [f["text"] for f in inference.findings(df)]
    assert "decode at batch 4 gives 4.00x (95 % CI" in said[0]
    assert "our decode gives 1.25x (95 % CI" in said[1] and "greedy tokens equal" in said[1]


@pytest.mark.slow
def test_the_notebook_runs_the_smoke_profile(out_dir):
    from training_notebooks import run_notebook

    df = run_notebook("inference", out_dir, profile="smoke", output_dir=str(out_dir), presets=["llama3-debug"],
                      batch_sizes=[1])
    assert list(df["status"]) == ["ok"] and df["tpot_p99_s"].notna().all()
    page = (out_dir / "inference.ipynb").read_text()
    assert "Report: " in page and "Decode throughput against batch" in page
