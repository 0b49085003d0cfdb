"""What `tune evaluate` runs: its options as one record, checked, loaded and scored into a table.

posfair's scoring (`tuner.report.tables`) reads any positional benchmark; PosIR's (`tuner.report.posir`)
reads PosIR's own folders. Cheap checks come first (the model's name and consent, the benchmarks' files), the
model loads last.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console

from tuner.common.options import EvaluateRequest
from tuner.data import load_benchmark, require_position_groups
from tuner.data.registry import read_posir_domains
from tuner.engine.exported import check_model_files, load_exported
from tuner.engine.models import load_model
from tuner.engine.specs import resolve_spec
from tuner.evaluation.visible import within_reach
from tuner.report import posir, tables
from tuner.report.posir import PosIRTable
from tuner.report.tables import EvaluationTable, ScoringOptions

PAPER_DEFAULT = "Paper default (CLS-Soft, λ 0.5, 50% layers, B 128)"


Table = EvaluationTable | PosIRTable


def evaluate(request: EvaluateRequest) -> Table:
    """Load what `request` names and score it: posfair's tables, or PosIR's figures over its domain folders."""
    request.check()
    # a name it does not know fails before any data loads
    resolve_spec(request.model, request.pooling, request.padding_side)
    exports = [(path, load_exported(path)) for path in request.configs]
    for path, exported in exports:  # a config that does not fit its model fails before any data or model loads
        check_model_files(exported, path, allow_mismatch=request.allow_model_mismatch)
    folders = read_posir_domains(request.dataset) if request.scoring == "posir" else []
    scored = None if folders else load_benchmark(request.dataset)
    if scored is not None:
        require_position_groups(scored, "--dataset")
    general = load_benchmark(request.general) if request.general else None
    loaded = load_model(
        request.model,
        trust_remote_code=request.trust_remote_code,
        pooling=request.pooling,
        padding_side=request.padding_side,
    )
    configs = [(PAPER_DEFAULT, loaded.default_config())] if request.paper_default else []
    configs += [(text, loaded.default_config(**values)) for text, values in request.inline]
    for path, exported in exports:
        exported.check_model(loaded)
        configs.append((f"{path.name} (trial {exported.provenance.trial})", exported.calibration))
    options = ScoringOptions(
        sea=request.sea,
        general=general,
        shuffled=request.shuffled,
        n_resamples=request.bootstrap,
        seed=request.seed,
        batch_size=request.batch_size,
    )
    if scored is not None:
        return tables.run_evaluation(loaded, within_reach(scored, loaded), configs, options)
    name = folders[0].dataset.name if len(folders) == 1 else folders[0].dataset.name.rpartition("/")[0]
    return posir.run_posir_evaluation(loaded, folders, configs, options, name=name, instruction=request.instruction)


def render(table: Table, console: Console) -> None:
    """Print the tables to a terminal."""
    if isinstance(table, PosIRTable):
        posir.render(table, console)
    else:
        tables.render(table, console)


def to_markdown(table: Table) -> str:
    """The tables as GitHub markdown."""
    return posir.to_markdown(table) if isinstance(table, PosIRTable) else tables.to_markdown(table)


def to_dict(table: Table) -> dict[str, Any]:
    """Every figure as a JSON-ready dict."""
    return posir.to_dict(table) if isinstance(table, PosIRTable) else tables.to_dict(table)
