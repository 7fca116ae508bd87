"""The GenSLM study (Table IV): parameters, genome rows, attention kernels, frontier, notebook end to end."""
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from accel_kit import results, studies
from accel_kit.data import IGNORE_INDEX, PaddedRowBatches, read_meta
from accel_kit.errors import ParameterError
from accel_kit.studies import genslm
from accel_kit.tokenizers import load_tokenizer
from accel_kit.engine.attention import AttentionKernelUnavailable, kernel_of_ops, probe_attention_kernel

TINY = dict(precision="bf16", micro_batch_size=2, steps=2, warmup_steps=1, measure_peak=False, timeout_s=180,
            synthetic_records=4, quality_preset=None)

# Records longer than the rows below (truncated) and shorter (padded), with ambiguous IUPAC
# bases, gaps, lower case and a wrapped line. The last goes to the validation split (a tiny
# corpus gives its last record to val), the others are the training rows.
AMBIGUOUS_FASTA = """>wrapped lower
atggcc
aaa
>long
ATGGCCAAAGGGTTTCCCAAATTTGGGCCCATGTAA
>ambiguous IUPAC and a gap
ATGNNNGCCRYAaaa---TAA
>held out
ATGAAATAA
"""


def _write_fasta(path: Path) -> Path:
    path.write_text(AMBIGUOUS_FASTA)
    return path


def test_params_name_the_field_and_what_to_use():
    for bad, field in [(dict(preset="genslm-25m"), "preset"), (dict(seq_len=1024), "seq_len"),
                       (dict(data="text"), "data"), (dict(presets=["genslm-1t"]), "presets"),
                       (dict(quality_preset="nope"), "quality_preset"),
                       (dict(attention_kernel="fast"), "attention_kernel"), (dict(tokenizer="gpt2"), "tokenizer")]:
        with pytest.raises(ParameterError, match=f"parameter '{field}'"):
            studies.resolve("genslm", "quick", **bad)
    params = studies.resolve("genslm", "quick")
    assert params.point_presets() == ["genslm-debug", "genslm-25m"]  # the quality preset first, added once
    assert params.model_vocab_size() == 71
    assert studies.resolve("genslm", "quick", tokenizer="codon-69").model_vocab_size() == 69
    full = studies.resolve("genslm", "full")
    assert {"genslm-25b", "gpt2-13b", "genslm-gpt3-xl"} <= set(full.presets) and max(full.seq_lens) == 10240


def test_vocab_smaller_than_the_tokenizer_is_rejected_before_any_work(out_dir):
    with pytest.raises(ParameterError, match="vocab_size.*smaller than the 71 tokens"):
        studies.run_study("genslm", "cpu", None, progress=False, presets=["genslm-debug"], seq_lens=[32],
                          vocab_size=70, **TINY)
    assert not (out_dir / "data").exists()


def test_attention_probe_names_the_kernel_that_ran_on_cpu():
    shape = dict(n_heads=4, head_dim=16, seq_len=128, device=torch.device("cpu"))
    auto = probe_attention_kernel("auto", dtype=torch.bfloat16, **shape)
    assert auto == {"attention_kernel_ran": "flash",
                    "attention_op": "aten::_scaled_dot_product_flash_attention_for_cpu"}
    assert probe_attention_kernel("math", dtype=None, **shape)["attention_kernel_ran"] == "math"
    with pytest.raises(AttentionKernelUnavailable, match="'efficient' is not available on cpu"):
        probe_attention_kernel("efficient", dtype=torch.bfloat16, **shape)
    assert kernel_of_ops({"aten::_scaled_dot_product_efficient_attention", "aten::mm"}) == (
        "efficient", "aten::_scaled_dot_product_efficient_attention")
    assert kernel_of_ops({"aten::bmm", "aten::_safe_softmax"}) == ("math", "aten::_scaled_dot_product_attention_math")
    assert kernel_of_ops({"aten::mm"}) == (None, None)


def test_genome_rows_hold_one_record_each_with_padding_masked(tmp_path):
    """The padding rule: a row is one record ([BOS] codons [EOS] [PAD]...); targets at padding are -100."""
    params = genslm.Params(fasta=str(_write_fasta(tmp_path / "g.fasta")), synthetic_records=1)
    folders, source = genslm.prepare_genomes(params, tmp_path / "data", [8], progress=False)
    assert source == f"fasta:{(tmp_path / 'g.fasta').resolve()}"
    meta = read_meta(folders[8])
    assert meta["records"] == 4 and meta["truncated_records"] == 2 and meta["block_size"] == 8
    tok = load_tokenizer("codon-71")
    batches = PaddedRowBatches(folders[8], batch_size=16, seed=1)
    x, y = batches.next()
    rows = {tuple(r) for r in np.fromfile(Path(folders[8]) / meta["splits"]["train"]["file"],
                                          dtype=meta["dtype"]).reshape(-1, 8).tolist()}
    codon = tok.vocab  # codon string -> id
    # The ambiguous record: ATG NNN GCC RYA AAA --- TAA -> truncated to 6 codons, [UNK] for N/R/Y/-.
    assert (2, codon["ATG"], tok.unk_id, codon["GCC"], tok.unk_id, codon["AAA"], tok.unk_id, 3) in rows
    for row, target in zip(x.tolist(), y.tolist()):
        assert tuple(row) in rows  # a whole stored row: never two records side by side
        assert row[0] == tok.bos_id and tok.bos_id not in row[1:] and row.count(tok.eos_id) == 1
        end = row.index(tok.eos_id)
        assert all(t == tok.pad_id for t in row[end + 1:])
        for t in range(8):
            has_target = t < 7 and row[t + 1] != tok.pad_id
            assert (target[t] == row[t + 1]) if has_target else (target[t] == IGNORE_INDEX)
    # A row padded after [EOS] ("wrapped lower": ATG GCC AAA) is in the sample.
    assert any(tok.pad_id in row for row in x.tolist())


