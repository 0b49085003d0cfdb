"""The exported config: a versioned YAML schema that encoders load, written atomically.

Its provenance says where the config came from: the study and trial, the MLflow run and registry
version, the objective and floor, held-out sets with their intervals, library versions and git commit.

Loading uses `tuner.common.safe_yaml` (a `!!python/...` tag is refused, never executed; duplicate keys and alias
bombs too) and validates every field. A config that does not fit its model is refused before the model loads
(`check_model_files`: pooling and padding against the registry or the model's own sentence-transformers files; the
model's pipeline (prompts, modules, Dense weights), weights and tokenizer against what was recorded at export; the
model section's own fields against their digest) and after (`ExportedConfig.check_model`: source, depth).
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import logging
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Final, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tuner import __version__
from tuner.calibration import CalibrationConfig, ConfigError
from tuner.calibration.config import PaddingSide, Pooling
from tuner.common.files import EXPORT_SCHEMA, EXPORTED_CONFIG, write_atomically
from tuner.common.messages import shown
from tuner.common.safe_yaml import YamlError, load_file
from tuner.engine.models import LoadedModel, hub_revision
from tuner.engine.pipeline import ModuleKind, Pipeline
from tuner.engine.specs import (
    ModelSpec,
    fingerprint_changes,
    is_hub_snapshot,
    locate,
    model_files,
    own_pipeline,
    own_settings,
    resolve_spec,
    tokenizer_fingerprint,
    weights_fingerprint,
)

log = logging.getLogger(__name__)

SCHEMA: Final = EXPORT_SCHEMA
SCHEMA_VERSION: Final = 1
OVERRIDE = "--allow-model-mismatch (allow_model_mismatch=True)"


class ExportError(ValueError):
    """An exported config cannot be read, is invalid, or does not fit the model; the message says why."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModuleRecord(_Strict):
    """One module of the model's sentence-transformers pipeline, as modules.json lists it."""

    type: ModuleKind
    path: str
    mode: Pooling | None = Field(None, description="a Pooling module's mode")
    in_features: int | None = None
    out_features: int | None = None
    bias: bool | None = None
    activation: str | None = Field(None, description="a Dense module's activation: a torch.nn module's dotted name")
    weights: dict[str, str] | None = Field(None, description="a Dense module's weight file → sha256")


class PipelineRecord(_Strict):
    """The model's own sentence-transformers pipeline (`tuner.engine.pipeline`): what every encoder applies."""

    query_prompt: str = Field(description="put before every query")
    document_prompt: str = Field(description="put before every document")
    lower_case: bool = Field(False, description="the input is lower-cased (sentence_bert_config.json's do_lower_case)")
    modules: list[ModuleRecord] = Field(
        default_factory=list, description="modules.json's modules in order; none for a plain transformers folder"
    )

    @classmethod
    def of(cls, pipeline: Pipeline) -> PipelineRecord:
        return cls.model_validate(pipeline.record())


class ModelSection(_Strict):
    name: str = Field(description="registry alias or folder the model loads from")
    source: str
    revision: str
    pooling: Pooling
    padding_side: PaddingSide
    num_layers: int = Field(ge=1)
    max_length: int = Field(ge=1)
    weights: dict[str, str] | None = Field(
        None,
        description="file → sha256 of the model's config.json and weight files, for a model loaded from a local folder "
        "(a hub snapshot is pinned by its revision); checked when the config is loaded",
    )
    tokenizer: dict[str, str] | None = Field(
        None,
        description="file → sha256 of the tokenizer's files, for a model from a local folder; checked when loaded",
    )
    pipeline: PipelineRecord | None = Field(None, description="the model's prompts and modules; checked when loaded")
    digest: str | None = Field(
        None,
        description="sha256 of this section's other fields (but name and source) and the calibration's pooling and "
        "padding_side, as exported: an edit of them is refused when the config is loaded",
    )

    def load_revision(self) -> str | None:
        """The revision to ask the hub for (package-shipped and local models have none)."""
        return hub_revision(self.revision)

    def spec(self) -> ModelSpec:
        """The model as the config describes it (`tuner.engine.specs.resolve_spec`)."""
        return resolve_spec(self.name, self.pooling, self.padding_side)

    def files(self) -> Path:
        """Where the model's files live on this machine (`tuner.engine.specs.model_files`): never an output."""
        return model_files(self.spec())


