"""The systemd units in config/: valid for systemd, and hardened.

Debian's ``systemd`` package gives ``systemd-analyze`` without a running systemd
(``scripts/setup --systemd`` installs it); where it is missing these tests skip.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CONFIG = Path(__file__).parents[1] / "config"
ANALYZE = shutil.which("systemd-analyze")
#: The worker unit's exposure may not exceed this ("OK" starts below 5; the best-hardened
#: services stay under 2).
MAX_EXPOSURE = 2.0
#: Every figure systemd-analyze prints is under a minute on a loaded machine.
RUN_TIMEOUT = 60

pytestmark = pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze is not installed")


def _analyze(*args: str) -> subprocess.CompletedProcess[str]:
    assert ANALYZE is not None
    return subprocess.run(
        [ANALYZE, *args],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        # UTF-8 for the ✓/✗ marks; no colour codes in what we parse.
        env={**os.environ, "LC_ALL": "C.UTF-8", "SYSTEMD_COLORS": "0", "SYSTEMD_PAGER": ""},
        stdin=subprocess.DEVNULL,
    )


def _installable(tmp: Path) -> dict[str, Path]:
    """The units as written, but with ExecStart naming this environment's ``hipr``:
    verify checks that the command exists, and /opt/hipr/venv is the installed layout."""
    hipr = Path(sys.executable).parent / "hipr"
    if not hipr.exists():
        pytest.skip(f"no hipr executable beside {sys.executable}")
    units: dict[str, Path] = {}
    for source, name in (
        ("hipr-worker.service", "hipr-worker.service"),
        ("hipr-worker.socket", "hipr-worker.socket"),
        # A template is verified through an instance of it.
        ("hipr-worker@.service", "hipr-worker@0.service"),
    ):
        text = (CONFIG / source).read_text().replace("/opt/hipr/venv/bin/hipr", str(hipr))
        (tmp / name).write_text(text)
        units[name] = tmp / name
    return units


def test_units_verify_without_a_warning(tmp_path: Path) -> None:
    units = _installable(tmp_path)
    result = _analyze("verify", *(str(p) for p in units.values()))
    assert result.returncode == 0, result.stderr
    # Unknown keys and bad values are only warnings: none may appear.
    assert result.stderr.strip() == "", result.stderr


def _security(unit: Path) -> tuple[float, list[tuple[str, float]]]:
    result = _analyze("security", "--offline=true", "--no-pager", str(unit))
    if "--offline" in result.stderr and result.returncode != 0:
        pytest.skip("this systemd-analyze has no --offline (systemd < 250)")
    assert result.returncode == 0, result.stderr
    overall = re.search(r"Overall exposure level for \S+: (\d+(?:\.\d+)?)", result.stdout)
    assert overall is not None, result.stdout
    items = [
        (m.group(1), float(m.group(2)))
        for m in re.finditer(r"^✗ (\S+)\s.*?(\d+\.\d+)\s*$", result.stdout, re.MULTILINE)
    ]
    return float(overall.group(1)), items


@pytest.mark.parametrize("unit", ["hipr-worker.service", "hipr-worker@0.service"])
def test_worker_units_are_hardened(tmp_path: Path, unit: str) -> None:
    exposure, items = _security(_installable(tmp_path)[unit])
    assert exposure <= MAX_EXPOSURE, items


def test_every_remaining_exposure_item_is_explained(tmp_path: Path) -> None:
    path = _installable(tmp_path)["hipr-worker.service"]
    _, items = _security(path)
    assert len(items) >= 5, "the ✗ lines were not parsed"  # 12 with this systemd
    comments = "\n".join(
        line for line in path.read_text().splitlines() if line.lstrip().startswith("#")
    )
    unexplained = [name for name, _ in items if name not in comments]
    assert not unexplained, f"say in a comment why these stay: {unexplained}"
