#!/usr/bin/env bash
# The one prepared check for a lent NVIDIA GPU (written for an H200): at most 9 minutes of commands, sections
# ordered by what they tell us, each time-boxed by `timeout` with every point's own timeout below its section's,
# and every log and record written under $OUT as it comes (a killed section leaves what it measured).
#
#   generate  270 s  Llama 3.1 8B greedy decode, bf16, input 512, output 128, batch 1 then 32: ours eager and
#                    compiled (one captured CUDA graph per step) against transformers' generate (static cache),
#                    the model's build time and the token check (benchmarks/decode_vs_hf.py). Targets: batch 1
#                    MBU >= 60 % of the measured bandwidth and >= 1.5x transformers'; batch 32 >= 1.0x; build < 30 s.
#   moe        60 s  The Qwen3-30B-A3B MoE layer at 4 x 4096 = 16,384 tokens, bf16, forward+backward, ours against
#                    transformers' layer and the measured matmul peak. Targets: >= 35 % of the peak, >= 1.2x.
#   train     105 s  GPT-2 XL training, one device, bf16, micro-batch 16, torch.compile. Target: MFU >= 50 % of
#                    the datasheet (met before: kept).
#   llama3b    40 s  Llama 3.2 3B training at sequence 4096, bf16, one device: tokens/s, MFU, memory.
#   block      65 s  The GPT-2 XL layer, bf16, batch 16 and 64, fwd+bwd: native, compiled, transformers'.
#
# Run from the repository root (the device tool runs it so):  SYSTEM=h200 OUT=/some/dir bash benchmarks/gpu_check.sh
# SECTIONS picks some (default: all, in the order above). TINY=1 runs every section on debug presets in fp32 (on
# SYSTEM=cpu, in a minute or two): the script's own check before a lease is spent on it. What the machine's Python lacks travels as wheels in
# .whl/ (docs/running.md: on an H200's stock PyTorch image, pydantic 2 with pydantic-core, annotated-types,
# typing-inspection and typing-extensions >= 4.16).
set -uo pipefail  # not -e: a failed section is reported and the next one runs
SYSTEM=${SYSTEM:-h200}
PY=${PY:-python3}  # the Python with torch (the machine's; TINY=1 here: PY=.venv/bin/python)
OUT=${OUT:-$(mktemp -d)}
SECTIONS=${SECTIONS:-generate moe train llama3b block}
export PYTHONUNBUFFERED=1
want() { [[ " $SECTIONS " == *" $1 "* ]]; }
section() { echo; echo "== $1 ($(date +%T))"; }
mkdir -p "$OUT"

# Each section's arguments at the sizes above, or tiny ones (TINY=1)
GEN=(--preset llama3.1-8b --layers 0 --batch 1 32 --input 512 --output 128 --repeats 3 --precision bf16)
MOE=(--preset qwen3-30b-a3b --seq-len 4096 --batch 4 --precisions bf16)
TRAIN=(-p precision bf16 -p micro_batch_size 16 -p torch_compile true)
L3B=(-p preset llama3.2-3b -p seq_lens '[4096]' -p precision bf16)
BLOCK=(-p precisions '[bf16]' -p batch_sizes '[16, 64]')
if [ "${TINY:-0}" = 1 ]; then
  GEN=(--preset llama3-debug --layers 0 --batch 1 2 --input 16 --output 8 --repeats 2 --precision fp32)
  MOE=(--preset moe-debug --seq-len 64 --batch 2 --precisions fp32)
  TRAIN=(-p preset gpt2-debug -p precision fp32 -p micro_batch_size 2 -p seq_len 64)
  L3B=(-p preset llama3-debug -p seq_lens '[64]' -p precision fp32)
  BLOCK=(-p preset gpt2-debug -p precisions '[fp32]' -p batch_sizes '[2]' -p seq_len 64)
fi

if [ -d .whl ] && [ "${TINY:-0}" != 1 ]; then  # wheels for the GPU machine's Python, not this one
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-}
"$PY" -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'transformers', transformers.__version__, torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU')"

if want generate; then
  section "generate: Llama 3.1 8B decode, ours eager and compiled against transformers' generate"
  timeout 270 "$PY" benchmarks/decode_vs_hf.py --system "$SYSTEM" "${GEN[@]}" 2>&1 | grep -v "^\[transformers\]" | tee "$OUT/generate.txt"
fi

if want moe; then
  section "moe: the Qwen3-30B-A3B layer at 16,384 tokens"
  timeout 60 "$PY" benchmarks/microbenchmark_vs_hf.py --system "$SYSTEM" "${MOE[@]}" --impls native,hf --trials 5 \
    --warmup 2 2>&1 | tee "$OUT/moe.txt"
fi

if want train; then
  section "train: GPT-2 XL, one device, bf16, micro-batch 16, compiled"
  timeout 105 "$PY" -m accel_kit.cli run scaling --system "$SYSTEM" --profile full --output-dir "$OUT/records" \
    --no-figures -q -p device_counts '[1]' -p also '[]' "${TRAIN[@]}" -p steps 10 -p warmup_steps 3 \
    -p measure_peak false -p timeout_s 95 2>&1 | tee "$OUT/train.txt"
fi

if want llama3b; then
  section "llama3b: Llama 3.2 3B training at sequence 4096, one device, bf16"
  timeout 40 "$PY" -m accel_kit.cli run seq_length --system "$SYSTEM" --profile full --output-dir "$OUT/records" \
    --no-figures -q -p also '[]' "${L3B[@]}" -p micro_batch_size 1 -p steps 5 -p warmup_steps 2 -p measure_peak false \
    -p timeout_s 35 2>&1 | tee "$OUT/llama3b.txt"
fi

if want block; then
  section "block: the GPT-2 XL layer, bf16, batch 16 and 64"
  timeout 65 "$PY" -m accel_kit.cli run microbenchmark --system "$SYSTEM" --profile full --output-dir "$OUT/records" \
    --no-figures -q "${BLOCK[@]}" -p directions '[forward_backward]' -p impls '[native, compiled, hf]' \
    -p measure_peak false -p trials 10 -p timeout_s 30 2>&1 | tee "$OUT/block.txt"
fi

section "records against their targets"
"$PY" - "$OUT/records" <<'PY'
import sys
from pathlib import Path

from accel_kit import results

def num(value, spec=".1f"):  # a metric not measured is None / NaN
    return "n/a" if value is None or value != value else format(value, spec)

root = Path(sys.argv[1])
for study in ("scaling", "seq_length", "microbenchmark"):
    if not (root / study).exists():
        print(f"{study}: no records")
        continue
    for r in results.load(root / study).itertuples():
        if r.status != "ok":
            print(f"{study} {r.preset}: {r.status}: {r.reason}")
        elif study == "microbenchmark":
            print(f"block {r.impl} bf16 batch {r.batch_size}: {num(r.tflops)} TFLOP/s, MFU {num(r.mfu_pct)} %")
        else:
            target = " (target >= 50 %)" if r.preset == "gpt2-xl" else ""
            print(f"{study} {r.preset} seq {r.seq_len} mb {r.micro_batch_size}: {num(r.tokens_per_s, '.0f')} tokens/s, "
                  f"{num(r.tflops_per_device)} TFLOP/s, MFU {num(r.mfu_pct)} %{target}, {num(r.mem_peak_gib)} GiB")
PY