class Provenance(_Strict):
    study: str
    trial: int
    storage: str
    dataset: str
    dataset_fingerprint: str
    seed: int
    created: str
    posfair_version: str
    selection_rule: str = Field("lowest", description="the rule that named the winner (objectives.selection)")
    selection: str = Field("", description="why this trial won, in one sentence")
    objective: str = Field("", description="what the study optimised, and subject to what")
    hm_floor: float | None = Field(None, description="the HM floor in force (0-1), resolved from hm_floor_rule")
    hm_floor_rule: str | None = Field(None, description="--hm-floor as given (significant, baseline, 0.52, -1%)")
    heldout: list[str] = Field(default_factory=list, description="held-out sets the winner was checked on")
    intervals: dict[str, dict[str, list[float]]] = Field(
        default_factory=dict,
        description="held-out set → metric → [estimate, low, high]: 95% paired-bootstrap change vs no calibration "
        "(0-1)",
    )
    structures: dict[str, dict[str, float]] = Field(
        default_factory=dict,
        description="tuning structure → the winner's psi, psi_se, hm, ndcg10_delta, drift (mean 1 - cos to the "
        "uncalibrated vectors), where positions are known its tilt, and where the uncalibrated model favours one end "
        "beyond noise the reversal (> 0: the other end now favoured): why it won (objectives.robustness)",
    )
    layer_tokens: int | None = Field(None, description="what the study's trials cost: padded tokens × layers run")
    mlflow_run_id: str | None = Field(None, description="the study's parent run in MLflow")
    tracking_uri: str | None = None
    registered_model: str | None = Field(None, description="MLflow model registry name of this config's pyfunc model")
    registered_version: int | None = None
    versions: dict[str, str] = Field(default_factory=dict, description="posfair, torch, transformers versions")
    git_commit: str | None = Field(None, description="posfair's source commit, when it runs from a git checkout")


class ExportedConfig(_Strict):
    """Everything needed to encode with the winning calibration, and the evidence it was chosen on."""

    schema_name: Literal["posfair/calibration-config"] = Field(default=SCHEMA, alias="schema")
    schema_version: Literal[1] = SCHEMA_VERSION
    model: ModelSection
    calibration: CalibrationConfig
    metrics: dict[str, dict[str, float | None]] = Field(
        description="split → metric → value: tuning and held-out figures of this config and of the baseline"
    )
    provenance: Provenance

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    def check_model(self, loaded: LoadedModel) -> None:
        """Refuse a config made for another model (other source or depth; or, where the model was loaded with
        its own pooling and padding, other ones)."""
        mismatches = [
            f"{what}: config says {want!r}, model has {got!r}"
            for what, want, got in (
                ("model.source", self.model.source, loaded.spec.source),
                ("model.num_layers", self.model.num_layers, loaded.num_layers),
                ("model.pooling", self.model.pooling, loaded.spec.pooling),
                ("model.padding_side", self.model.padding_side, loaded.spec.padding_side),
            )
            if want != got
        ]
        if mismatches:
            raise ExportError("this config was made for another model:\n  " + "\n  ".join(mismatches))


