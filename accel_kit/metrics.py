"""The metrics a record may carry: each name once, with its unit and meaning.

A record's ``metrics`` (``accel_kit.results``) is a flat mapping, so that ``results.load``
gives users one column per metric; this table is its schema. Names carry their unit
(``_s``, ``_gib``, ``_pct``, ``_per_s``, ``_j``, ``_w``, ``tflops``), or are counts, flags and
texts whose unit is "1", "bool" or "text". A point kind's own metrics are declared where the kind
registers (``accel_kit.engine.kinds.register_kind``'s ``metrics``, through ``declare``), and a device
runtime's own figures by its adapter's package (``declare``). Tests check that every metric a real record carries
is declared here, so a reader can rely on a name, and that no reader needs a fallback chain
between two names for one quantity: a point kind names the metric of its achieved rate
(``Point.RATE_METRIC``).

"Not measured" is a missing (null) metric with a reason beside it, never 0.
This module imports nothing of accel-kit: any layer may read it.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    """One metric of a record: its name (with unit), its unit, what it is."""

    name: str
    unit: str
    doc: str


_DECLARED = [
    # --- the model and the work (known before the run)
    Metric("family", "text", "the model family that ran (gpt2, llama, moe, hf)"),
    Metric("n_layers", "1", "transformer blocks of the model that ran"),
    Metric("n_heads", "1", "attention (query) heads per block"),
    Metric("n_kv_heads", "1", "key/value heads per block (fewer than n_heads: grouped-query attention)"),
    Metric("head_dim", "1", "width of one attention head"),
    Metric("hidden_size", "1", "model width"),
    Metric("ffn_hidden_size", "1", "the MLP's inner width"),
    Metric("vocab_size_model", "1", "the embedding's rows, padded"),
    Metric("tokenizer", "text", "the tokenizer of the point's prepared data (null: synthetic tokens)"),
    Metric("n_params", "1", "trainable parameters (a tied embedding once; every expert of a MoE model)"),
    Metric("n_params_active", "1", "parameters a token multiplies: n_params less the routed experts beyond "
                                   "its top-k (n_params for a dense model); FLOPs and MFU count these"),
    Metric("n_experts", "1", "routed experts per MoE layer (MoE models only)"),
    Metric("experts_per_token", "1", "routed experts each token is sent to (top-k; MoE models only)"),
    Metric("expert_ffn_hidden_size", "1", "one expert's inner width (MoE models only)"),
    Metric("n_shared_experts", "1", "experts every token passes through besides its routed ones (MoE models only)"),
    Metric("n_moe_layers", "1", "layers with a MoE MLP; the others keep a dense MLP (MoE models only)"),
    Metric("expert_kernel", "text", "how the routed experts' products ran: grouped_mm (torch._grouped_mm, one call "
                                    "for every expert) or loop (one product per expert; MoE models only)"),
    Metric("flops", "FLOP", "one timed call's FLOPs per device (training: PaLM convention; block: one iteration)"),
    Metric("flops_per_token", "FLOP", "training FLOPs per token (forward and backward, full attention counted)"),
    Metric("global_batch_size", "samples", "samples per optimizer step over all replicas"),
    Metric("dp", "1", "data-parallel degree: model replicas, devices / (tp x pp x cp), named as tp and pp are"),
    Metric("mesh", "text", "the device mesh, outermost first: pp x dp x cp x tp, with the expert-parallel ranks "
                           "carved out of dp after it, dp 4 (ep 2) (accel_kit.engine.layout)"),
    Metric("tokens_per_step", "tokens", "tokens per optimizer step over all replicas"),
    Metric("flops_source", "text", "where the FLOPs come from: analytic (our family's formulas) or counted "
                                   "(torch's FLOP counter on fake tensors, the hf family)"),
    Metric("architecture", "text", "transformers' model class that ran (the hf family)"),
    Metric("mem_estimate_gib", "GiB", "the fit check's estimate of one device's memory"),
    # --- timing (accel_kit.timing.Timing.summary)
    Metric("time_median_s", "s", "median of the timed calls"),
    Metric("time_mean_s", "s", "mean of the timed calls"),
    Metric("time_min_s", "s", "fastest timed call"),
    Metric("time_iqr_s", "s", "interquartile range of the timed calls"),
    Metric("time_cv", "1", "coefficient of variation of the timed calls"),
    Metric("noisy", "bool", "time_cv above the point's noise threshold"),
    Metric("trials", "1", "timed calls"),
    Metric("warmup_total_s", "s", "warm-up calls' time (compilation included), kept apart"),
    Metric("time_estimate_s", "s", "a point skipped for its time budget: the estimate that exceeded it"),
    # --- throughput
    Metric("step_time_s", "s", "one optimizer step (median)"),
    Metric("grad_sync_s", "s", "per optimizer step (median of the timed steps), the gradient reductions the engine "
           "issues itself after the backward, outside it: the dp all-reduce under ddp with tp, pp or cp, and a "
           "pipeline's tied-weight sum (exposed communication; DDP's and FSDP's own overlap the backward and are "
           "not separable)"),
    Metric("grad_sync_pct", "%", "grad_sync_s as a share of step_time_s"),
    Metric("a2a_time_s", "s", "per optimizer step (median of the timed steps), expert parallelism's exchanges: the "
           "per-expert counts' all-gather and the dispatch and combine all-to-alls, forward and backward, over every "
           "MoE layer and micro-batch (wall time, device synchronised around each, waiting for the group's slowest "
           "rank included; accel_kit.models.moe.parallel)"),
    Metric("a2a_pct", "%", "a2a_time_s as a share of step_time_s"),
    Metric("expert_load_imbalance", "1", "per step, each MoE layer's busiest expert's token copies over the mean "
           "expert's, over the ep group's tokens, averaged over the layers (median of the timed steps; 1: balanced)"),
    Metric("tokens_per_s", "tokens/s", "tokens per second over all devices (block: of one block)"),
    Metric("tokens_per_s_per_device", "tokens/s", "tokens per second per device"),
    Metric("samples_per_s", "samples/s", "samples per second over the median step"),
    Metric("samples_per_s_mean", "samples/s", "samples per second over the mean step (GenSLM's measure)"),
    Metric("tflops_per_device", "TFLOP/s", "achieved model TFLOP/s per device (the MFU numerator)"),
    Metric("tflops", "TFLOP/s", "achieved TFLOP/s of one block on one device (the MFU numerator)"),
    # --- MFU (accel_kit.peaks)
    Metric("peak_tflops_datasheet", "TFLOP/s", "the device's dense datasheet peak for the precision"),
    Metric("datasheet_source", "text", "where the datasheet peak comes from"),
    Metric("mfu_pct", "%", "achieved over the datasheet peak"),
    Metric("mfu_reason", "text", "why there is no datasheet MFU"),
    Metric("peak_tflops_measured", "TFLOP/s", "the run's measured matmul peak for the precision"),
    Metric("mfu_measured_pct", "%", "achieved over the measured peak"),
    Metric("peak_measured_shape", "text", "the product that gave the measured peak"),
    Metric("mfu_measured_reason", "text", "why there is no measured MFU"),
    Metric("mfu_measured_unreliable", "bool", "above 100 % of the measured peak: the peak was unlucky"),
    Metric("peak_remeasured", "bool", "the measured MFU is against a peak re-measured after this point"),
    # --- MBU (accel_kit.peaks): a decode step's bytes read per second against the memory bandwidth
    Metric("bandwidth_gbps_datasheet", "GB/s", "the device's datasheet memory bandwidth"),
    Metric("bandwidth_source", "text", "where the datasheet bandwidth comes from"),
    Metric("mbu_pct", "%", "achieved bytes per second over the datasheet bandwidth"),
    Metric("mbu_reason", "text", "why there is no datasheet MBU"),
    Metric("bandwidth_gbps_measured", "GB/s", "the run's measured memory bandwidth (copy or triad)"),
    Metric("mbu_measured_pct", "%", "achieved bytes per second over the measured bandwidth"),
    Metric("mbu_measured_reason", "text", "why there is no measured MBU"),
    Metric("mbu_measured_unreliable", "bool", "above 100 % of the measured bandwidth: the measurement was unlucky"),
    Metric("mem_peak_gib", "GiB", "peak device memory of the timed window (a CPU: the process's peak RSS)"),
    # --- the input pipeline (accel_kit.engine.train_measure)
    Metric("loader_tokens_per_s", "tokens/s", "one process's data loader alone, on the same data, no step between "
                                              "batches (null: too fast to time)"),
    Metric("step_input_tokens_per_s", "tokens/s", "tokens per second one process's step consumed"),
    Metric("input_wait_pct", "%", "step_input_tokens_per_s over loader_tokens_per_s: the share of the step the "
                                  "loader alone takes"),
    Metric("input_bound", "bool", "input_wait_pct at or above 10 %: the step waited on its input"),
    # --- training outcome
    Metric("loss_first", "nats", "loss of the first step (warm-up included)"),
    Metric("loss_last", "nats", "loss of the last timed step"),
    Metric("losses", "nats", "every step's loss, warm-up first"),
    Metric("nonfinite_step", "1", "the step whose loss was NaN or infinite"),
    # --- attention kernel (accel_kit.engine.attention)
    Metric("attention_kernel_ran", "text", "the SDPA kernel that ran (flash, efficient, cudnn, math)"),
    Metric("attention_op", "text", "its aten op"),
    Metric("attention_kernel_reason", "text", "why no kernel is named"),
    # --- energy (accel_kit.energy)
    Metric("energy_j", "J", "every device's energy over the timed window"),
    Metric("power_avg_w", "W", "energy over the window's length"),
    Metric("tokens_per_j", "tokens/J", "tokens trained per joule"),
    Metric("flops_per_j", "FLOP/J", "FLOPs computed per joule"),
    Metric("energy_window_s", "s", "the metered window's length"),
    Metric("energy_source", "text", "the counter read"),
    Metric("energy_method", "text", "counter or sampled power"),
    Metric("energy_sampling_period_s", "s", "a sampled meter's period"),
    Metric("energy_rated_power_w", "W", "the devices' rated power (plausibility bound)"),
    Metric("energy_reason", "text", "why no energy was measured"),
    # --- the machine's load over the timed window (accel_kit.machine_load)
    Metric("load_others_cpu_pct", "%", "CPU time other processes took over the timed window, as a share of every "
           "logical CPU's time over it (the point's own ranks and their children not counted)"),
    Metric("load_steal_pct", "%", "steal time over the window (the hypervisor ran other guests on these CPUs), "
           "as a share of every logical CPU's time (null: the kernel reports no steal)"),
    Metric("machine_busy", "bool", "others' CPU time and steal took more than a quarter of one logical CPU or a "
           "tenth of them all, whichever is more, over the window: the point was measured on a busy machine"),
    Metric("load_avg_1m_before", "1", "the 1-minute load average (runnable tasks) as the window opened"),
    Metric("load_avg_1m_after", "1", "the 1-minute load average as the window closed"),
    Metric("load_cpu_count", "1", "logical CPUs of the machine (the base of the load shares)"),
    Metric("load_window_s", "s", "the span the load figures cover: the timed trials (the energy meter's window)"),
    Metric("load_reason", "text", "why a load figure is null (e.g. a window too short for the kernel's "
                                  "10 ms CPU-time ticks)"),
    # --- weight sparsity (accel_kit.sparsity)
    Metric("sparsity_measured", "1", "fraction of the block linears' weights that are zero"),
    Metric("sparsity_layer_min", "1", "least sparse pruned layer"),
    Metric("sparsity_layer_max", "1", "most sparse pruned layer"),
    Metric("pruned_layers", "1", "linears pruned"),
    Metric("nonzero_block_weights", "1", "non-zero weights left in the block linears"),
    Metric("sparse_execution", "text", "how the pruned layers ran, and why"),
    Metric("sparse_execution_kind", "text", "dense-model, dense-zeros or a sparse kernel kind"),
    Metric("sparse_kernel", "text", "the sparse kernel used, if any"),
    Metric("sparse_kernel_layers", "1", "layers that ran the sparse kernel"),
    Metric("sparse_kernel_timing", "text", "the kernel selection's timings against dense"),
    Metric("flops_dense_equivalent", "FLOP", "the step's FLOPs as if dense (the MFU basis)"),
    Metric("flops_effective", "FLOP", "the step's FLOPs with the pruned weights' products left out"),
    Metric("flops_per_token_effective", "FLOP", "flops_effective per token"),
    Metric("tflops_effective_per_device", "TFLOP/s", "effective FLOPs per second per device"),
    Metric("mfu_basis", "text", "which FLOPs the MFU counts"),
    Metric("finetune_losses", "nats", "losses of the dense fine-tuning steps"),
    Metric("finetune_loss_last", "nats", "last dense fine-tuning loss"),
    # --- a tune run's summary record (accel_kit.tune.summary), beside the configurations it measured
    Metric("tune_tau", "1", "Kendall's tau-b between tune's predicted ranking and the measured tokens/s of the "
                            "configurations it measured (1: the same order)"),
    Metric("tune_compared", "1", "configurations measured ok, that tune_tau is over"),
    Metric("tune_predicted", "1", "configurations predicted to fit (ranked)"),
    Metric("tune_pruned", "text", "configurations and meshes removed before measuring, by reason"),
    Metric("tune_chosen", "text", "the layout tune chose: the fastest measured"),
    Metric("tune_chosen_tokens_per_s", "tokens/s", "the chosen layout's measured tokens/s"),
    Metric("tune_default_tokens_per_s", "tokens/s", "the system's default layout's measured tokens/s"),
    Metric("tune_chosen_vs_default", "ratio", "the chosen layout's measured tokens/s over the default's"),
    Metric("tune_memory_margin_pct", "%", "how much more memory than predicted a configuration was allowed"),
    Metric("tune_rows", "json", "one object per configuration tune selected: its predicted and measured rank and "
                                "tokens/s, error, status and record id (accel_kit.tune.summary.COLUMNS)"),
]

METRICS: dict[str, Metric] = {m.name: m for m in _DECLARED}


def declare(*new: Metric) -> None:
    """Add a device runtime's own figures to the schema (a vendor trainer's ``extra_metrics``, declared by
    its adapter's package, so that this module names no device); a name declared twice must agree."""
    for m in new:
        if METRICS.get(m.name, m) != m:
            raise ValueError(f"metric {m.name!r} declared twice, differently: {METRICS[m.name]} and {m}")
        METRICS[m.name] = m


def undeclared(names) -> list[str]:
    """The names in ``names`` that this schema does not declare (sorted)."""
    return sorted(set(names) - set(METRICS))


def unit(name: str) -> str:
    """The unit of metric ``name`` (a KeyError for one not declared)."""
    return METRICS[name].unit
