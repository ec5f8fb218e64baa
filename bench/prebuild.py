"""Builds the CUDA modules that later benchmark commands load, in parallel, into the compile cache.

Usage: python bench/prebuild.py [--jobs N] SPEC...
  bench:FILTER              bench.py's workloads whose name contains FILTER ("" for all)
  step:PRESET:LAYERS:BATCH  timeline.py --model PRESET --layers LAYERS --batch BATCH
  gen:PRESET:BATCH[:STEPS]  mk-generate --model PRESET --batch BATCH --steps STEPS (default 8),
                            context 1,024, one launch for all steps
Each build compiles the same text with the same options as the command it stands for (pass
options from MK_PASS_OPTIONS, switches from the MK_CUDA_* environment, the cache from
MK_CACHE_DIR), so that command then finds its module in the cache instead of running nvcc. nvcc
takes one core; a GPU machine's other cores would idle while one command builds its modules in
turn. Needs torch (bench.py imports it), not a GPU.
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def texts_of(spec: str) -> list[tuple[str, str]]:
    """(name, nn text) of every program a SPEC stands for; ValueError on a malformed one."""
    kind, _, rest = spec.partition(":")
    fields = rest.split(":")
    if kind == "bench":
        from bench import workloads

        return [(n, t) for n, t in workloads().items() if rest in n]
    if kind == "step" and len(fields) == 3:
        from timeline import model_workload

        return [model_workload(fields[0], int(fields[1]), int(fields[2]))]
    if kind == "gen" and len(fields) in (2, 3):
        from mk.models import decode_program, preset

        steps = int(fields[2]) if len(fields) == 3 else 8
        name = f"{fields[0]} B{fields[1]} steps {steps}"
        return [(name, decode_program(preset(fields[0]), int(fields[1]), 1024, steps))]
    raise ValueError(f"prebuild: cannot read {spec!r} (bench:F, step:P:L:B or gen:P:B[:S])")


def build(name: str, text: str) -> str:
    import mk
    from bench import pass_options

    start = time.perf_counter()
    prog = mk.compile(text, target="cuda", **pass_options())
    hit = "cached" if getattr(prog, "cache_hit", False) else "built"
    return f"{name}: {hit} in {time.perf_counter() - start:.1f} s"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=8)
    parser.add_argument("specs", nargs="+")
    args = parser.parse_args()
    try:
        jobs = [job for spec in args.specs for job in texts_of(spec)]
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    failed = 0
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = {pool.submit(build, n, t): n for n, t in jobs}
        for future in as_completed(futures):
            try:
                print(future.result(), flush=True)
            except Exception as e:  # noqa: BLE001 - one failed build must not hide the others
                failed += 1
                print(f"{futures[future]}: failed ({type(e).__name__}: {e})", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