def check_model_files(exported: ExportedConfig, path: str | Path, *, allow_mismatch: bool = False) -> None:
    """Before the model loads: the config's pooling and padding are the model's own (the registry's entry, or
    what a sentence-transformers folder's files say); its pipeline, weights and tokenizer are those it was exported
    with; and its model section is as exported (`config_digest`). A difference is refused naming it, unless
    `allow_mismatch` (then warned). A config exported without a fingerprint or a pipeline loads where the model's
    vectors are what they were then, saying once that changed weights go unnoticed."""
    model = exported.model
    differences = _edited(exported)
    folder = _local_folder(model.spec(), model.load_revision())
    for field_name, own in own_settings(model.name, folder).items():
        value = getattr(model, field_name)
        if own.value != value:
            differences.append(
                f"model.{field_name}: the config says {value!r}, but {model.name} uses {own.value!r} ({own.source})"
            )
    if folder is not None:
        differences += _pipeline_differences(model, own_pipeline(model.spec(), folder), folder)
    for what, recorded, fingerprint in (
        ("weights", model.weights, weights_fingerprint),
        ("tokenizer", model.tokenizer, tokenizer_fingerprint),
    ):
        if recorded is None or folder is None:
            continue
        changes = fingerprint_changes(recorded, fingerprint(folder))
        if changes:
            differences.append(
                f"model.{what}: the {'' if what == 'weights' else 'tokenizer '}files in {folder} differ from those the "
                f"config was exported with ({'; '.join(changes)})"
            )
    if model.weights is None and folder is not None and not is_hub_snapshot(folder):
        _say_unpinned(str(path))
    if not differences:
        return
    if allow_mismatch:
        for difference in differences:
            log.warning("%s: %s; used anyway (allowed)", path, difference)
        return
    raise ExportError(
        f"{path} does not fit the model it names:\n  "
        + "\n  ".join(differences)
        + f"\nRe-export the config for this model (`tune export --study-name {exported.provenance.study}`), "
        f"or pass {OVERRIDE} to use it as it is"
    )


def config_digest(model: ModelSection, calibration: CalibrationConfig) -> str:
    """The sha256 of what says how the model makes a vector: the model section's fields but `digest` and where the
    model is (`name`, `source`: a folder moved elsewhere is checked by its fingerprints), None ones left out (a field
    added later with default None leaves older digests valid), and the calibration's pooling and padding side. A
    check against edits, not a signature."""
    fields = {
        "model": model.model_dump(mode="json", exclude={"digest", "name", "source"}, exclude_none=True),
        "calibration": {"pooling": calibration.pooling, "padding_side": calibration.padding_side},
    }
    return hashlib.sha256(json.dumps(fields, sort_keys=True, ensure_ascii=False).encode("utf-8")).hexdigest()


def _edited(exported: ExportedConfig) -> list[str]:
    """The model section's edits since the export, by its digest: named where another pooling or padding side in
    the model and calibration sections gives the recorded digest (the edits a user makes), else said in general.
    A config exported without a digest is taken as it is."""
    model, calibration = exported.model, exported.calibration
    if model.digest is None or config_digest(model, calibration) == model.digest:
        return []
    poolings: tuple[Pooling, ...] = ("cls", "mean", "last")
    sides: tuple[PaddingSide, ...] = ("left", "right")
    for pooling, side, calibration_pooling, calibration_side in itertools.product(poolings, sides, poolings, sides):
        was = model.model_copy(update={"pooling": pooling, "padding_side": side})
        then = calibration.model_copy(update={"pooling": calibration_pooling, "padding_side": calibration_side})
        if config_digest(was, then) == model.digest:
            edits = [
                f"{where}: the config says {now!r}, but it was exported with {before!r}"
                for where, now, before in (
                    ("model.pooling", model.pooling, pooling),
                    ("model.padding_side", model.padding_side, side),
                    ("calibration.pooling", calibration.pooling, calibration_pooling),
                    ("calibration.padding_side", calibration.padding_side, calibration_side),
                )
                if now != before
            ]
            return [f"{edit} (edited after the export)" for edit in edits]
    return ["model: its fields were edited after the export (they no longer match model.digest, recorded at export)"]


