"""The exported config: a versioned YAML schema that encoders load, written atomically.

Loading uses `tuner.safe_yaml` (a `!!python/...` tag is refused, never executed; duplicate keys and alias
bombs too) and validates every field; a config made for another model is refused before anything is encoded.
"""

from __future__ import annotations

import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tuner import __version__
from tuner.calibration import CalibrationConfig, ConfigError
from tuner.calibration.config import PaddingSide, Pooling
from tuner.files import write_atomically
from tuner.messages import shown
from tuner.models import LoadedModel, hub_revision
from tuner.safe_yaml import YamlError, load_file

SCHEMA = "posfair/calibration-config"
SCHEMA_VERSION = 1


class ExportError(ValueError):
    """An exported config cannot be read, is invalid, or does not fit the model; the message says why."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSection(_Strict):
    name: str = Field(description="registry alias or folder the model loads from")
    source: str
    revision: str
    pooling: Pooling
    padding_side: PaddingSide
    num_layers: int = Field(ge=1)
    max_length: int = Field(ge=1)

    def load_revision(self) -> str | None:
        """The revision to ask the hub for (package-shipped and local models have none)."""
        return hub_revision(self.revision)


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


class ExportedConfig(_Strict):
    """Everything needed to encode with the winning calibration, and the evidence it was chosen on."""

    schema_name: Literal["posfair/calibration-config"] = Field(SCHEMA, alias="schema")
    schema_version: Literal[1] = SCHEMA_VERSION
    model: ModelSection
    calibration: CalibrationConfig
    metrics: dict[str, dict[str, float | None]] = Field(
        description="split → metric → value: tuning and held-out figures of this config and of the baseline"
    )
    provenance: Provenance

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    def check_model(self, loaded: LoadedModel) -> None:
        """Refuse a config made for another model (other weights, depth or pooling)."""
        mismatches = [
            f"{what}: config says {want!r}, model has {got!r}"
            for what, want, got in (
                ("model.source", self.model.source, loaded.spec.source),
                ("model.num_layers", self.model.num_layers, loaded.num_layers),
                ("model.pooling", self.model.pooling, loaded.spec.pooling),
            )
            if want != got
        ]
        if mismatches:
            raise ExportError("this config was made for another model:\n  " + "\n  ".join(mismatches))


def model_section(loaded: LoadedModel) -> ModelSection:
    return ModelSection(
        name=loaded.spec.alias,
        source=loaded.spec.source,
        revision=loaded.revision,
        pooling=loaded.spec.pooling,
        padding_side=loaded.spec.padding_side,
        num_layers=loaded.num_layers,
        max_length=loaded.max_length,
    )


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
) -> ExportedConfig:
    return ExportedConfig(
        model=model_section(loaded),
        calibration=explicit(config, loaded.num_layers),
        metrics=metrics,
        provenance=Provenance(
            study=study,
            trial=trial,
            storage=storage,
            dataset=dataset,
            dataset_fingerprint=dataset_fingerprint,
            seed=seed,
            created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            posfair_version=__version__,
            selection_rule=selection_rule,
            selection=selection,
        ),
    )


def write_exported(exported: ExportedConfig, path: str | Path) -> Path:
    """Write atomically: a temporary file in the target folder, renamed into place; nothing partial on failure."""
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise ExportError(f"cannot write {path}: folder {folder} does not exist; create it or choose another --output")
    if not os.access(folder, os.W_OK):
        raise ExportError(f"cannot write {path}: folder {folder} is not writable; choose another --output")
    if path.is_dir():
        raise ExportError(f"cannot write {path}: it is a folder; give a file name, e.g. --output {path / 'best.yaml'}")
    text = yaml.safe_dump(exported.model_dump(mode="json", by_alias=True), sort_keys=False, allow_unicode=True)
    return write_atomically(path, text)


def load_exported(path: str | Path) -> ExportedConfig:
    """Read and validate an exported config; errors name the field and the fix."""
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
