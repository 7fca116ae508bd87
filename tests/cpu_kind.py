"""Which instruction sets this process's CPU kernels use: torch's own (ATen), numpy's OpenBLAS, and what oneDNN
and MKL were told. ``make test-avx2`` runs it with ``avx2`` first and stops where a setting did not take effect,
so that the suite it then runs is the suite an AVX2-only CPU runs.

    python tests/cpu_kind.py [avx2]
"""
from __future__ import annotations

import os
import sys

import numpy  # noqa: F401  (loads numpy's OpenBLAS, which threadpoolctl then reads)
import threadpoolctl
import torch

# OpenBLAS's names for the AVX2-only kernels: a lowered coretype must be one of these
AVX2_CORETYPES = {"haswell", "zen"}


def main(argv: list[str]) -> int:
    want = argv[0].lower() if argv else None
    capability = torch.backends.cpu.get_cpu_capability()
    blas = [(i["internal_api"], i.get("architecture")) for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"]
    print(f"torch kernels: {capability}; numpy's BLAS: {', '.join(f'{a} {b}' for a, b in blas) or 'none found'}; "
          f"oneDNN told ONEDNN_MAX_CPU_ISA={os.environ.get('ONEDNN_MAX_CPU_ISA', '(unset)')}, MKL told "
          f"MKL_ENABLE_INSTRUCTIONS={os.environ.get('MKL_ENABLE_INSTRUCTIONS', '(unset)')} (neither reports back to "
          "torch: these are the settings, not a reading)")
    if want != "avx2":
        return 0
    wrong = []
    if capability != "AVX2":
        wrong.append(f"torch's kernels are {capability}, not AVX2 (ATEN_CPU_CAPABILITY=avx2 lowers them)")
    for api, arch in blas:
        if api == "openblas" and (arch or "").lower() not in AVX2_CORETYPES:
            wrong.append(f"numpy's OpenBLAS runs {arch} kernels (OPENBLAS_CORETYPE=Haswell lowers them)")
    for var, value in (("ONEDNN_MAX_CPU_ISA", "AVX2"), ("MKL_ENABLE_INSTRUCTIONS", "AVX2")):
        if os.environ.get(var, "").upper() != value:
            wrong.append(f"{var} is not {value}")
    for line in wrong:
        print(f"cpu_kind.py: {line}", file=sys.stderr)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
