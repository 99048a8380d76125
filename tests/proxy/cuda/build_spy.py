"""Build tests/proxy/cuda/etbl_spy.c into OUT/libcuda.so.1 (a diagnosis tool for the GPU
host: see that file). Every name of the proxy's cuda_symbols.txt is exported and jumps to
NVIDIA's function of that name; the spy defines cuGetProcAddress(_v2) and cuGetExportTable.

    python3 tests/proxy/cuda/build_spy.py OUT
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
NATIVE = HERE.parents[2] / "hipr" / "proxy" / "native"
OWN = {"cuGetProcAddress", "cuGetProcAddress_v2", "cuGetExportTable"}


def forwarders() -> str:
    """C (with top-level asm) for one jump per forwarded name, through hipr_spy_fwd."""
    names = [
        n
        for n in (ln.strip() for ln in (NATIVE / "cuda_symbols.txt").read_text().splitlines())
        if n and not n.startswith("#") and n not in OWN
    ]
    out = [
        "#include <stddef.h>\n",
        f'__attribute__((visibility("hidden"))) void *hipr_spy_fwd[{len(names)}];\n',
        f"const size_t hipr_spy_count = {len(names)};\n",
        "const char *const hipr_spy_names[] = {\n",
        *(f'    "{n}",\n' for n in names),
        "};\n",
    ]
    for i, n in enumerate(names):
        out.append(
            f'__asm__(".globl {n}\\n.type {n},@function\\n{n}:\\n'
            f'jmp *hipr_spy_fwd+{8 * i}(%rip)\\n");\n'
        )
    return "".join(out)


def main(out: Path) -> Path:
    """Compile the spy into ``out`` and return the library's path."""
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        gen = Path(tmp) / "spy_fwd.c"
        gen.write_text(forwarders())
        lib = out / "libcuda.so.1"
        script = Path(tmp) / "spy.map"
        script.write_text("{\n  global: cu*;\n  local: *;\n};\n")
        subprocess.run(
            [
                "cc", "-std=gnu11", "-O1", "-g", "-fPIC", "-shared", f"-I{NATIVE}",
                "-Wl,-soname,libcuda.so.1", f"-Wl,--version-script={script}",
                str(HERE / "etbl_spy.c"), str(gen), str(NATIVE / "cuda_trace.c"),
                "-o", str(lib), "-ldl", "-pthread",
            ],
            check=True,
        )  # fmt: skip
    return lib


if __name__ == "__main__":
    print(main(Path(sys.argv[1])))
