"""The documentation as a user reads it: a short README whose links resolve, figures that are their benchmark's JSON
record rendered (never typed), a command-line page generated from the app, and no development history in anything
a user reads (issue numbers, dated diaries)."""

from __future__ import annotations

import html
import importlib.util
import json
import re
from pathlib import Path
from types import ModuleType

import pytest
import typer
import yaml

from benchmarks import render
from benchmarks.figures import plots
from tuner.cli.app import app
from tuner.cli.reference import reference

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs").glob("*.md"))
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
EXTERNAL = {"https://arxiv.org/abs/2606.02737"}  # the paper; no network here to fetch it

# What a user must not meet: this project's issue numbers ("issue 21", "Issues 20/21", "#21" but not another
# project's "owner/repo#21"), dates in prose, and diary words that date a statement.
HISTORY = re.compile(
    r"\bissues? \d+"
    r"|(?<![\w/.-])#\d+\b"
    r"|\b20\d\d-\d\d-\d\d\b"
    r"|\b(?:today|yesterday|tonight|this (?:morning|afternoon|evening)|earlier today)\b",
    re.IGNORECASE,
)


def user_facing() -> dict[str, str]:
    """Every text a user reads: README, the documentation's pages, the command line's help, and the package's source
    (its messages, MLflow descriptions and tags, docstrings and comments)."""
    texts = {
        str(path.relative_to(ROOT)): path.read_text(encoding="utf-8")
        for path in [README, *PAGES, ROOT / "benchmarks" / "README.md"]
    }
    texts["tune --help (every command)"] = reference()
    for package in ("tuner", "objectives"):
        for source in sorted((ROOT / package).rglob("*.py")):
            texts[str(source.relative_to(ROOT))] = source.read_text(encoding="utf-8")
    return texts


def test_the_readme_is_short() -> None:
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 150


def test_every_readme_link_resolves() -> None:
    links = LINK.findall(README.read_text(encoding="utf-8"))
    assert links, "the README links into the documentation"
    for target in links:
        if target.startswith(("http://", "https://")):
            assert target in EXTERNAL, f"{target}: an external link nobody checked"
            continue
        assert (ROOT / target.split("#")[0]).exists(), f"README links to {target}, which does not exist"


def test_no_user_facing_text_carries_issue_numbers_or_a_dated_diary() -> None:
    found = [
        f"{name}:{text.count(chr(10), 0, match.start()) + 1}: {match.group(0)!r}"
        for name, text in user_facing().items()
        for match in HISTORY.finditer(text)
    ]
    assert not found, "history belongs in docs/changelog.md as what changed, not when:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "text",
    [
        "as issue 21 allows",
        "Issues 20/21",
        "see #21",
        "on 2026-12-03 it took",
        "Today's default",
        "earlier today",
        "this morning's run",
    ],
)
def test_the_history_check_catches(text: str) -> None:
    assert HISTORY.search(text)


@pytest.mark.parametrize(
    "text", ["pytest-dev/pytest-xdist#1386", "optuna-dashboard#772", "colour #1f77b4", "the issue is noise"]
)
def test_the_history_check_leaves_alone(text: str) -> None:
    assert not HISTORY.search(text)


# ---------------------------------------------------------------- figures come from their records


def test_every_figure_in_the_docs_is_its_record_rendered() -> None:
    assert render.stale(render.documents()) == [], "run python -m benchmarks.render after a benchmark"


def test_the_readme_and_getting_started_show_the_measured_figures() -> None:
    for path in (README, ROOT / "docs" / "index.md"):
        names = {m["name"] for m in render.BLOCK.finditer(path.read_text(encoding="utf-8"))}
        assert {"prerequisites", "trials", "example-output"} <= names, path
    assert "results" in {m["name"] for m in render.BLOCK.finditer(README.read_text(encoding="utf-8"))}


