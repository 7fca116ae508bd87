"""The studies and energy: the figures and tables of tokens and FLOPs per joule."""


def _rows(**per_j):
    import pandas as pd

    return pd.DataFrame([{"system": s, "preset": "gpt2-debug", "precision": "bf16", "devices": n, "status": "ok",
                          "timestamp": f"2026-01-01T00:00:0{n}", "tokens_per_s": 1000.0 * n,
                          "tokens_per_s_per_device": 1000.0, "mfu_measured_pct": 40.0, "global_batch_size": 8 * n,
                          "tokens_per_j": per_j.get(s), "power_avg_w": 300.0 if per_j.get(s) else None,
                          "energy_j": 50.0 if per_j.get(s) else None}
                         for s in ("h200", "cpu") for n in (1, 2)])


def test_training_figures_show_tokens_per_joule_beside_tokens_per_second():
    from accel_kit.studies import scaling

    figs = scaling.figures(_rows(h200=3.5))
    assert set(figs) == {"scaling_throughput", "scaling_energy"}
    traces = {t.name: list(t.y) for t in figs["scaling_energy"].data}
    assert traces == {"h200": [3.5, 3.5]}  # the CPU read no energy: left out, not drawn at 0
    assert "tokens / J" in figs["scaling_energy"].layout.yaxis.title.text
    assert list(scaling.table(_rows(h200=3.5)).columns).count("tokens_per_j") == 1
    none = _rows()
    assert set(scaling.figures(none)) == {"scaling_throughput"} and "tokens_per_j" not in scaling.table(none)


def test_microbenchmark_figures_show_flops_per_joule():
    import pandas as pd

    from accel_kit.studies import microbenchmark

    df = pd.DataFrame([{"system": "h200", "impl": "native", "precision": "bf16", "batch_size": b,
                        "direction": "forward_backward", "status": "ok", "timestamp": "t", "seq_len": 1024,
                        "tflops": 600.0, "flops_per_j": 1.2e12, "power_avg_w": 500.0, "energy_j": 2500.0}
                       for b in (16, 64)])
    figs = microbenchmark.figures(df)
    assert set(figs) == {"microbenchmark_forward_backward", "microbenchmark_forward_backward_energy"}
    assert list(figs["microbenchmark_forward_backward_energy"].data[0].y) == [1200.0, 1200.0]  # GFLOP / J
