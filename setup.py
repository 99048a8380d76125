"""Builds the native proxy libraries (hipr/proxy/lib/libamdhip64.so, libhiprtc.so, and
libcuda.so.1) and the worker's native launch-and-wait (hipr/backends/lib/) as part of
``pip install .`` and ``pip install -e .``. All metadata is in pyproject.toml.

Where the C compiler or libcbor is missing, the install still succeeds (the Python
client needs neither) and says how to build the proxy later (``hipr proxy build``)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


def _by_path(name: str, relative: str):  # type: ignore[no-untyped-def]
    # Loaded by path: the package's dependencies are not installed yet.
    spec = importlib.util.spec_from_file_location(name, ROOT / relative)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _proxy_build():  # type: ignore[no-untyped-def]
    return _by_path("_hipr_proxy_build", "hipr/proxy/build.py")


class BuildWithProxy(build_py):
    """build_py, then the proxy libraries into the package's lib/ folder, and the worker's
    native launch-and-wait into hipr/backends/lib/."""

    def run(self) -> None:
        super().run()
        proxy = _proxy_build()
        editable = getattr(self, "editable_mode", False)
        target = ROOT / "hipr/proxy/lib" if editable else Path(self.build_lib) / "hipr/proxy/lib"
        try:
            proxy.build(target)
        except proxy.BuildError as exc:
            print(f"hipr: the native proxy was not built: {exc}", file=sys.stderr)
        # Optional too: without it the worker compiles it on first use, or runs without.
        launch_wait = _by_path("_hipr_launch_wait", "hipr/backends/_launch_wait.py")
        lib = ROOT / "hipr/backends/lib" if editable else Path(self.build_lib) / "hipr/backends/lib"
        if not launch_wait.build_library(lib / launch_wait.LIBRARY):
            print("hipr: the worker's native launch path was not built", file=sys.stderr)


setup(cmdclass={"build_py": BuildWithProxy})