def _pipeline_differences(model: ModelSection, now: Pipeline, folder: Path) -> list[str]:
    """How the model's pipeline in `folder` differs from the one the config recorded, one phrase per difference. A
    config exported without one fits a folder whose pipeline leaves posfair's plain vectors as they are."""
    if model.pipeline is None:
        if not now.changes_vectors():
            return []
        return [
            f"model.pipeline: the config records none: it was exported before posfair applied {folder}'s own "
            f"sentence-transformers pipeline ({_described(now)}), so its calibration was chosen on other vectors"
        ]
    recorded, current = model.pipeline, PipelineRecord.of(now)
    differences = []
    for name in ("query_prompt", "document_prompt", "lower_case"):
        was, now_has = getattr(recorded, name), getattr(current, name)
        if was != now_has:
            said = f"the config says {shown(was)}, but {folder} has {shown(now_has)}"
            differences.append(f"model.pipeline.{name}: {said}")
    listed = [(m.type, m.path) for m in recorded.modules]
    if listed != [(m.type, m.path) for m in current.modules]:
        listing = f"the config lists {_modules(recorded)}, but {folder} has {_modules(current)}"
        return [*differences, f"model.pipeline.modules: {listing}"]
    for index, (was, now_module) in enumerate(zip(recorded.modules, current.modules)):
        for name in ("mode", "in_features", "out_features", "bias", "activation"):
            if getattr(was, name) != getattr(now_module, name):
                differences.append(
                    f"model.pipeline.modules[{index}] ({was.path}): {name}: the config says {getattr(was, name)!r}, "
                    f"but {folder} has {getattr(now_module, name)!r}"
                )
        changes = fingerprint_changes(was.weights or {}, now_module.weights or {})
        if changes:
            where = f"model.pipeline.modules[{index}] ({was.path})"
            differences.append(f"{where}: its weights differ ({'; '.join(changes)})")
    return differences


def _modules(record: PipelineRecord) -> str:
    return " → ".join(f"{m.type} ({m.path or '.'})" for m in record.modules) or "no modules"


def _described(pipeline: Pipeline) -> str:
    prompts = (("query", pipeline.query_prompt), ("document", pipeline.document_prompt))
    parts = [f"{name} prompt {shown(text)}" for name, text in prompts if text]
    parts += [f"Dense {m.path}" for m in pipeline.head if m.dense is not None]
    return ", ".join(parts + (["lower-cased input"] if pipeline.lower_case else []))


def _local_folder(spec: ModelSpec, revision: str | None) -> Path | None:
    """The folder the model would load from, if it is on this machine (a hub model: its cached snapshot)."""
    try:
        location = Path(locate(spec, revision))
    except RuntimeError:  # not here: loading it fails with the fix
        return None
    return location if location.is_dir() else None


@functools.cache
def _say_unpinned(path: str) -> None:
    log.warning(
        "%s records no fingerprint of its model's weights (it has no model.weights), so weights "
        "changed since the export would go unnoticed; export it again to record one",
        path,
    )


def model_section(loaded: LoadedModel, calibration: CalibrationConfig) -> ModelSection:
    """The model as `calibration` was tuned on it, with what loading checks: fingerprints, pipeline, digest."""
    location = Path(loaded.location)
    pinned = loaded.location and location.is_dir() and not is_hub_snapshot(location)
    section = ModelSection(
        name=loaded.spec.alias,
        source=loaded.spec.source,
        revision=loaded.revision,
        pooling=loaded.spec.pooling,
        padding_side=loaded.spec.padding_side,
        num_layers=loaded.num_layers,
        max_length=loaded.max_length,
        weights=weights_fingerprint(location) if pinned else None,
        tokenizer=tokenizer_fingerprint(location) if pinned else None,
        pipeline=PipelineRecord.of(loaded.pipeline),
        digest=None,
    )
    return section.model_copy(update={"digest": config_digest(section, calibration)})


def explicit(config: CalibrationConfig, num_layers: int) -> CalibrationConfig:
    """The same config with its layer spec written out as explicit indices."""
    return config.model_copy(update={"layers": list(config.resolve_layers(num_layers))})


