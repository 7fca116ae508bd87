"""The hf family: any transformers causal LM from a config.json the test writes with transformers' config classes."""
from __future__ import annotations

import json

import pytest
import torch

from accel_kit import cli
from accel_kit.errors import ParameterError
from accel_kit.models import FAMILIES, check_preset, family_of, get_config

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=256, max_position_embeddings=64)


def _write(tmp_path, name: str, hf_config) -> str:
    folder = tmp_path / name
    hf_config.save_pretrained(folder)
    return f"hf:{folder}"


def _shapes(tmp_path) -> dict[str, str]:
    """Tiny Qwen2-, Mistral- and Gemma-shaped configs (Gemma: an explicit head_dim, tied embeddings)."""
    from transformers import GemmaConfig, MistralConfig, Qwen2Config

    return {"qwen2": _write(tmp_path, "qwen2", Qwen2Config(**TINY)),
            "mistral": _write(tmp_path, "mistral", MistralConfig(**TINY, sliding_window=None)),
            "gemma": _write(tmp_path, "gemma", GemmaConfig(**TINY, head_dim=16))}


def _native_as_hf(tmp_path, preset: str) -> tuple[object, str]:
    """Our preset's config and the same shape written as transformers' config.json (the family's hf_config)."""
    cfg = get_config(preset, seq_len=32)
    return cfg, _write(tmp_path, preset, family_of(cfg).hf_config(cfg))


@pytest.mark.parametrize("preset", ["gpt2-debug", "llama3-debug"])
def test_counted_flops_agree_with_the_analytic_convention(tmp_path, preset):
    """GPT-2 and Llama shapes as configs: counted forward, backward and total within 1 % of our formulas
    (the full score matrix counted, backward twice the forward)."""
    cfg, hf_preset = _native_as_hf(tmp_path, preset)
    analytic = family_of(cfg).flop_terms(cfg, 32)
    hf_cfg = get_config(hf_preset, seq_len=32)
    family = family_of(hf_cfg)
    counted = family.flop_terms(hf_cfg, 32, micro_batch=2)
    assert family.flops_source(hf_cfg, 32, micro_batch=2) == "counted"
    for term in ("matmul", "attention", "logits"):
        assert getattr(counted, term) == pytest.approx(getattr(analytic, term), rel=0.01), term
    assert counted.backward == pytest.approx(2 * analytic.forward, rel=0.01)
    assert counted.total() == pytest.approx(analytic.total(), rel=0.01)
    assert family.layer_weight_count(hf_cfg) == FAMILIES[family_of(cfg).name].layer_weight_count(cfg)


def test_sdpa_attention_is_counted_as_eager_attention_is(tmp_path, monkeypatch):
    """On the CPU torch counts nothing for fused SDPA: our formula makes SDPA's count equal the
    explicit-matmul attention's, and a counter that still sees no attention adds the analytic term."""
    from accel_kit.models.hf import count, family as hf_family
    from accel_kit.models.hf.model import HFCausalLM

    cfg = get_config(_shapes(tmp_path)["qwen2"], seq_len=32)
    sdpa = family_of(cfg).flop_terms(cfg, 32)
    expected = 2 * 4 * 32 * cfg.n_heads * cfg.head_dim  # 2 layers x 4 s nh hd per token
    assert sdpa.attention == expected

    class Eager(HFCausalLM):  # the same model with transformers' explicit-matmul attention
        def __init__(self, c):
            super().__init__(c)
            self.model.config._attn_implementation = "eager"

    eager, source = count.count_flop_terms(lambda: Eager(cfg), micro_batch=1, seq_len=32, n_layers=2, n_heads=4,
                                           head_dim=16)
    assert (eager.attention, eager.backward, source) == (sdpa.attention, sdpa.backward, "counted")
    monkeypatch.setattr(count, "_formulas", dict)  # as if no formula knew the attention kernel
    hf_family._counted.cache_clear()
    missed, source = count.count_flop_terms(lambda: HFCausalLM(cfg), micro_batch=1, seq_len=32, n_layers=2,
                                            n_heads=4, head_dim=16)
    assert (missed.attention, source) == (expected, "counted; attention analytic")
    assert missed.total() == sdpa.total()


def test_training_matches_the_native_family(tmp_path):
    """Our GPT-2's weights in transformers' GPT-2 (the hf family's wrapper): the same batches give the same
    losses step for step (fp32, 3 steps)."""
    from accel_kit.data import SyntheticBatches
    from accel_kit.engine.step import OptimConfig, Trainer
    from accel_kit.models import build_model
    from accel_kit.models.hf.model import HFCausalLM

    cfg, hf_preset = _native_as_hf(tmp_path, "gpt2-debug")
    torch.manual_seed(0)
    native = build_model("gpt2-debug", seq_len=32)
    wrapped = HFCausalLM(get_config(hf_preset, seq_len=32), model=family_of(cfg).to_hf(native))
    losses = []
    for model in (native, wrapped):
        model.train()
        batches = SyntheticBatches(family_of(cfg).shape(cfg).vocab_size, 32, 2, seed=0)
        trainer = Trainer(model, iter(batches), torch.device("cpu"), "fp32", 2, OptimConfig(warmup_steps=1))
        losses.append([trainer.step() for _ in range(3)])
    assert losses[1] == pytest.approx(losses[0], rel=1e-5)