@pytest.mark.slow
def test_study_on_synthetic_genomes_records_table_iv_metrics(out_dir):
    run = studies.run_study("genslm", "cpu", None, progress=False, presets=["genslm-debug"], seq_lens=[64, 32],
                            **TINY)
    recs = run.records
    assert [r["params"]["seq_len"] for r in recs] == [32, 64]  # ascending: the frontier needs it
    assert all(r["status"] == "ok" for r in recs), [r["reason"] for r in recs]
    for rec in recs:
        p, m = rec["params"], rec["metrics"]
        assert p["vocab_size"] == 71 and p["tokenizer"] == "codon-71" and p["data"] == "synthetic-genomes"
        assert read_meta(p["data_path"])["block_size"] == p["seq_len"]  # a prepared folder per length
        assert m["tokens_per_s"] > 0 and m["samples_per_s_mean"] > 0
        assert m["samples_per_s_mean"] == pytest.approx(2 / (sum(rec["times_s"]) / len(rec["times_s"])))
        assert m["attention_kernel_ran"] == "flash" and p["attention_kernel"] == "auto"
        assert m["mfu_measured_pct"] is None and len(m["losses"]) == 3
    table = run.table()
    assert list(table["seq_len"]) == [32, 64] and {"samples_per_s_mean", "mfu_pct", "mem_peak_gib"} <= set(table)
    quality = genslm.quality(run.df())
    assert quality["uniform_codon_nats"].iloc[0] == pytest.approx(math.log(64))
    figs = run.figures()
    assert {"genslm_tokens_per_s", "genslm_samples_per_s", "genslm_memory", "genslm_loss"} <= set(figs)
    # Unchanged inputs: the second run reuses the prepared rows (and resumes every point).
    again = studies.run_study("genslm", "cpu", None, progress=False, presets=["genslm-debug"], seq_lens=[32, 64],
                              **TINY)
    assert again.reused == 2


@pytest.mark.slow
def test_user_fasta_with_ambiguous_bases_trains_with_forced_math_kernel(out_dir, tmp_path):
    fasta = _write_fasta(tmp_path / "mine.fa")
    run = studies.run_study("genslm", "cpu", None, progress=False, presets=["genslm-debug"], seq_lens=[8],
                            fasta=str(fasta), attention_kernel="math", **TINY)
    rec = run.records[0]
    assert rec["status"] == "ok", rec["reason"]
    assert rec["params"]["data"] == f"fasta:{fasta.resolve()}"
    assert rec["metrics"]["attention_kernel_ran"] == "math" and rec["metrics"]["tokens_per_s"] > 0


def test_unavailable_kernel_is_unsupported_and_does_not_move_the_frontier():
    from accel_kit.engine.point import TrainPoint
    from accel_kit.engine.sweep import is_memory_failure
    from accel_kit.engine.worker import run_point

    point = TrainPoint(system="cpu", preset="genslm-debug", precision="bf16", micro_batch_size=1, seq_len=32,
                       attention_kernel="efficient")
    result = run_point(point, rank=0, world=1, local_rank=0)  # in this process: the probe answers before a model is built
    assert result["status"] == "unsupported" and "'efficient' is not available on cpu" in result["reason"]
    # Not a memory failure: the sweep still tries the longer lengths.
    assert not is_memory_failure(result["status"], result["reason"])
    assert is_memory_failure("unsupported", "does not fit: needs about 400 GiB") and is_memory_failure("oom", None)


def test_memory_frontier_spans_the_per_length_data_folders(out_dir):
    run = studies.run_study("genslm", "cpu", None, progress=False, presets=["genslm-25b"], seq_lens=[32, 64],
                            **TINY)
    assert [r["status"] for r in run.records] == ["unsupported", "skipped"]
    assert "memory frontier" in run.records[1]["reason"] and "32" in run.records[1]["reason"]


def test_cli_rejects_a_bad_parameter_in_one_line(out_dir):
    proc = subprocess.run([sys.executable, "-m", "accel_kit.cli", "run", "genslm", "--system", "cpu", "-p", "presets",
                           "[genslm-1t]"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "parameter 'presets'" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_genslm_notebook(out_dir):
    """The notebook's cells' calls in this process (nbval runs the notebook itself, as committed)."""
    from training_notebooks import run_cells

    run_cells("genslm", out_dir, presets=["genslm-debug"], seq_lens=[64], quality_preset="genslm-debug",
              quality_steps=12, lr=3e-3, micro_batch_size=2, synthetic_records=8, measure_peak=False, timeout_s=180)
    df = results.load(out_dir / "genslm")
    assert list(df["status"]) == ["ok"] and (df["tokens_per_s"] > 0).all()
    losses = df["losses"].iloc[0]
    assert len(losses) == 13 and losses[-1] < losses[0] and losses[-1] < math.log(64) - 0.5  # it learns
    assert (out_dir / "genslm" / "figures" / "genslm_loss.html").exists()
    assert (out_dir / "genslm" / "figures" / "genslm_tokens_per_s.html").exists()