def build_export(
    loaded: LoadedModel,
    config: CalibrationConfig,
    metrics: dict[str, dict[str, float | None]],
    *,
    study: str,
    trial: int,
    storage: str,
    dataset: str,
    dataset_fingerprint: str,
    seed: int,
    selection_rule: str = "lowest",
    selection: str = "",
    **provenance: object,
) -> ExportedConfig:
    """The export of `config` for `loaded`; `provenance` adds the optional Provenance fields (run id, intervals...)."""
    calibration = explicit(config, loaded.num_layers)
    return ExportedConfig(
        model=model_section(loaded, calibration),
        calibration=calibration,
        metrics=metrics,
        provenance=Provenance(
            study=study,
            trial=trial,
            storage=storage,
            dataset=dataset,
            dataset_fingerprint=dataset_fingerprint,
            seed=seed,
            created=datetime.now(UTC).isoformat(timespec="seconds"),
            posfair_version=__version__,
            selection_rule=selection_rule,
            selection=selection,
            versions=library_versions(),
            git_commit=git_commit(),
            **provenance,  # type: ignore[arg-type]
        ),
    )


def library_versions() -> dict[str, str]:
    import torch
    import transformers

    return {"posfair": __version__, "torch": torch.__version__, "transformers": transformers.__version__}


def git_commit() -> str | None:
    """The commit of posfair's own source, if it runs from a git checkout (with ' (modified)' if dirty)."""
    source = Path(__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=source, capture_output=True, text=True, timeout=5)
        if commit.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "."],
            cwd=source,
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return commit.stdout.strip() + (" (modified)" if dirty else "")


def to_yaml(exported: ExportedConfig) -> str:
    """The YAML text: fields the config's variant ignores are left out (w exists only for CLS-Hard)."""
    data = exported.model_dump(mode="json", by_alias=True, exclude_none=False)
    if "fixed" not in exported.calibration.role_policies().values():  # w is the "fixed" policy's self-mass
        data["calibration"].pop("weight", None)
    data["provenance"] = {k: v for k, v in data["provenance"].items() if v not in (None, [], {})}
    for module in (data["model"].get("pipeline") or {}).get("modules", []):  # only the fields of its type
        for key in [k for k, v in module.items() if v is None]:
            del module[key]
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)


def write_exported(exported: ExportedConfig, path: str | Path, *, force: bool = False) -> Path:
    """Write atomically by posfair's rule for outputs (`tuner.common.files`): replacing only an exported config,
    unless `force`; nothing partial on failure."""
    return write_atomically(Path(path), to_yaml(exported), kind=EXPORTED_CONFIG, force=force, flag="--output")


def load_exported(path: str | Path) -> ExportedConfig:
    """Read and validate an exported config, loading no model.

    The YAML is read safely (a `!!python/...` tag is refused, never executed; duplicate keys and alias bombs too)
    and every field is validated against the schema.

    Args:
        path: The exported YAML file (written by `tune` or `tune export`).

    Returns:
        The config: its model, its calibration, the metrics it was chosen on and its provenance.

    Raises:
        ExportError: The file cannot be read as YAML, or a field is missing or invalid; the message names each
            field by its dotted path and what it allows.
    """
    path = Path(path)
    try:
        data = load_file(path)
    except YamlError as error:
        raise ExportError(str(error)) from None
    if not isinstance(data, dict):
        raise ExportError(f"{path}: expected a mapping with schema, model, calibration, metrics, provenance")
    try:
        return ExportedConfig.model_validate(data)
    except (ValidationError, ConfigError) as error:
        raise ExportError(f"{path}: invalid config:\n  {_fields(error)}") from None


def _fields(error: ValidationError | ConfigError) -> str:
    """One line per bad field, named by its dotted path in the file."""
    if isinstance(error, ConfigError):
        return str(error)
    lines = []
    for item in error.errors():
        where = ".".join(str(part) for part in item["loc"])
        cause = item.get("ctx", {}).get("error")
        if isinstance(cause, ConfigError):  # the calibration section's own validation
            lines += [f"{where}.{line.strip()}" for line in str(cause).splitlines()[1:]]
        else:
            lines.append(f"{where}: {item['msg']} (got {shown(item.get('input'))})")
    return "\n  ".join(lines)