@pytest.mark.parametrize("case", ["no config", "not causal", "unknown architecture", "heads"])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, case):
    from transformers import ViTConfig

    folder = tmp_path / "m"
    folder.mkdir()
    if case == "not causal":
        ViTConfig().save_pretrained(folder)
    elif case == "unknown architecture":
        (folder / "config.json").write_text(json.dumps({"model_type": "no-such-model", "hidden_size": 64}))
    elif case == "heads":
        (folder / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_embd": 64, "n_head": 5}))
    expected = {"no config": "no config file", "not causal": "not a causal language model",
                "unknown architecture": "cannot read this config", "heads": "do not divide the width"}[case]
    with pytest.raises(ParameterError, match=expected):
        check_preset(f"hf:{folder}")
    with pytest.raises(SystemExit) as info:
        cli.main(["run", "gas", "--system", "cpu", "--profile", "smoke", "--output-dir", str(tmp_path / "out"),
                  "-p", "preset", f"hf:{folder}"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("accel-kit: error: ") and expected in err and err.count("\n") == 1


@pytest.mark.slow
# Two dense shapes through the studies (Mistral's is Llama's, which the counted-FLOPs check above covers; the
# MoE architectures' smoke runs are in test_hf_moe.py).
@pytest.mark.parametrize("shape", ["qwen2", "gemma"])
def test_gas_and_scaling_smoke_run_ok_with_counted_flops(tmp_path, shape):
    from accel_kit.metrics import undeclared
    from accel_kit.studies import run_study

    preset = _shapes(tmp_path)[shape]
    records = []
    for study, axes in (("gas", {"micro_batch_sizes": [1]}), ("scaling", {"device_counts": [1]})):
        run = run_study(study, "cpu", "smoke", output_dir=tmp_path / "out", progress=False, preset=preset,
                        data="synthetic", **axes)
        records += list(run.records if hasattr(run, "records") else run)
    assert len(records) == 3
    for rec in records:
        m = rec["metrics"]
        assert rec["status"] == "ok", rec.get("reason")
        assert (m["family"], m["flops_source"]) == ("hf", "counted")
        assert m["flops_per_token"] > 0 and m["loader_tokens_per_s"] > 0 and m["step_input_tokens_per_s"] > 0
        assert isinstance(m["input_bound"], bool)
        assert not undeclared(m)


def test_findings_name_the_input_bound_points():
    """The report's findings list a study's input-bound points (and say nothing where none was)."""
    from types import SimpleNamespace

    from accel_kit.report.findings import input_bound
    from accel_kit.results import Record

    def rec(i, bound, wait):
        return Record(record_id=f"r{i}", status="ok", study="gas", system="cpu", kind="train", run_id="r", params={},
                      model=f"m{i}", metrics={"input_bound": bound, "input_wait_pct": wait,
                                              "loader_tokens_per_s": 1000.0, "step_input_tokens_per_s": 400.0})

    cited = []
    ctx = SimpleNamespace(records=SimpleNamespace(records=[rec(1, False, 1.0), rec(2, True, 40.0), rec(3, True, 20.0)],
                                                  column=lambda r: r.system),
                          cite=SimpleNamespace(refs=lambda ids: cited.append(list(ids)) or ""))
    [line] = input_bound(ctx)
    assert "2 point(s) waited on their input" in line and "m2" in line and "40.0 %" in line
    assert cited == [["r2", "r3"]]
    ctx.records.records = [rec(1, False, 1.0)]
    assert input_bound(ctx) == []


def test_an_edited_config_file_is_a_new_point(tmp_path):
    """A point's resume key holds the config file's contents, not only its path: the file edited, the
    point runs again; a named preset's key is as it was (no digest)."""
    from transformers import Qwen2Config

    from accel_kit.engine.point import TrainPoint
    from accel_kit.models import preset_digest

    preset = _write(tmp_path, "qwen2", Qwen2Config(**TINY))
    point = TrainPoint(system="cpu", preset=preset, vocab_size=256, precision="fp32", micro_batch_size=1, gas=1,
                       seq_len=32, devices=1, steps=2, warmup_steps=1)
    before = point.key()
    assert point.key() == before  # the same file: the same point
    _write(tmp_path, "qwen2", Qwen2Config(**(TINY | {"num_hidden_layers": 3})))
    assert point.key() != before
    assert preset_digest("gpt2-debug") is None


@pytest.mark.slow  # the check loads the config, building transformers' model on the meta device: seconds at first
def test_layouts_the_family_has_not_built_are_refused_in_one_line(tmp_path):
    from transformers import Qwen2Config

    from accel_kit.engine.layout import check_layout
    from accel_kit.engine.point import TrainPoint

    preset = _write(tmp_path, "qwen2", Qwen2Config(**TINY))
    for fields, message in (({"tp": 2}, "the hf family has no tensor-parallel plan"),
                            ({"pp": 2}, "the hf family's models do not split into pipeline stages here")):
        point = TrainPoint(system="cpu", preset=preset, precision="fp32", micro_batch_size=4, seq_len=16, devices=2,
                           **fields)
        with pytest.raises(ParameterError, match=message):
            check_layout(point)
