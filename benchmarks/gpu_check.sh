#!/usr/bin/env bash
# One short device check (at most 8 minutes) for a lent NVIDIA GPU, e.g. an H200:
# installs accel-kit into the machine's torch environment, runs the microbenchmark's full
# profile on system $SYSTEM and prints the MFU table. Run from the repository root:
#   SYSTEM=h200 bash benchmarks/gpu_check.sh
# Missing Python packages can travel as wheels in .whl/ (installed with --no-index).
set -euo pipefail
SYSTEM=${SYSTEM:-h200}
OUT=${OUT:-$(mktemp -d)}
export PYTHONUNBUFFERED=1

if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-}
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))"

# Study 1 at the paper's sizes (batch 8-64, seq 1024, fp32/fp16/bf16, ours and HF's block).
timeout 420 python3 -m accel_kit.cli run microbenchmark --system "$SYSTEM" --profile full --output-dir "$OUT" \
  --no-figures -p trials 5 | tee "$OUT/microbenchmark.txt"

python3 - "$OUT" <<'PY'
import sys
from accel_kit import results
df = results.load(sys.argv[1] + "/microbenchmark")
df = df[df.status == "ok"]
cols = ["impl", "precision", "batch_size", "direction", "tflops", "mfu_pct", "mfu_measured_pct"]
print(df[cols].sort_values(cols[:4]).to_string(index=False, float_format=lambda v: f"{v:.1f}"))
bf = df[(df.impl == "native") & (df.precision == "bf16") & (df.direction == "forward_backward") & (df.batch_size >= 16)]
print(f"target: native bf16 fwd+bwd, batch >= 16: min MFU {bf.mfu_pct.min():.1f} % (target >= 65 %)")
PY

# Study 2: GPT-2 XL pre-training on one device, bf16, micro-batch 16, seq 1024 (target: MFU >= 50 %
# against the 989 TFLOPS datasheet peak; llm.c reaches about 49 % on H100).
timeout 300 python3 -m accel_kit.cli run scaling --system "$SYSTEM" --profile full --output-dir "$OUT" --no-figures -q \
  -p device_counts '[1]' -p precision bf16 -p micro_batch_size 16 -p steps 10 -p warmup_steps 3 -p torch_compile true \
  | tee "$OUT/train.txt"
python3 - "$OUT" <<'PY'
import sys
from accel_kit import results
df = results.load(sys.argv[1] + "/scaling")
for r in df.itertuples():
    if r.status == "ok":
        print(f"GPT-2 XL bf16 mb16: {r.tokens_per_s:.0f} tokens/s, {r.tflops_per_device:.1f} TFLOP/s, "
              f"MFU {r.mfu_pct:.1f} % (target >= 50 %), measured-peak MFU {r.mfu_measured_pct:.1f} %, "
              f"{r.mem_peak_gib:.1f} GiB")
    else:
        print(f"GPT-2 XL: {r.status}: {r.reason}")
PY
