"""Build the native proxy libraries (``libamdhip64.so``, ``libhiprtc.so``) from
hipr/proxy/native/ with the system C compiler and libcbor.

Standard library only, and no import of the rest of hipr: ``setup.py`` loads this file by
path while the package is being installed, before its dependencies are.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

NATIVE = Path(__file__).resolve().parent / "native"
#: Where an installed or editable package keeps its built libraries.
LIB_DIR = Path(__file__).resolve().parent / "lib"

HIP_LIBRARY = "libamdhip64.so"
RTC_LIBRARY = "libhiprtc.so"
#: Names programs linked against ROCm 6 ask the loader for: links to the libraries above.
ALIASES = {"libamdhip64.so.6": HIP_LIBRARY, "libhiprtc.so.6": RTC_LIBRARY}

CORE_SOURCES = (
    "wire.c",
    "cborx.c",
    "transport.c",
    "client.c",
    "launch_extra.c",
    "launch_cbor.c",
    "module_send.c",
    "file_bytes.c",
    "graph_wire.c",
)
HIP_SOURCES = (
    *CORE_SOURCES,
    "hip_front.c",
    "hip_extras.c",
    "hipcc.c",
    "modules.c",
    "stubs.c",
    "stream_devices.c",
    "hip_symbols.c",
)
#: cborx.c and file_bytes.c again: their helpers are private to each library.
RTC_SOURCES = ("hiprtc_front.c", "cborx.c", "file_bytes.c")
WARNINGS = ("-Wall", "-Wextra", "-Werror")
#: Libraries of libamdhip64 (the core): libcbor, and OpenSSL for tls:// links.
LIBS = ("-lcbor", "-lssl", "-lcrypto")
CFLAGS = ("-std=c11", "-O2", "-fPIC", "-fvisibility=hidden", *WARNINGS)
SANITIZE = ("-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-g", "-O1")
#: Symbol versions of libamdhip64: everything at hip_4.2 but the symbols ROCm 6 added.
HIP_6_0 = ("hipGetDevicePropertiesR0600",)
BUILD_HINT = (
    "the native proxy needs a C compiler (cc/gcc), libcbor's and OpenSSL's headers "
    "(Debian/Ubuntu: apt-get install gcc libcbor-dev libssl-dev); then run `hipr proxy build`"
)


class BuildError(RuntimeError):
    """The libraries could not be built; the message says why and what to install."""


@dataclass
class Built:
    """What a build produced."""

    directory: Path
    libraries: list[Path] = field(default_factory=list)


def compiler() -> str | None:
    """The C compiler to use: $CC, else cc or gcc on the PATH."""
    cc = os.environ.get("CC")
    if cc:
        return cc
    return shutil.which("cc") or shutil.which("gcc")


def missing_prerequisites(cc: str | None = None) -> str | None:
    """Why the libraries cannot be built here, or None when they can."""
    cc = cc or compiler()
    if cc is None:
        return f"no C compiler found; {BUILD_HINT}"
    probe = (
        "#include <cbor.h>\n"
        "#include <openssl/ssl.h>\n"
        "int main(void) { cbor_item_t *i = cbor_new_null(); cbor_decref(&i);\n"
        "  SSL_CTX *c = SSL_CTX_new(TLS_client_method()); SSL_CTX_free(c); return 0; }\n"
    )
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "probe.c"
        src.write_text(probe)
        result = subprocess.run(
            [cc, str(src), "-o", str(Path(tmp) / "probe"), *LIBS],
            capture_output=True,
            text=True,
            check=False,
        )
    if result.returncode != 0:
        return (
            "libcbor or OpenSSL (cbor.h, openssl/ssl.h, -lcbor -lssl -lcrypto) is not usable: "
            f"{result.stderr.strip()[:300]}; {BUILD_HINT}"
        )
    return None


def _run(cmd: list[str]) -> None:
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise BuildError(f"{' '.join(cmd)} failed:\n{result.stderr.strip()}")


def _compile(
    cc: str, sources: tuple[str, ...], flags: list[str], tmp: Path
) -> tuple[list[Path], list[str]]:
    """The sources' object files, and the global symbols they define (for the version
    script)."""
    names: set[str] = set()
    objects = [tmp / (source + ".o") for source in sources]
    # One compiler per source at once: most of a build's time on a small machine.
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        list(
            pool.map(
                lambda so: _run([cc, *flags, "-c", str(NATIVE / so[0]), "-o", str(so[1])]),
                zip(sources, objects, strict=True),
            )
        )
    for obj in objects:
        out = subprocess.run(
            ["nm", "-g", "--defined-only", str(obj)], capture_output=True, text=True, check=True
        ).stdout
        for line in out.splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[1] in "TDBR":
                names.add(parts[2])
    return objects, sorted(names)


def _hip_version_script(symbols: list[str]) -> str:
    private = [s for s in symbols if s.startswith("hipr_")]
    v60 = [s for s in symbols if s in HIP_6_0]
    v42 = [s for s in symbols if s not in private and s not in v60]

    def block(names: list[str]) -> str:
        return "".join(f"    {n};\n" for n in names)

    return (
        f"hip_4.2 {{\n  global:\n{block(v42)}  local: *;\n}};\n"
        f"hip_6.0 {{\n  global:\n{block(v60)}}} hip_4.2;\n"
        f"HIPR_PRIVATE_0.1 {{\n  global:\n{block(private)}}} hip_6.0;\n"
    )


def build(out_dir: Path | None = None, *, sanitize: bool = False, cc: str | None = None) -> Built:
    """Compile both libraries into ``out_dir`` (default: the package's lib/ folder).
    ``sanitize``: with AddressSanitizer and UndefinedBehaviorSanitizer (tests)."""
    cc = cc or compiler()
    why = missing_prerequisites(cc)
    if why is not None or cc is None:
        raise BuildError(why or BUILD_HINT)
    out = Path(out_dir) if out_dir is not None else LIB_DIR
    out.mkdir(parents=True, exist_ok=True)
    flags = [*CFLAGS, *(SANITIZE if sanitize else ())]
    built = Built(out)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        objects, symbols = _compile(cc, HIP_SOURCES, flags, tmp)
        script = tmp / "amdhip64.map"
        script.write_text(_hip_version_script(symbols))
        rtc_script = tmp / "hiprtc.map"
        rtc_script.write_text("{\n  global: hiprtc*;\n  local: *;\n};\n")
        hip_tmp = tmp / HIP_LIBRARY
        _run(
            [
                cc, *flags, "-shared", f"-Wl,-soname,{HIP_LIBRARY}",
                f"-Wl,--version-script={script}", "-Wl,-z,nodelete", "-Wl,-z,defs",
                # $ORIGIN: a libcbor.so.0.8 copied beside the library is found (hosts
                # without libcbor installed, see docs/proxy.md).
                "-Wl,-rpath,$ORIGIN",
                "-o", str(hip_tmp), *map(str, objects), *LIBS, "-lm", "-pthread",
            ]
        )  # fmt: skip
        rtc_tmp = tmp / RTC_LIBRARY
        _run(
            [
                cc, *flags, "-shared", f"-Wl,-soname,{RTC_LIBRARY}",
                f"-Wl,--version-script={rtc_script}", "-Wl,-z,nodelete", "-Wl,-z,defs",
                "-o", str(rtc_tmp), *(str(NATIVE / s) for s in RTC_SOURCES),
                f"-L{tmp}", "-l:" + HIP_LIBRARY, "-Wl,-rpath,$ORIGIN", "-lcbor",
            ]
        )  # fmt: skip
        for made in (hip_tmp, rtc_tmp):
            target = out / made.name
            # Replace, never rewrite in place: a running program may have the old one mapped.
            staged = out / (made.name + ".new")
            shutil.copyfile(made, staged)
            os.replace(staged, target)
            built.libraries.append(target)
    for alias, name in ALIASES.items():
        link = out / alias
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(name)
    built.libraries.append(build_cuda(out / CUDA_SUBDIR, flags, cc))
    return built


def is_built(directory: Path | None = None) -> bool:
    """Both libraries are present in ``directory`` (default: the package's lib/)."""
    d = directory or LIB_DIR
    return (
        (d / HIP_LIBRARY).is_file()
        and (d / RTC_LIBRARY).is_file()
        and (d / CUDA_SUBDIR / CUDA_LIBRARY).is_file()
        and (d / CUDA_SUBDIR / NVML_LIBRARY).is_file()
    )


def is_current(directory: Path | None = None) -> bool:
    """Both libraries are present and newer than every native source (a checkout that
    changed the C since the last install rebuilds before use)."""
    d = directory or LIB_DIR
    if not is_built(d):
        return False
    sources = [
        p.stat().st_mtime for p in NATIVE.iterdir() if p.suffix in (".c", ".h", ".def", ".txt")
    ]
    built = min(
        (d / n).stat().st_mtime for n in (HIP_LIBRARY, RTC_LIBRARY, f"{CUDA_SUBDIR}/{CUDA_LIBRARY}")
    )
    return not sources or built >= max(sources)


# --- libcuda.so.1: the CUDA driver front (issue 32) -------------------------------------
# In a folder of its own: `hipr run --api cuda` puts it first on the library path, and a
# HIP program run with `--api hip` never finds a libcuda.so.1 of ours.

CUDA_SUBDIR = "cuda"
CUDA_LIBRARY = "libcuda.so.1"
CUDA_SOURCES = (
    *CORE_SOURCES,
    "cuda_front.c",
    "cuda_modules.c",
    "cuda_proc.c",
    "cuda_export.c",
    "cuda_library.c",
    "cuda_trace.c",
    "ptr_set.c",
    "cuda_graphs.c",
    "cuda_pools.c",
)
#: Every driver entry point NVIDIA's libcuda exports (names from the public cuda.h).
CUDA_SYMBOLS = NATIVE / "cuda_symbols.txt"


def cuda_stub_source(served: set[str]) -> str:
    """C for a stub of every name of cuda_symbols.txt not in ``served`` (each returns
    CUDA_ERROR_NOT_SUPPORTED and names itself once on stderr), and their table, sorted
    by name, for cuGetProcAddress."""
    names = sorted(
        n
        for n in (line.strip() for line in CUDA_SYMBOLS.read_text().splitlines())
        if n and not n.startswith("#") and n not in served
    )
    out = [
        "/* GENERATED by hipr/proxy/build.py: driver symbols not served. */\n",
        '#include "client.h"\n#include "cuda_proc.h"\n\n',
        "#define STUB(name) HIPR_EXPORT int name(void) { static int warned; "
        'hipr_warn_once(#name " is not served by the hipr CUDA proxy '
        '(CUDA_ERROR_NOT_SUPPORTED)", &warned); return 801; }\n',
    ]
    out += [f"STUB({n})\n" for n in names]
    out.append("const struct hipr_cu_proc hipr_cu_stubs[] = {\n")
    out += [f'    {{"{n}", (void *){n}}},\n' for n in names]
    out.append("    {0, 0}\n};\n")
    out.append(f"const size_t hipr_cu_n_stubs = {len(names)};\n")
    return "".join(out)


def build_cuda(out: Path, flags: list[str], cc: str) -> Path:
    """Compile libcuda.so.1 into ``out`` (with a libcuda.so link) and return its path."""
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        objects, symbols = _compile(cc, CUDA_SOURCES, flags, tmp)
        served = {s for s in symbols if s.startswith("cu")}
        stubs = tmp / "cuda_stubs_gen.c"
        stubs.write_text(cuda_stub_source(served))
        stub_obj = tmp / "cuda_stubs_gen.o"
        _run([cc, *flags, f"-I{NATIVE}", "-c", str(stubs), "-o", str(stub_obj)])
        script = tmp / "cuda.map"
        script.write_text("{\n  global: cu*;\n  local: *;\n};\n")
        lib_tmp = tmp / CUDA_LIBRARY
        _run(
            [
                cc, *flags, "-shared", f"-Wl,-soname,{CUDA_LIBRARY}",
                f"-Wl,--version-script={script}", "-Wl,-z,nodelete", "-Wl,-z,defs",
                # libcbor beside this library or beside the HIP ones (one folder up).
                "-Wl,-rpath,$ORIGIN:$ORIGIN/..",
                "-o", str(lib_tmp), *map(str, objects), str(stub_obj), *LIBS, "-lm",
                "-pthread",
            ]
        )  # fmt: skip
        target = out / CUDA_LIBRARY
        staged = out / (CUDA_LIBRARY + ".new")
        shutil.copyfile(lib_tmp, staged)
        os.replace(staged, target)
    link = out / "libcuda.so"
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(CUDA_LIBRARY)
    _build_nvml(out, flags, cc)
    return target


NVML_LIBRARY = "libnvidia-ml.so.1"


def _build_nvml(out: Path, flags: list[str], cc: str) -> Path:
    """libnvidia-ml.so.1 beside libcuda.so.1, answering through it (no session of its own)."""
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name) / NVML_LIBRARY
        script = Path(tmp_name) / "nvml.map"
        script.write_text("{\n  global: nvml*;\n  local: *;\n};\n")
        _run(
            [
                cc, *flags, "-shared", f"-Wl,-soname,{NVML_LIBRARY}",
                f"-Wl,--version-script={script}", "-Wl,-z,defs", "-Wl,-rpath,$ORIGIN",
                "-o", str(tmp), str(NATIVE / "nvml_front.c"),
                f"-L{out}", f"-l:{CUDA_LIBRARY}", "-pthread",
            ]
        )  # fmt: skip
        target = out / NVML_LIBRARY
        staged = out / (NVML_LIBRARY + ".new")
        shutil.copyfile(tmp, staged)
        os.replace(staged, target)
    return target
