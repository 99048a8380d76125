"""``hipr bench`` runs from an installed wheel: nothing of the source checkout is needed.

The suite, its baselines and floors live in the package (``hipr.bench``); these tests
install the package where no checkout is on the path and run ``hipr bench --local
--quick --only floor`` there. One builds a real wheel (what ``pip install hipr``
installs); the other copies the package alone, as a quick check of the same thing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import hipr

REPO = Path(__file__).resolve().parent.parent
PACKAGE = Path(hipr.__file__).resolve().parent


def _isolated_env(site: Path) -> dict[str, str]:
    """This interpreter's environment with ``site`` first on the path and no checkout."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH")}
    env["PYTHONPATH"] = str(site)
    return env


def _bench_floor(site: Path, cwd: Path) -> dict[str, object]:
    """``python -m hipr bench --local --quick --only floor`` with ``site`` as the package's
    home; checks first that the run really cannot see the checkout."""
    env = _isolated_env(site)
    probe = (
        "import importlib.util, json, hipr; "
        "print(json.dumps([hipr.__file__, importlib.util.find_spec('benchmarks') is None]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    where, no_benchmarks = json.loads(done.stdout)
    assert Path(where).resolve().is_relative_to(site.resolve()), where
    assert no_benchmarks, "the checkout's benchmarks/ is importable: the test proves nothing"
    command = ["bench", "--local", "--quick", "--only", "floor", "--transport", "unix"]
    done = subprocess.run(
        [sys.executable, "-m", "hipr", *command, "--json"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    document: dict[str, object] = json.loads(done.stdout)
    return document


def _check_floor_run(document: dict[str, object]) -> None:
    runs = document["runs"]
    assert isinstance(runs, list) and len(runs) == 1
    run = runs[0]
    assert run["transport"] == "unix" and run["loop"] == "blocking"
    names = [row["name"] for row in run["rows"]]
    assert names[:2] == ["blocking echo 24/32 B, median", "blocking echo 24/32 B, p99"]
    assert {row["bench"] for row in run["rows"]} == {"floor"}
    assert all(row["value"] > 0 for row in run["rows"] if row["value"] is not None)


def test_bench_runs_from_the_package_alone(tmp_path: Path) -> None:
    """The package copied where no checkout is: the floor group runs end to end."""
    site = tmp_path / "site"
    shutil.copytree(PACKAGE, site / "hipr", ignore=shutil.ignore_patterns("__pycache__"))
    work = tmp_path / "elsewhere"
    work.mkdir()
    _check_floor_run(_bench_floor(site, work))


def test_bench_runs_from_an_installed_wheel(tmp_path: Path) -> None:
    """A wheel built from the checkout and installed into a folder of its own."""
    wheels = tmp_path / "wheels"
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(REPO)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = wheels.glob("hipr-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    assert "hipr/bench/suite.py" in names
    assert not any(name.startswith("benchmarks/") for name in names)
    site = tmp_path / "site"
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), wheel],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert installed.returncode == 0, installed.stderr[-3000:]
    _check_floor_run(_bench_floor(site, tmp_path))
