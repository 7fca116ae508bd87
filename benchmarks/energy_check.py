"""Print the energy of the microbenchmark and training records under a results root: joules per token.

    python benchmarks/energy_check.py OUTPUT_DIR

Run by the ``energy`` section of ``benchmarks/gpu_check.sh`` after it has recorded one
microbenchmark point and one training point there. For each record: the energy over the timed
window, the average power, FLOPs (or tokens) per joule, joules per token and the source; or,
where the device gave no figure, the recorded reason (on a CPU without RAPL, that is what it prints).
"""
from __future__ import annotations

import sys
from pathlib import Path

from accel_kit import results
from accel_kit.cli import script_main


def num(value, spec: str = ".3g") -> str:
    """A metric not measured is None or NaN: printed as such."""
    return "n/a" if value is None or value != value else format(value, spec)


def lines(root: str | Path) -> list[str]:
    out = []
    for study, work in (("microbenchmark", "flops"), ("scaling", "tokens")):
        folder = Path(root) / study
        if not folder.exists():
            out.append(f"{study}: no records under {folder}")
            continue
        for r in results.load(folder).to_dict("records"):
            what = (f"{study} {r.get('impl')} {r.get('precision')} b={r.get('batch_size')} {r.get('direction')}"
                    if work == "flops" else f"{study} {r.get('preset')} {r.get('precision')} n={r.get('devices')} "
                                            f"mb={r.get('micro_batch_size')}")
            if r["status"] != "ok":
                out.append(f"{what}: {r['status']}: {r.get('reason')}")
                continue
            energy = r.get("energy_j")
            if energy is None or energy != energy:
                out.append(f"{what}: {num(r.get('tokens_per_s'), '.0f')} tokens/s; energy not recorded: "
                           f"{r.get('energy_reason')}")
                continue
            # the tokens of the timed window: every timed iteration (or optimizer step) of every device
            tokens = r["batch_size"] * r["seq_len"] * r["trials"] if work == "flops" else r["tokens_per_step"] * r["trials"]
            per_j = (f"{num(r['flops_per_j'] / 1e9)} GFLOP/J" if work == "flops"
                     else f"{num(r['tokens_per_j'])} tokens/J")
            out.append(f"{what}: {num(r.get('tokens_per_s'), '.0f')} tokens/s, {num(energy, '.1f')} J over "
                       f"{num(r.get('energy_window_s'), '.2f')} s, {num(r.get('power_avg_w'), '.0f')} W average, "
                       f"{per_j}, {num(energy / tokens)} J/token ({r.get('energy_source')})")
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    if not Path(args[0]).is_dir():
        print(f"{Path(__file__).name}: error: {args[0]!r} is not a folder (a results root: OUTPUT_DIR)",
              file=sys.stderr)
        return 2
    print("\n".join(lines(args[0])))
    return 0


if __name__ == "__main__":
    script_main(main, Path(__file__).name)
