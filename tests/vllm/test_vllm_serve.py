"""After `make vllm`: vLLM's CPU server (from .venv-vllm, random weights) under one load, driven from the main
environment, and the same model through transformers serve. Skipped where .venv-vllm is absent; run by
`make test-vllm`, not by make test (vLLM's CPU server takes a minute or more to start on a small machine)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from accel_kit.serving import server as S

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(S.vllm_python() is None, reason="needs the vLLM environment: make vllm")]


def tiny_llama(folder: Path) -> str:
    """An hf: config vLLM's CPU attention has a kernel for (head_dim 64), two layers, a 512-id vocabulary."""
    from transformers import LlamaConfig

    LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
                num_key_value_heads=2, head_dim=64, vocab_size=512, max_position_embeddings=256,
                tie_word_embeddings=True).save_pretrained(folder)
    return f"hf:{folder / 'config.json'}"


def test_vllm_cpu_serves_a_load(tmp_path, monkeypatch):
    from accel_kit.engine import serve_measure as SM

    preset = tiny_llama(tmp_path / "config")
    groups: list[int] = []
    enter = S.Server.__enter__
    monkeypatch.setattr(S.Server, "__enter__", lambda self: (enter(self), groups.append(self.proc.pid))[0])
    point = SM.ServePoint(system="cpu", precision="fp32", preset=preset, engine="vllm", concurrency=2, n_requests=4,
                          prompt_tokens=16, output_tokens=8, start_timeout_s=400, request_timeout_s=120)
    (result,) = SM.measure_points([point], tmp_path / "work", deadline_s=300)
    assert result.status == "ok", (result.reason, result.traceback)
    m = result.metrics
    assert m["serve_requests_ok"] == 4 and m["serve_output_tokens"] == 4 * 8  # ignore_eos: every answer full length
    assert 0 < m["serve_tpot_p50_s"] <= m["serve_tpot_p99_s"]
    for group in groups:
        with pytest.raises(ProcessLookupError):
            os.killpg(group, 0)
