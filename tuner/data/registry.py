"""Benchmark names and paths -> loaders: the one place the CLI and the study resolve a `--dataset` value."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from tuner.data.beir import load_beir
from tuner.data.dataset import PositionalDataset
from tuner.data.fineweb_posq import check_available as check_fineweb_posq
from tuner.data.fineweb_posq import load_fineweb_posq
from tuner.data.jsonl import CORPUS_FILE, QRELS_FILE, QUERIES_FILE, find_file, load_jsonl
from tuner.data.posir import PosIRFolder, PosIRLayout, load_posir, posir_domains, read_posir
from tuner.data.probe import load_probe
from tuner.data.squad import NAMES as SQUAD_NAMES
from tuner.data.squad import cached_path as squad_cached_path
from tuner.data.squad import load_named as load_squad_named
from tuner.data.squad import load_squad, squad_file
from tuner.data.wikipos import (
    GROUP_ORDER,
    SPLITS,
    STRUCTURE_RECORDS,
    THIRDS,
    load_wikipos,
    load_wikipos_structure,
    wikipos_folder,
    wikipos_name,
)

Loader = Callable[..., PositionalDataset]


def _wikipos(split: str, /, **options: Any) -> PositionalDataset:
    """WikiPos by name: the split is fixed by the name, so options are a mistake worth reporting."""
    if options:
        raise ValueError(f"wikipos-{split} takes no options, got {sorted(options)}")
    return load_wikipos(split)


TITLED_SPLITS = ("dev",)
"""The WikiPos splits also offered with their article titles as queries (`wikipos-dev+titles`): a tuning set with
twice the position-labelled queries over the same passages
(docs/search.md, "How sharply a study tells configs apart")."""

BENCHMARKS: dict[str, Loader] = {
    **{f"wikipos-{split}": partial(_wikipos, split) for split in SPLITS},
    **{wikipos_name(split, titles=True): partial(load_wikipos, split, titles=True) for split in TITLED_SPLITS},
    **{name: partial(load_squad_named, name) for name in SQUAD_NAMES},
    "fineweb-posq": load_fineweb_posq,
}
"""Benchmarks reachable by name alone (SQuAD's splits fetched on first use, FineWeb-PosQ from the Hub or its local
cache): what a user names."""

STRUCTURE_VIEWS: dict[str, Loader] = {
    f"{wikipos_name(split, titles)}-{kind}": partial(load_wikipos_structure, split, kind, titles=titles)
    for titles in (False, True)
    for kind in STRUCTURE_RECORDS
    for split in (TITLED_SPLITS if titles else SPLITS)
    if GROUP_ORDER[split] == THIRDS
}
"""A WikiPos set's passages in its other structures (`load_structures`): loadable by name, never listed as a
benchmark, since a study scores them itself beside the set they come from."""

NAMED: dict[str, Loader] = {**BENCHMARKS, **STRUCTURE_VIEWS}


def _probe(path: str | Path, /, **options: Any) -> PositionalDataset:
    """`probe:PATH`: the probe built from the retrieval set in the JSONL or BEIR folder PATH (`tuner.data.probe`)."""
    folder = Path(path)
    kind = detect_format(folder) if folder.is_dir() else None
    if kind not in PROBE_SOURCES:
        raise ValueError(
            f"probe:{path} takes a retrieval set to build a probe from: a JSONL folder (corpus.jsonl, "
            "queries.jsonl with 'relevant', or qrels.tsv) or a BEIR folder (corpus.jsonl, queries.jsonl, "
            "qrels/test.tsv)"
        )
    return load_probe(folder, partial(PREFIXED[kind], folder), dataset_files(str(folder)), **options)


PROBE_SOURCES = ("jsonl", "beir")
"""The formats a probe is built from (`_probe`)."""

PREFIXED: dict[str, Loader] = {
    "posir": load_posir,
    "jsonl": load_jsonl,
    "beir": load_beir,
    "squad": load_squad,
    "probe": _probe,
    "fineweb-posq": load_fineweb_posq,
}
"""Benchmarks read from a path: `prefix:PATH`."""


def known_benchmarks() -> list[str]:
    """Every form a user gives, for help texts and error messages (not the structure views)."""
    return [*BENCHMARKS, *(f"{prefix}:PATH" for prefix in PREFIXED), "PATH (a BEIR, PosIR or JSONL folder)"]


DATASET_FILES = (
    *(name + gz for name in (CORPUS_FILE, QUERIES_FILE, QRELS_FILE) for gz in ("", ".gz")),
    PosIRLayout.queries_file,
    PosIRLayout.corpus_file,
    "qrels",
)
"""What the loaders read in a dataset folder (JSONL, BEIR, PosIR): `dataset_files`."""


def dataset_files(name_or_path: str) -> list[Path]:
    """The files (and folders) a benchmark is read from on this machine, named without reading them: an output
    may never replace one (`tuner.common.files`). The embedded WikiPos's folder; a path given; a dataset
    folder's files that the loaders read, so other files beside them (an export, mlruns/) stay writable."""
    if name_or_path in NAMED:
        if name_or_path in SQUAD_NAMES:
            return [squad_cached_path()]
        return [Path(str(wikipos_folder()))] if name_or_path.startswith("wikipos-") else []
    prefix, colon, path = name_or_path.partition(":")
    given = Path(path if colon and prefix in PREFIXED else name_or_path)
    return [given / name for name in DATASET_FILES] if given.is_dir() else [given]


