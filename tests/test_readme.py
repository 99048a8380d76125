"""The README starts short and true: the two set-up commands first, examples that run,
config keys and commands that exist, links to the rest. The docs index lists every page;
benchmarks/results/ keeps only the runs the docs cite."""

from __future__ import annotations

import fnmatch
import re
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from hipr.backends.emulator import EmulatorBackend
from hipr.cli.app import build_parser
from hipr.testing.harness import worker_in_thread
from hipr.worker.config import WorkerConfig, iter_keys
from hipr.worker.server import Worker

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
README = (REPO / "README.md").read_text()


def _blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, re.S)


def test_readme_is_short_and_begins_with_the_two_commands() -> None:
    lines = README.splitlines()
    assert len(lines) <= 150
    assert lines[0] == "# hipr"
    first = lines.index("```sh")
    assert first <= 2, "the set-up commands come first"
    commands = [li.split("#", 1)[0].strip() for li in lines[first + 1 : first + 3]]
    assert commands == ["./scripts/demo", "./scripts/test"]
    assert lines[first + 3] == "```"


def test_readme_names_only_commands_that_exist() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for block in _blocks(README, "sh"):
        for word in re.findall(r"(?:^|\s|/)hipr ([a-z]+)", block):
            assert word in sub.choices, f"README shows `hipr {word}`, which does not exist"  # type: ignore[attr-defined]


def test_readme_names_only_python_names_that_exist() -> None:
    import importlib

    for dotted in set(re.findall(r"`(hipr(?:\.\w+)+)\(?", README)):
        parts = dotted.split(".")
        obj: object = importlib.import_module(parts[0])
        for part in parts[1:]:
            if not hasattr(obj, part):
                obj = importlib.import_module(f"{obj.__name__}.{part}")  # type: ignore[attr-defined]
            else:
                obj = getattr(obj, part)


def test_readme_config_keys_exist() -> None:
    known = {k.key for k in iter_keys()}
    [block] = [b for b in _blocks(README, "toml") if "listen" in b]
    data = tomllib.loads(block)

    def flat(d: dict[str, object], prefix: str = "") -> Iterator[str]:
        for k, v in d.items():
            if isinstance(v, dict):
                yield from flat(v, f"{prefix}{k}.")
            else:
                yield f"{prefix}{k}"

    unknown = set(flat(data)) - known
    assert not unknown, f"README's worker.toml has unknown keys {unknown}"


@pytest.fixture
def worker() -> Iterator[Worker]:
    backend = EmulatorBackend(device_count=1, total_memory=64 << 20)
    with worker_in_thread(WorkerConfig(), backend, loop="asyncio") as running:
        yield running


def test_readme_connect_example_runs(worker: Worker) -> None:
    [code] = [b for b in _blocks(README, "python") if "hipr.connect" in b]
    code = code.replace("tcp://127.0.0.1:18515", worker.bound_urls[0])
    exec(compile(code, "README.md", "exec"), {})


def test_docs_index_lists_every_page() -> None:
    index = (DOCS / "README.md").read_text()
    assert index.index("quickstart.md") < index.index("](", index.index("quickstart.md") + 20)
    linked = set(re.findall(r"\]\(([^)#\s]+)", index))
    pages = {p.name for p in DOCS.glob("*.md") if p.name != "README.md"}
    assert pages <= linked, f"docs/README.md does not link {sorted(pages - linked)}"
    for folder in ("gpu-runs/", "reliability/", "api/index.md"):
        assert folder in linked


def test_links_in_guide_and_api_pages_resolve() -> None:
    for page in [*DOCS.glob("*.md"), *(DOCS / "api").glob("*.md"), REPO / "README.md"]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if re.match(r"^[a-z]+:", target):
                continue
            assert (page.parent / target).exists(), f"{page} links to missing {target}"


def test_dated_tables_live_in_their_own_pages() -> None:
    for page in DOCS.glob("*.md"):
        if page.name in ("verified.md",):
            continue
        assert "| backend | machine | what ran | result |" not in page.read_text(), page.name
    assert "| backend | machine | what ran | result |" not in README


def _expand(pattern: str) -> list[str]:
    m = re.search(r"\{([^{}]*)\}", pattern)
    if not m:
        return [pattern]
    out: list[str] = []
    for alt in m.group(1).split(","):
        out += _expand(pattern[: m.start()] + alt + pattern[m.end() :])
    return out


def test_benchmark_results_are_the_runs_the_docs_cite() -> None:
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    results = [f.split("/", 2)[2] for f in tracked if f.startswith("benchmarks/results/")]
    text = "\n".join(
        (REPO / f).read_text(errors="ignore")
        for f in tracked
        if not f.startswith("benchmarks/results/")
        and (REPO / f).is_file()
        and f.endswith((".md", ".txt", ".py", ".toml", ".json", ".yml", ".yaml"))
    )
    patterns = {
        e
        for m in re.finditer(r"results/([A-Za-z0-9_.*{},\-]+)", text)
        for e in _expand(m.group(1).rstrip(".,"))
    }
    uncited = [
        name
        for name in results
        if not any(fnmatch.fnmatch(name, p) or fnmatch.fnmatch(name, p + "*") for p in patterns)
        and not re.search(re.escape(name.rsplit(".", 1)[0]) + r"\b", text)
    ]
    assert not uncited, f"cited by no doc (git rm them; history keeps them): {uncited}"