def test_a_figure_typed_over_is_caught(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    original = render.rendered("Before.\n<!-- figure: prerequisites -->\n<!-- /figure -->\nAfter.\n")
    page.write_text(original, encoding="utf-8")
    assert render.stale([page]) == []
    minutes = re.search(r"\| `make tune` \| (\d+) min", original)
    assert minutes is not None
    page.write_text(
        original.replace(minutes.group(0), f"| `make tune` | {int(minutes.group(1)) + 1} min"), encoding="utf-8"
    )
    assert render.stale([page]) == [f"{page}: prerequisites"]


def test_a_figure_follows_its_record(tmp_path: Path) -> None:
    """The rendered numbers are the record's: change the record and the figure changes with it."""
    record = json.loads((render.record.RESULTS / "first-tune.json").read_text(encoding="utf-8"))
    record["results"].update(tune_seconds=125.0, tune_peak_rss_bytes=7.7e9, mlruns_bytes=3.2e9)
    (tmp_path / "first-tune.json").write_text(json.dumps(record), encoding="utf-8")
    text = render.rendered("<!-- figure: prerequisites -->\n<!-- /figure -->\n", tmp_path)
    assert "| `make tune` | 2 min 5 s |" in text
    assert "| 7.7 GB |" in text and "| 3.2 GB |" in text


def test_a_missing_record_names_the_benchmark_that_writes_it(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"python -m benchmarks\.trial_cost"):
        render.rendered("<!-- figure: trial-cost -->\n<!-- /figure -->\n", tmp_path)


def test_every_record_says_how_where_and_when_it_was_measured() -> None:
    for path in sorted(render.record.RESULTS.glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        assert {"benchmark", "command", "commit", "date", "device", "results"} <= set(data), path
        assert re.search(r"python -m benchmarks\.\w+", data["command"]) and re.fullmatch(
            r"[0-9a-f]{40}(-dirty)?", data["commit"]
        ), path


# ---------------------------------------------------------------- the command-line page is generated


def hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_command_line_page_is_rendered_from_the_app_at_build_time() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    assert "docs/hooks.py" in config["hooks"]
    page = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    assert hooks().MARKER in page and "--max-drift" not in page, "the reference is generated, not typed"
    built = hooks().on_page_markdown(page)
    command = typer.main.get_command(app)
    for name, sub in command.commands.items():  # type: ignore[attr-defined]
        assert f"## `tune {name}`" in built
        for param in sub.params:
            for flag in param.opts:
                if flag.startswith("--"):
                    assert f"`{flag}" in built, f"tune {name} {flag} is missing from the page"


def test_changing_an_options_help_changes_the_page(monkeypatch: pytest.MonkeyPatch) -> None:
    command = typer.main.get_command(app)
    budget = next(p for p in command.commands["run"].params if p.name == "budget")  # type: ignore[attr-defined]
    assert budget.help and budget.help in hooks().on_page_markdown(hooks().MARKER)
    budget.help = "A help text written by this test."
    monkeypatch.setattr(typer.main, "get_command", lambda _app: command)
    page = hooks().on_page_markdown(hooks().MARKER)
    assert "`--budget <str>`: A help text written by this test." in page


def test_the_site_configuration_fetches_nothing_at_build_time() -> None:
    """Offline builds: only plugins that download nothing (not material's social cards or privacy), and no external
    inventories for mkdocstrings."""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    names = [plugin if isinstance(plugin, str) else next(iter(plugin)) for plugin in config["plugins"]]
    assert set(names) <= {"search", "mkdocstrings"}, names
    handler = next(p for p in config["plugins"] if isinstance(p, dict) and "mkdocstrings" in p)["mkdocstrings"][
        "handlers"
    ]["python"]
    assert "inventories" not in handler and "import" not in handler


def test_what_the_models_page_says_of_mpnet_is_what_its_records_hold() -> None:
    """docs/models.md explains MPNet's default studies in words beside their tables, on the default tuning set and on
    `wikipos-dev`; the words must stay true of both designs' records."""
    page = (ROOT / "docs" / "models.md").read_text(encoding="utf-8")
    results = ROOT / "docs" / "results"

    def read(name: str) -> dict:
        return json.loads((results / name).read_text(encoding="utf-8"))["results"]

    designs = [read(f"search-cost-mpnet{suffix}.json")["studies"] for suffix in ("-titles", "")]
    transfers = [read("rules-transfer-titles.json"), read("rules-transfer.json")]
    rules = [{m["model"]: m for m in transfer["models"]} for transfer in transfers]
    bias = read("baseline-direction.json")
    assert "So MPNet's winners are no calibration" in page
    assert all(s["config"]["strength"] == 0 for studies in designs for s in studies if s["arm"] == "robust-third")
    assert "no calibrated trial of its studies, on either tuning set, met every constraint: all but one" in page
    assert all(r["mpnet"]["feasible"] == 0 for r in rules)
    assert sum(r["mpnet"]["pruned_as_worse"] for r in rules) == 1
    assert "on MPNet it is rarely the constraint that decides, nDCG@10 is" in page
    assert all(r["mpnet"]["missed"]["drift"] < r["mpnet"]["missed"]["structure_ndcg"] for r in rules)
    assert "favours no end beyond noise on three of WikiPos-dev's four structures and the end\non the fourth" in page
    directions = [
        "level" if not row["beyond_noise"] else "end" if row["tilt"] > 0 else "beginning"
        for row in bias["models"]["mpnet"]
    ]
    assert sorted(directions) == ["end", "level", "level", "level"]
    quoted = "no calibration is fairer than the uncalibrated model by more than the tuning split's noise"
    assert quoted in page and quoted in (ROOT / "tuner" / "tuning" / "conclusion.py").read_text(encoding="utf-8")
    plain = rules[1]
    assert "none of its calibrated configs met every constraint either" in page
    assert plain["mpnet-grid"]["feasible"] == 0 and plain["mpnet-grid"]["pruned"] == 0
    studies = designs[1]
    grid = next(s for s in studies if s["arm"] == "grid")
    assert grid["config"]["strength"] == 0
    assert "what the grid spent equals what\nthose studies' budget priced it at" in page
    priced = [s for s in studies if s["arm"] != "grid"]
    assert {grid["layer_tokens"] + s["setup_priced"] for s in priced} == {s["grid_layer_tokens"] for s in priced}
    assert (
        "in every default study of MiniLM and MPNet, on both tuning sets, the exponents lie inside the bounds" in page
    )
    assert all(r[m]["exponents"]["outside"] == 0 for r in rules for m in ("minilm", "mpnet"))
    assert "On MPNet's grid (on `wikipos-dev`) one pair falls just below the lower bound" in page
    low, _ = transfers[1]["drift_exponent_bounds"]
    assert (
        plain["mpnet-grid"]["exponents"]["outside"] == 1 and low - 0.05 < plain["mpnet-grid"]["exponents"]["low"] < low
    )
    # the ceiling λ·(limit/drift)^(1/p): with the bound for p it moves by r^(1/p − 1/bound) for a probe r times under
    # the limit
    assert "moves by a fraction of a percent" in page
    assert 20 ** (1 / plain["mpnet-grid"]["exponents"]["low"] - 1 / low) < 1.01


def test_what_the_models_page_says_of_the_rules_on_embeddinggemma_is_what_its_record_holds() -> None:
    """docs/models.md reads EmbeddingGemma's column of the rules table in words; the words must stay true of it."""
    page = " ".join((ROOT / "docs" / "models.md").read_text(encoding="utf-8").split())
    transfer = json.loads((ROOT / "docs" / "results" / "rules-transfer-titles.json").read_text(encoding="utf-8"))
    gemma = {m["model"]: m for m in transfer["results"]["models"]}["embeddinggemma"]
    low, high = transfer["results"]["drift_exponent_bounds"]
    assert "On EmbeddingGemma it is the constraint its trials missed most often" in page
    assert max(gemma["missed"], key=gemma["missed"].get) == "drift"
    assert "about half of its pairs fall below the lower bound and none above it" in page
    exponents = gemma["exponents"]
    assert 0.35 <= exponents["outside"] / exponents["pairs"] <= 0.65 and exponents["low"] < low
    assert exponents["high"] <= high
    assert "In these studies none of the pairs outside the bounds is in such a family" in page
    assert exponents["outside_where_feasible"] == 0
    assert f"bisection puts the ceiling at λ·(limit/drift)^(1/{low:g})" in page
    assert "in EmbeddingGemma's the openings (its most biased structure) set it for every complete trial" in page
    assert gemma["worst_structure"] == {"wikipos-dev+titles-openings": gemma["complete"]}
    assert gemma["rung_order"][-1] == "wikipos-dev+titles-openings"
    assert "feasible on MiniLM and EmbeddingGemma, infeasible and less fair than no calibration on MPNet" in page
    assert gemma["paper_default_feasible"] == gemma["studies"]


def test_what_the_models_page_says_of_embeddinggemmas_studies_is_what_their_records_hold() -> None:
    """docs/models.md reads EmbeddingGemma's default studies and their winners held out in words; the words must stay
    true of the records they rest on."""
    from tuner.tuning.search_space import depth_layers

    page = " ".join((ROOT / "docs" / "models.md").read_text(encoding="utf-8").split())

    def read(name: str) -> dict:
        return json.loads((ROOT / "docs" / "results" / name).read_text(encoding="utf-8"))

    studies = read("search-cost-embeddinggemma.json")
    rules = read("selection-rules-embeddinggemma.json")["results"]
    transfer = {m["model"]: m for m in read("rules-transfer-titles.json")["results"]["models"]}["embeddinggemma"]
    bias = read("baseline-direction-embeddinggemma.json")["results"]["models"]["embeddinggemma"]
    paper = "cls_soft λ0.5 L[12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23] B128"
    assert "each was stopped when it reached its held-out scoring and resumed without it, `--heldout none`" in page
    assert studies["command"].count("--heldout none") == len(studies["results"]["studies"]) == 3
    assert "Every study exports the paper default (trial 1)" in page
    assert {s["winner"] for s in studies["results"]["studies"]} == {1}
    assert {s["winner_config"] for s in rules["studies"]} == {paper} and paper.endswith(
        f"L{list(depth_layers('50%', 24))} B128"
    )
    assert (
        "three trials met every constraint: no calibration, the paper default and the same calibration on the last"
        in page
    )
    last_quarter = f"cls_soft λ0.5 L{list(depth_layers('25%', 24))} B128"
    for study in rules["studies"]:
        assert study["feasible"] == 3 and study["best"] == study["winner"] == 1 and study["band"] == [1]
        assert [t["config"] for t in study["top"]] == [paper, last_quarter, "cls_soft λ0 L[23] B128"]
        runner = study["top"][1]
        assert runner["gap"] > runner["paired_se"]
    assert "Most other calibrated trials missed the drift limit or the HM floor" in page
    assert sorted(transfer["missed"], key=transfer["missed"].get)[-2:] == ["hm_floor", "drift"]
    assert "which favours the beginning on every structure" in page
    assert all(row["beyond_noise"] and row["tilt"] < 0 for row in bias)
    assert "narrows the begin-to-end gap beyond noise on every held-out set" in page
    assert "and loses no nDCG@10 beyond noise on any" in page
    exported = rules["exported"]["wikipos-dev+titles+margin"]
    assert {name: (v["narrowed"], v["ndcg_lost"]) for name, v in exported.items()} == {
        name: (3, 0) for name in rules["heldout"]
    }
    assert {"wikipos-test", "wikipos-test-packed", "squad-test"} <= set(rules["heldout"])
    assert "the studies found no calibration that met the constraints and was fairer" in page
    assert "on every set the end is still found less often than the beginning beyond noise" in page
    assert "moves the gap by less than half its uncalibrated size" in page
    for name, row in rules["scores"].items():
        assert row["paper default"]["end_minus_begin"][2] < 0, name
        assert 0 < row["paper default"]["gap_delta"][0] < -row["no calibration"]["end_minus_begin"][0] / 2, name


def test_what_the_search_page_says_of_the_default_tuning_set_is_what_its_record_holds() -> None:
    """docs/search.md gives the reason the titled set with the margin is the default; the reason must stay true of
    the held-out rule comparison it rests on."""
    page = " ".join((ROOT / "docs" / "search.md").read_text(encoding="utf-8").split())
    results = json.loads((ROOT / "docs" / "results" / "selection-rules-minilm.json").read_text(encoding="utf-8"))
    design = "wikipos-dev+titles+margin"
    studies = [s for s in results["results"]["studies"] if s["design"] == design]
    verdicts = results["results"]["verdicts"][design]
    assert "the tie-break decided no winner and the four rules choose alike" in page
    assert studies and not any(s["tie_break_decided"] for s in studies)
    assert all(len({json.dumps(c, sort_keys=True) for c in s["choices"].values()}) == 1 for s in studies)
    assert "every seed keeps the promise on WikiPos-test, `mixed`, `lengths` and `squad-test`" in page
    for name in ("wikipos-test", "wikipos-mixed", "wikipos-lengths", "squad-test"):
        cell = verdicts["one-se"][name]
        assert cell["beat_paper"] == cell["seeds"] and cell["agree"] and not cell["reversed"], name
    assert "only some seeds beat the paper default beyond noise, and none reverses" in page
    sentences = verdicts["one-se"]["wikipos-sentences"]
    assert 0 < sentences["beat_paper"] < sentences["seeds"] and not sentences["reversed"]


def test_what_the_search_page_says_of_the_start_and_the_samplers_is_what_its_record_holds() -> None:
    """docs/search.md reads the sampler table in words; the words must stay true of the record it renders."""
    from benchmarks.search_cost import _interval, _point
    from tuner.tuning.search_space import depth_layers

    page = " ".join((ROOT / "docs" / "search.md").read_text(encoding="utf-8").split())
    studies = json.loads((ROOT / "docs" / "results" / "search-cost-minilm.json").read_text(encoding="utf-8"))[
        "results"
    ]["studies"]
    arms = {
        arm: [s for s in studies if s["arm"] == arm]
        for arm in ("robust-third", "random-start-third", "tpe-third", "gp-third")
    }
    (grid,) = [s for s in studies if s["arm"] == "grid"]
    sets = sorted(grid["heldout"])
    budgeted = [s for arm in arms.values() for s in arm]
    assert "a study on MiniLM runs 6 to 12 trials" in page
    assert min(s["trials"] for s in budgeted) == 6 and max(s["trials"] for s in budgeted) == 12
    assert "The sampler's own model draws at most two of them" in page
    assert {s["model_draws"] for s in budgeted} <= {0, 1, 2} and max(
        s["model_draws"] for s in arms["robust-third"]
    ) <= 2

    def as_good(study: dict, name: str) -> bool:
        held, g = study["heldout"][name], grid["heldout"][name]
        return (
            _point(held["hm_delta"]) >= _interval(g["hm_delta"])[0]
            and _point(held["ndcg_delta"]) >= _interval(g["ndcg_delta"])[0]
            and held["psi"] <= g["psi"] + 1.96 * g["psi_se"]
        )

    assert "With the queued start every seed's winner is at least as good as the grid's on every held-out set" in page
    assert all(as_good(s, name) for s in arms["robust-third"] for name in sets)
    assert "the least fair seed is less fair than the queued start's least fair on every held-out set" in page
    for name in sets:
        assert max(s["heldout"][name]["psi"] for s in arms["random-start-third"]) > max(
            s["heldout"][name]["psi"] for s in arms["robust-third"]
        )
    assert "the spread is the seeds whose winner is fairer than the grid's, not seeds that fall short of it" in page
    for name in sets:
        ses = sorted(s["heldout"][name]["psi_se"] for s in arms["robust-third"])
        assert all(
            s["heldout"][name]["psi"] <= grid["heldout"][name]["psi"] + ses[len(ses) // 2] for s in arms["robust-third"]
        )
    assert (
        "Cost-aware TPE stays the default: its seeds' mean PSI is no higher than either other sampler's on any set"
        in page
    )
    for name in sets:
        mean = {arm: sum(s["heldout"][name]["psi"] for s in runs) / len(runs) for arm, runs in arms.items()}
        assert mean["robust-third"] <= min(mean["tpe-third"], mean["gp-third"]) + 1e-9
    assert (
        "GPSampler ignores pruned trials (it fits complete ones only), a large share of a study's trials here" in page
    )
    # `pruned` counts the one trial a study may leave unrun when its budget is spent; left out here
    assert sum(s["pruned"] - 1 for s in budgeted) / sum(s["trials"] for s in budgeted) > 0.25
    assert "on six layers they calibrate one and two where the default calibrates three" in page
    assert [len(depth_layers(depth, 6)) for depth in ("last", "25%", "50%")] == [1, 2, 3]
    assert "A fifth of the grid's layer-tokens does not buy a search" in page
    grid_cost = grid["layer_tokens"] + max(s["setup_priced"] for s in budgeted)
    before = max(s["setup_priced"] for s in budgeted) + max(s["paper_default_layer_tokens"] for s in budgeted)
    assert before / grid_cost > 0.5 * 0.2, "the baselines, queries and paper default cost most of a fifth of the grid"


def test_what_the_benchmarks_page_says_of_ram_is_what_its_record_holds() -> None:
    page = " ".join((ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8").split())
    variants = json.loads((ROOT / "docs" / "results" / "footprint.json").read_text(encoding="utf-8"))["results"][
        "variants"
    ]
    assert "All three export the same config; holding neither is the fastest and needs the least memory." in page
    assert len({json.dumps(v["config"], sort_keys=True) for v in variants.values()}) == 1
    neither = variants["neither"]
    assert all(
        neither["seconds"] <= v["seconds"] and neither["peak_rss_bytes"] <= v["peak_rss_bytes"]
        for v in variants.values()
    )
    assert "the default until this was measured" in page
    changelog = " ".join((ROOT / "docs" / "changelog.md").read_text(encoding="utf-8").split())
    assert "which cost a first `tune` more than twice the memory and more time" in changelog
    both = variants["both"]
    assert both["peak_rss_bytes"] > 2 * neither["peak_rss_bytes"] and both["seconds"] > neither["seconds"]
    source = (ROOT / "tuner" / "evaluation" / "layer_inputs.py").read_text(encoding="utf-8")
    assert "RAM_FRACTION = 0.0" in source and "LAYER_INPUTS_IN_RAM = False" in source, (
        "the default is the variant `neither`"
    )


def site_page(name: str) -> str:
    """A page's HTML body as the site builds it: Markdown with the site's extensions, then the site's hooks."""
    import markdown

    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    names = [e if isinstance(e, str) else next(iter(e)) for e in config["markdown_extensions"]]
    options = {
        next(iter(e)): next(iter(e.values())) or {} for e in config["markdown_extensions"] if isinstance(e, dict)
    }
    hooks = load_module(ROOT / "docs" / "hooks.py")
    text = hooks.on_page_markdown((ROOT / "docs" / name).read_text(encoding="utf-8"))
    return hooks.on_page_content(markdown.markdown(text, extensions=names, extension_configs=options))


def load_module(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_math_is_typeset_at_build_time_and_needs_no_script_or_network() -> None:
    """Concepts' formulas reach the page as SVG, not as raw `\\( … \\)` waiting for a MathJax or KaTeX that is not
    there; the TeX is kept as each formula's label, and nothing on the page or in the site's configuration loads a
    script or a font from elsewhere."""
    source = (ROOT / "docs" / "concepts.md").read_text(encoding="utf-8")
    formulas = re.findall(r"\\\((.+?)\\\)", source)
    page = site_page("concepts.md")
    assert formulas and "\\(" not in page and "\\[" not in page
    labels = re.findall(r'<svg role="img" aria-label="([^"]+)"', page)
    assert [html.unescape(label) for label in labels] == [formula.strip() for formula in formulas]
    assert "<style" not in page.split("<svg", 1)[1], "no stylesheet of the formulas' reaches the page"
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    assert not config.get("extra_javascript") and not config.get("extra_css", [])
    assert "http" not in "".join(re.findall(r"<(?:script|link)[^>]*>", page))


def test_every_screenshot_has_a_caption_and_opens_full_size() -> None:
    """The Tracking page's pictures are shrunk to the text's width: each is a link to itself, in a figure with a
    caption."""
    page = site_page("tracking.md")
    images = re.findall(r'<img alt="[^"]*" src="([^"]+)"', page)
    assert len(images) >= 10
    for figure in re.findall(r"<figure>(.*?)</figure>", page, re.S):
        (src,) = re.findall(r'<img alt="[^"]*" src="([^"]+)"', figure)
        assert f'<a href="{src}"><img' in figure and re.search(r"<figcaption>\S.*</figcaption>", figure, re.S), figure
        assert "`" not in figure, "a caption is HTML: Markdown's backticks would show as typed"
    assert len(re.findall(r"<figure>", page)) == len(images), "every picture in a captioned figure"


def test_the_flow_diagram_fits_the_page() -> None:
    """The search page's diagram is a code block: at 1,280 px the text column holds about 80 characters of it."""
    page = (ROOT / "docs" / "search.md").read_text(encoding="utf-8")
    diagram = page.split("## How a trial flows", 1)[1].split("```text\n", 1)[1].split("```", 1)[0]
    assert max(len(line) for line in diagram.splitlines()) <= 78


def test_every_plot_on_the_benchmarks_page_is_drawn_from_what_its_record_holds() -> None:
    """Each plot's PNG carries the digest of the data it was drawn from, and that is its record's data now: a record
    measured again without `python -m benchmarks.render` leaves a PNG this names (and `--check` too)."""
    from benchmarks import record

    page = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    for name, plot in plots.PLOTS.items():
        data = plot.data(record.read(record.RESULTS / f"{plot.source}.json"))
        assert data and plots.drawn_digest(plots.plot_path(name)) == plots.data_digest(data), name
        assert f"<!-- figure: {name} -->" in page and f"(data digest <code>{plots.data_digest(data)}</code>)" in page, (
            name
        )
    assert render.stale_plots() == []


def test_a_plot_drawn_from_other_data_is_caught(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from benchmarks import record

    data = record.read(record.RESULTS / "overhead.json")
    data["results"]["columns"][0]["results"]["engine"]["paired_ratio"] += 0.5  # measured again
    monkeypatch.setattr(plots, "PLOTS_DIR", tmp_path)
    assert plots.drawn_digest(plots.draw_plot("plot-overhead", data)) != plots.data_digest(
        plots.PLOTS["plot-overhead"].data(record.read(record.RESULTS / "overhead.json"))
    )


def test_every_picture_on_the_site_is_of_the_run_the_readme_describes() -> None:
    """The Tracking page's screenshots and the parent run's figures are written by docs/screenshots.py from the clone
    `benchmarks.first_tune` ran (the README's numbers), which keeps each one's SHA-256: the files here must be those."""
    import hashlib

    from benchmarks import record

    pictures = record.read(record.RESULTS / "first-tune.json")["results"].get("pictures", {})
    shown = set(re.findall(r"\]\(([\w-]+\.png)\)", (ROOT / "docs" / "tracking.md").read_text(encoding="utf-8")))
    assert shown and shown <= set(pictures), sorted(shown - set(pictures))
    for name, digest in pictures.items():
        assert hashlib.sha256((ROOT / "docs" / name).read_bytes()).hexdigest() == digest, name