def check_name(name_or_path: str, flag: str = "--dataset") -> None:
    """Before any work, reading nothing: `name_or_path` names a benchmark, or a path that is there (`_resolve`)."""
    _resolve(name_or_path, flag)


def detect_format(folder: Path) -> str | None:
    """The loader prefix a folder's files call for, or None when they match no supported layout."""
    if (folder / "qrels").is_dir() and find_file(folder, "corpus.jsonl"):
        return "beir"
    if (folder / PosIRLayout.queries_file).is_file():
        return "posir"
    if find_file(folder, CORPUS_FILE) and find_file(folder, QUERIES_FILE):
        return "jsonl"
    return None


def load_crops(name_or_path: str) -> PositionalDataset | None:
    """The crops view of a tuning set (its passages re-cut shorter, `tuner.data.wikipos.crop_records`), or
    None for a set whose passages have no known segment structure (FineWeb-PosQ, PosIR, JSONL, BEIR)."""
    loader = NAMED.get(f"{name_or_path}-crops")
    return loader() if loader is not None else None


STRUCTURES = tuple(STRUCTURE_RECORDS)
"""The other structures a tuning set's own passages are re-built in (`load_structures`)."""


def is_crops(dataset: PositionalDataset) -> bool:
    """Whether a structure is a tuning set's crops (the one `--max-crops-psi` constrains)."""
    return dataset.name.endswith("-crops")


def load_structures(name_or_path: str, tuning: PositionalDataset | None = None) -> list[PositionalDataset]:
    """The tuning set's passages in other structures, made from its own passages and queries (so tuning data,
    never held-out data): crops (fewer, whole segments: shorter passages), openings (the segments cut to
    their opening sentence and re-packed: more and shorter segments) and packed (whole segments re-packed to
    passages of lengths drawn up to the window), where the segments are known
    (WikiPos). Other sets (FineWeb-PosQ, PosIR, JSONL, BEIR), given as `tuning`, get their length halves
    instead (`length_halves`: the same corpus, so no extra encoding); none if they cannot be halved."""
    named = [NAMED[f"{name_or_path}-{kind}"]() for kind in STRUCTURES if f"{name_or_path}-{kind}" in NAMED]
    return named if named or tuning is None else length_halves(tuning)


