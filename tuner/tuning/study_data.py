"""The data a study reads: the tuning set, the held-out sets selection never sees, the general set and the tuning
passages' other structures, each checked before any work (the model and every benchmark here, a held-out set truly
held out, position groups that hold queries)."""

from __future__ import annotations

import logging

from tuner.common.messages import UserError
from tuner.common.options import WIKIPOS_TUNING_SET
from tuner.data import (
    DatasetUnavailableError,
    PositionalDataset,
    is_crops,
    load_benchmark,
    load_structures,
    require_position_groups,
)
from tuner.data import check_available as check_benchmark
from tuner.data.wikipos import TRANSFER_SPLITS
from tuner.engine.models import LoadedModel
from tuner.engine.specs import ModelUnavailableError, locate, resolve_spec
from tuner.evaluation.visible import within_reach
from tuner.tuning.settings import TuneSettings

log = logging.getLogger(__name__)


class UnavailableError(UserError, RuntimeError):
    """What the run needs is neither here nor downloadable from here; the message lists every download."""


def check_available(settings: TuneSettings) -> None:
    """Before any work: the model and every benchmark the run reads must be here (or the hub reachable).

    One error names everything missing, each with its `hf download` command, so a user fetches all at once.
    """
    spec = resolve_spec(settings.model, settings.pooling, settings.padding_side)  # type: ignore[arg-type]
    problems = []
    try:
        locate(spec, settings.revision)
    except ModelUnavailableError as error:
        problems.append(str(error))
    names = [settings.dataset, settings.heldout if settings.heldout != "auto" else None, settings.general]
    for name in dict.fromkeys(n for n in names if n):
        try:
            check_benchmark(name)
        except DatasetUnavailableError as error:
            problems.append(str(error))
            if name == settings.dataset and settings.dataset_defaulted:
                problems.append(
                    f"{name} is {settings.model}'s default dataset; to tune offline on the embedded "
                    f"WikiPos instead, add --dataset {WIKIPOS_TUNING_SET}"
                )
    if problems:
        raise UnavailableError("\n".join(problems))


WIKIPOS_HELDOUT = ("wikipos-test", *(f"wikipos-{split}" for split in TRANSFER_SPLITS))


AUTO_HELDOUT: dict[str, tuple[str, ...]] = {
    "wikipos-dev": WIKIPOS_HELDOUT,
    "wikipos-dev+titles": WIKIPOS_HELDOUT,
    "squad-tune": ("squad-test",),
}
"""What `--heldout auto` checks a winner on, by tuning set: WikiPos-dev's test split and transfer sets; the natural
SQuAD set's held-out articles (FineWeb-PosQ holds its own part out: `split_datasets`)."""


def tuning_dataset(settings: TuneSettings) -> str:
    """The name of the tuning set: `--dataset`, or the model's default that `TuneSettings` fills in."""
    if settings.dataset is None:
        raise ValueError("TuneSettings.dataset is unset: the settings skipped their __post_init__")
    return settings.dataset


def split_datasets(settings: TuneSettings) -> tuple[PositionalDataset, list[PositionalDataset]]:
    """The tuning set and the held-out sets selection never sees."""
    name = tuning_dataset(settings)
    if name.startswith("fineweb-posq"):
        tuning = load_benchmark(name, part="tune")
        heldout = [load_benchmark(name, part="heldout")] if settings.heldout == "auto" else []
    else:
        tuning = load_benchmark(name)
        heldout = [load_benchmark(h) for h in AUTO_HELDOUT.get(name, ())] if settings.heldout == "auto" else []
    if settings.heldout not in (None, "auto"):
        heldout = [load_benchmark(h.strip()) for h in settings.heldout.split(",") if h.strip()]
    return tuning, heldout


def check_held_out(tuning: PositionalDataset, heldout: list[PositionalDataset]) -> None:
    """A held-out set must be evidence the tuning never saw: neither the tuning set itself nor one whose relevant
    passages (compared by text, whatever their ids) are relevant passages of the tuning set."""

    def relevant(dataset: PositionalDataset) -> set[str]:
        return {
            dataset.corpus[d]
            for judged in dataset.qrels.values()
            for d, grade in judged.items()
            if grade > 0 and d in dataset.corpus
        }

    tuned = relevant(tuning)
    for held in heldout:
        if held.fingerprint() == tuning.fingerprint():
            raise ValueError(
                f"--heldout {held.name} is the tuning set itself (--dataset {tuning.name}), so its figures would "
                "not be held out; choose a set built from other passages, or --heldout none"
            )
        theirs = relevant(held)
        if shared := len(theirs & tuned):
            raise ValueError(
                f"--heldout {held.name} is not held out: {shared} of its {len(theirs)} relevant passages are "
                f"relevant passages of the tuning set {tuning.name}; choose a set built from other passages, "
                "or --heldout none"
            )


def load_datasets(
    settings: TuneSettings,
) -> tuple[PositionalDataset, list[PositionalDataset], PositionalDataset | None]:
    """The tuning set, the held-out sets and the general set, each checked before the model loads."""
    tuning, heldout = split_datasets(settings)
    general = load_benchmark(settings.general) if settings.general else None
    require_groups(tuning, heldout)
    check_held_out(tuning, heldout)
    return tuning, heldout, general


def require_groups(tuning: PositionalDataset, heldout: list[PositionalDataset]) -> None:
    require_position_groups(tuning, "--dataset")
    for held in heldout:
        require_position_groups(held, "--heldout")


def tuning_structures(settings: TuneSettings, tuning: PositionalDataset, model: LoadedModel) -> list[PositionalDataset]:
    """The tuning passages in their other structures (`--structures`), within the model's reach."""
    structures = (
        [within_reach(s, model) for s in load_structures(tuning_dataset(settings), tuning)]
        if settings.structures
        else []
    )
    if settings.structures and not structures and not settings.worker:
        log.info(
            "%s has no other structures (its passages' segments are unknown): trials are scored on it alone",
            tuning.name,
        )
    if settings.max_crops_psi is not None and not any(is_crops(s) for s in structures) and not settings.worker:
        log.info(
            "%s has no crops view (its passages' segments are unknown): --max-crops-psi does not apply", tuning.name
        )
    return structures


def within_model_reach(
    tuning: PositionalDataset, heldout: list[PositionalDataset], model: LoadedModel
) -> tuple[PositionalDataset, list[PositionalDataset]]:
    """The tuning and held-out sets as the model scores them: queries whose relevant passages lie past its reach are
    gone (`tuner.evaluation.visible.within_reach`)."""
    return within_reach(tuning, model), [within_reach(held, model) for held in heldout]
