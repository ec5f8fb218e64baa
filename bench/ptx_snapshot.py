"""The default build's CUDA source and PTX of the examples and of 2-layer model presets, saved or
compared: a change meant to leave the default's device code alone (retiring an opt-in switch,
tidying a header) shows here as no difference but in symbol names.

Usage: python bench/ptx_snapshot.py save DIR [--only NAME]...
       python bench/ptx_snapshot.py compare DIR [--only NAME]...
`save` writes DIR/<program>.cu and DIR/<program>.ptx; `compare` builds them again and names each
program whose PTX differs (exit 1), and those whose source differs (a #define or a comment moved:
not a failure). Mangled names (template arguments, the anonymous namespace's hash), register
numbers and labels are left out of the comparison. Build switches come from the environment, as
for any build. Needs nvcc, not a GPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# (preset, batch) decode steps of two layers, context 1,024, 8 steps a launch.
PRESETS = [("qwen3-0.6b", 1), ("qwen3-0.6b", 8), ("llama-3.2-1b", 1)]
_VOLATILE = [
    (re.compile(r"_Z[A-Za-z0-9_$]+"), "SYM"),
    (re.compile(r"%(p|r|rs|rd|f)[0-9]+"), r"%\1N"),
    (re.compile(r"\$?L__[A-Za-z0-9_]+"), "LABEL"),
]


def programs(only: Sequence[str]) -> dict[str, str]:
    """Name → nn text of every program the snapshot covers (those named in `only`, if any)."""
    from mk.models.build import decode_program
    from mk.models.config import preset

    examples = {p.stem: p for p in sorted((ROOT / "examples").glob("*.mlir"))}
    names = [*examples, *(f"{name}_b{batch}" for name, batch in PRESETS)]
    if unknown := [n for n in only if n not in names]:
        raise SystemExit(f"ptx_snapshot: no program {unknown[0]!r}; there are {', '.join(names)}")
    texts = {}
    for name, path in examples.items():
        if not only or name in only:
            texts[name] = path.read_text()
    for name, batch in PRESETS:
        if not only or f"{name}_b{batch}" in only:
            cfg = dataclasses.replace(preset(name), layers=2)
            texts[f"{name}_b{batch}"] = decode_program(cfg, batch, 1024, 8)
    return texts


def sources(texts: dict[str, str], cache: Path) -> dict[str, str]:
    """The emitted CUDA of each program, nvcc hidden (the source only). One at a time: lowering
    is serialised anyway (mk.dialects.mugraph_builder)."""
    import mk
    import mk.backends.cuda as backend
    from mk.backends.cuda import build

    found = build.nvcc
    build.nvcc = backend.nvcc = lambda: None  # type: ignore[assignment]
    try:
        return {
            name: mk.compile(text, target="cuda", num_sms=132, cache_dir=cache).cuda_source  # type: ignore[attr-defined]
            for name, text in texts.items()
        }
    finally:
        build.nvcc = backend.nvcc = found  # type: ignore[assignment]


def ptx_of(source: str, work: Path) -> str:
    """nvcc's PTX of one emitted megakernel, with the build's own flags."""
    from mk.backends.cuda import build

    compiler = build.nvcc()
    if compiler is None:
        raise SystemExit("ptx_snapshot: nvcc was not found")
    cu, ptx = work / "mk.cu", work / "mk.ptx"
    cu.write_text(source)
    flags = [f for f in build.NVCC_FLAGS if f not in ("-shared", "-Xcompiler", "-fPIC")]
    include = f"-I{build.cuda_include_dir()}"
    subprocess.run([str(compiler), *flags, include, "-ptx", str(cu), "-o", str(ptx)], check=True)
    return ptx.read_text()


def snapshot(only: Sequence[str]) -> dict[str, tuple[str, str]]:
    """Name → (CUDA source, PTX) of every program."""
    with tempfile.TemporaryDirectory(prefix="mk-ptx-") as tmp:
        srcs = sources(programs(only), Path(tmp) / "cache")

        def one(item: tuple[str, str]) -> tuple[str, tuple[str, str]]:
            name, source = item
            work = Path(tmp) / name
            work.mkdir()
            return name, (source, ptx_of(source, work))

        with ThreadPoolExecutor(4) as pool:
            return dict(pool.map(one, srcs.items()))


def normalised(ptx: str) -> str:
    for pattern, repl in _VOLATILE:
        ptx = pattern.sub(repl, ptx)
    return ptx


def compare(saved: Path, now: dict[str, tuple[str, str]]) -> int:
    """Prints what differs from `saved`; 1 where some PTX does (or a program is missing)."""
    failed = 0
    for name, (source, ptx) in now.items():
        old_ptx, old_cu = saved / f"{name}.ptx", saved / f"{name}.cu"
        if not old_ptx.is_file():
            print(f"{name}: not in {saved}")
            failed = 1
            continue
        if normalised(old_ptx.read_text()) != normalised(ptx):
            print(f"{name}: PTX differs")
            failed = 1
        elif old_cu.is_file() and old_cu.read_text() != source:
            print(f"{name}: same PTX, other source")
        else:
            print(f"{name}: same")
    return failed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("save", "compare"))
    parser.add_argument("dir", type=Path)
    parser.add_argument("--only", action="append", default=[], help="a program's name")
    args = parser.parse_args(argv)
    now = snapshot(args.only)
    if args.action == "compare":
        return compare(args.dir, now)
    args.dir.mkdir(parents=True, exist_ok=True)
    for name, (source, ptx) in now.items():
        (args.dir / f"{name}.cu").write_text(source)
        (args.dir / f"{name}.ptx").write_text(ptx)
    print(f"{len(now)} programs saved in {args.dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