def length_halves(dataset: PositionalDataset) -> list[PositionalDataset]:
    """The queries whose relevant passage is shorter than the median passage, and those whose passage is not,
    each over the whole corpus (`-shorter`, `-longer`): over-correction shows first on the shorter passages,
    whose last basket is partly filled. Empty unless both halves keep at least two position groups, and for a
    stratified set (PosIR: PSI within length quartiles already compares passages of one length)."""
    if dataset.strata:
        return []
    lengths = sorted(len(text) for text in dataset.corpus.values())
    median = lengths[len(lengths) // 2]
    shorter = [q for q in dataset.queries if min(len(dataset.corpus[d]) for d in dataset.qrels[q]) < median]
    longer = [q for q in dataset.queries if q not in set(shorter)]
    halves = (
        [dataset.subset(shorter, f"{dataset.name}-shorter"), dataset.subset(longer, f"{dataset.name}-longer")]
        if shorter and longer
        else []
    )
    return halves if all(sum(n > 0 for n in h.group_sizes().values()) >= 2 for h in halves) else []


def check_available(name_or_path: str) -> None:
    """Raise at once if a benchmark that lives outside posfair cannot be had from here: FineWeb-PosQ, and SQuAD's
    splits (fetched here, on first use, so a run that cannot have them stops before any other work).

    The other benchmarks are embedded or read from a local path, and their loaders fail fast on their own.
    """
    prefix, colon, path = name_or_path.partition(":")
    if prefix == "fineweb-posq":
        check_fineweb_posq(path if colon else None)
    if name_or_path in SQUAD_NAMES:
        squad_file()


def load_benchmark(name_or_path: str, **options: Any) -> PositionalDataset:
    """Load a positional benchmark by name, by `prefix:PATH`, or from a folder whose layout names its format.

    Args:
        name_or_path: A benchmark's name (`wikipos-dev`, `fineweb-posq`, ...: `tune --help` lists them), a
            format and a path (`jsonl:PATH`, `beir:PATH`, `posir:PATH`, `squad:PATH`, `probe:PATH`,
            `fineweb-posq:PATH`), or a folder in one of those layouts.
        **options: Passed to the format's loader, e.g.
            `load_benchmark("fineweb-posq", sample_per_group=None, part="tune")`.

    Returns:
        The passages, the queries, their relevance judgements and, where the benchmark has them, the position
        groups of the queries' answers.

    Raises:
        ValueError: An unknown name, a `prefix:` without a path, a folder of no known layout, or data the
            loader cannot read (the message names the file and the field).
        FileNotFoundError: `prefix:PATH` names no file or folder.
        DatasetUnavailableError: A benchmark that lives outside posfair (FineWeb-PosQ, SQuAD) cannot be had from
            here; the message says how to get it.
    """
    loader, path = _resolve(name_or_path)
    return loader(**options) if path is None else loader(path, **options)


def _resolve(name_or_path: str, flag: str = "--dataset") -> tuple[Loader, str | Path | None]:
    """The loader of a benchmark name, `prefix:PATH` or folder, and the path it reads (None for a name)."""
    if name_or_path in NAMED:
        return NAMED[name_or_path], None
    prefix, colon, path = name_or_path.partition(":")
    if colon and prefix in PREFIXED:
        if not path:
            raise ValueError(f"{name_or_path!r} names no path; write {prefix}:PATH")
        if prefix != "fineweb-posq" and not Path(path).exists():  # FineWeb-PosQ's source may be a hub id
            raise FileNotFoundError(f"{flag} {name_or_path}: no file or folder {path}")
        return PREFIXED[prefix], path
    folder = Path(name_or_path)
    if folder.is_dir():
        kind = detect_format(folder)
        if kind is None:
            raise ValueError(
                f"{folder} matches no known layout (BEIR: corpus.jsonl + qrels/; PosIR: queries.parquet; "
                f"JSONL: corpus.jsonl + queries.jsonl); name the format with a prefix: {', '.join(PREFIXED)}"
            )
        return PREFIXED[kind], folder
    raise ValueError(f"unknown benchmark {name_or_path!r}; known: {', '.join(known_benchmarks())}")


def read_posir_domains(name_or_path: str, **options: Any) -> list[PosIRFolder]:
    """Every PosIR `<language>/<domain>` folder `name_or_path` names (`posir:PATH` or a folder: one domain, or a
    `<language>` folder of them), read for PosIR's own figures (`tuner.data.posir.read_posir`, with `options`)."""
    prefix, colon, path = name_or_path.partition(":")
    folder = Path(path if colon and prefix == "posir" else name_or_path)
    if (colon and prefix != "posir") or name_or_path in NAMED or not folder.is_dir():
        raise ValueError(
            f"{name_or_path!r} is not a PosIR folder: PosIR's own figures read its spans and token lengths; give "
            "posir:PATH, PATH being a <language>/<domain> folder or a <language> folder of them"
        )
    return [read_posir(domain, **options) for domain in posir_domains(folder)]
