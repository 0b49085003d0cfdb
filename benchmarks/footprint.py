"""What holding cached items in RAM buys a first run: plain `tune` in a fresh folder, side by side with the layer
inputs and the shared first-layer sums in RAM, the sums alone, and neither (the default).

Run from the repository root, on idle cores:

    .venv/bin/python -m benchmarks.footprint                      # → docs/results/footprint.json

Each variant is `tune` with its defaults (MiniLM on the embedded benchmark, its held-out sets) in a folder of its
own, so each encodes its baselines and writes its cache from nothing, as a new user's first run does; only
`RAM_FRACTION` and `LAYER_INPUTS_IN_RAM` (`tuner.evaluation.layer_inputs`) differ. Measured per variant: wall
seconds, the peak resident memory of the process tree (sampled every half second; memory-mapped pages count while
they are resident), the bytes left in `mlruns/`, and the exported config, which must be the same (reading the inputs
from RAM or from a mapped file changes no number).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from benchmarks import record
from benchmarks.first_tune import disk_bytes, timed

VARIANTS = {"both": (0.5, True), "sums": (0.5, False), "neither": (0.0, False)}
"""`RAM_FRACTION` and `LAYER_INPUTS_IN_RAM` per variant: the layer inputs and the shared first-layer sums in RAM
(within half the available memory: the default until this was measured), the sums alone, neither."""


def run_variant(fraction: float, inputs_in_ram: bool, folder: Path) -> dict[str, Any]:
    code = (
        f"import tuner.evaluation.layer_inputs as store; store.RAM_FRACTION = {fraction!r}; "
        f"store.LAYER_INPUTS_IN_RAM = {inputs_in_ram!r}; from tuner.cli.app import app; app(['run'])"
    )
    done = timed([sys.executable, "-c", code], folder)
    if done["returncode"] != 0:
        raise RuntimeError(f"tune failed:\n{done['stderr'][-3000:]}")
    (export,) = (folder / "mlruns" / "exports").glob("*.yaml")
    config = yaml.safe_load(export.read_text(encoding="utf-8"))
    return {
        "ram_fraction": fraction,
        "layer_inputs_in_ram": inputs_in_ram,
        "seconds": done["seconds"],
        "peak_rss_bytes": done["peak_rss_bytes"],
        "mlruns_bytes": disk_bytes(folder / "mlruns"),
        "config": {k: config["calibration"][k] for k in ("variant", "strength", "layers", "basket_size")},
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, default=record.RESULTS / "footprint.json", help="where the record goes")
    args = parser.parse_args(argv)
    results: dict[str, Any] = {"variants": {}}
    for name, (fraction, inputs_in_ram) in VARIANTS.items():
        with tempfile.TemporaryDirectory(prefix=f"posfair-footprint-{name}-") as folder:
            results["variants"][name] = run_variant(fraction, inputs_in_ram, Path(folder))
        print(name, results["variants"][name], flush=True)
    command = "python -m benchmarks.footprint " + " ".join(sys.argv[1:] if argv is None else argv)
    record.write(args.json, "footprint", command.strip(), results)


if __name__ == "__main__":
    main()
