"""GPU benchmark: mk vs PyTorch eager vs PyTorch + CUDA graph vs the floor, side by side in one run.

floor = bytes that must move (every input, weight and output once) / measured device copy bandwidth;
one read = one PyTorch reduction over as many bytes, what a single kernel that only reads them
takes at that size (its launch, ramp and tail included).
Each timing is the median of >= 50 runs measured with CUDA events after warm-up, on random data.
mk is timed as PyTorch + CUDA graph is: its launch captured in a CUDA graph and replayed (the
megakernel and its flag reset); its error is that of a checked call. Graph replays are timed as
device time: the GPU sleeps while the host submits the start event, the replay and the end event
(else a replay on an idle GPU also times the host's submission; --host-gaps times it that way).
PyTorch eager is timed as the host drives it.
Usage (on the GPU machine): python bench/bench.py [--runs 100] [--only NAME] [--out DIR] [--host-gaps]
                            [--baseline bench/baselines/h200.json]
With --baseline (an earlier run's bench.json) each row's change against it follows the table
(bench/baseline.py: ms on the same card, the ratio to the floor on another).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from xdsl.dialects.func import FuncOp

from mk.inputs import random_inputs, step_high
from mk.models.torch_reference import capture_graph, event_ms
from mk.source import entry_function, load_module

sys.path.insert(0, str(Path(__file__).resolve().parent))
import baseline  # noqa: E402
from torch_nn import torch_callable  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def rmsnorm_linear(b: int, n: int, k: int = 4096) -> str:
    x, w, y = f"tensor<{b}x{k}xbf16>", f"tensor<{n}x{k}xbf16>", f"tensor<{b}x{n}xbf16>"
    return f"""func.func @rmsnorm_linear(%x: {x}, %g: tensor<{k}xbf16>, %w: {w}) -> {y} {{
  %h = nn.rms_norm %x, %g {{epsilon = 1.0e-05 : f32}} : ({x}, tensor<{k}xbf16>) -> {x}
  %y = nn.linear %h, %w : ({x}, {w}) -> {y}
  func.return %y : {y}
}}"""


def gated_mlp(b: int, h: int = 4096, i: int = 14336) -> str:
    x, wi, wo, m = (
        f"tensor<{b}x{h}xbf16>",
        f"tensor<{i}x{h}xbf16>",
        f"tensor<{h}x{i}xbf16>",
        f"tensor<{b}x{i}xbf16>",
    )
    return f"""func.func @gated_mlp(%x: {x}, %wg: {wi}, %wu: {wi}, %wd: {wo}) -> {x} {{
  %g = nn.linear %x, %wg : ({x}, {wi}) -> {m}
  %u = nn.linear %x, %wu : ({x}, {wi}) -> {m}
  %s = nn.silu %g : ({m}) -> {m}
  %p = nn.mul %s, %u : ({m}, {m}) -> {m}
  %y = nn.linear %p, %wd : ({m}, {wo}) -> {x}
  func.return %y : {x}
}}"""


def workloads() -> dict[str, str]:
    w = {
        f"rmsnorm_linear B{b} 4096x{n}": rmsnorm_linear(b, n) for b in (1, 8) for n in (6144, 12288)
    }
    w |= {f"gated_mlp B{b} 4096-14336-4096": gated_mlp(b) for b in (1, 8)}
    w["llama3_8b_block B1 ctx1024"] = (ROOT / "examples/llama3_8b_block.mlir").read_text()
    return w


def to_torch(a: np.ndarray) -> torch.Tensor:
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16).cuda()
    return torch.from_numpy(a).cuda()


def median_ms(fn: Callable[[], object], runs: int, warmup: int = 10, queued: bool = False) -> float:
    """Median ms by CUDA events; `queued`: the device's time alone (mk.models.torch_reference.event_ms)."""
    return event_ms(fn, runs, warmup=warmup, queued=queued)


def copy_bandwidth(runs: int) -> float:
    """Device-to-device copy bandwidth in bytes/s (bytes read + bytes written)."""
    n = 1 << 30
    src, dst = (
        torch.empty(n, dtype=torch.uint8, device="cuda"),
        torch.empty(n, dtype=torch.uint8, device="cuda"),
    )
    ms = median_ms(lambda: dst.copy_(src), runs)
    return 2 * n / (ms * 1e-3)


def read_ms(moved: int, runs: int, queued: bool = True) -> float:
    """One PyTorch reduction (amax) over `moved` bytes of random bf16: what a kernel that only
    reads a workload's bytes once takes at its size, launch and ramp included, beside the floor
    (which a whole-GPU copy of 2 GB sets)."""
    buf = torch.randn(max(1, moved // 2), dtype=torch.bfloat16, device="cuda")
    return median_ms(capture_graph(lambda: buf.amax()), runs, queued=queued)


def pass_options() -> dict[str, int | str]:
    """MK_PASS_OPTIONS ("kv_splits=4+tile_n=64"): mk.compile keywords for an A/B build
    (`bench/on_gpu.sh ab` trees carry environment settings, not arguments)."""
    from mk.pipeline import parse_pass_options

    return parse_pass_options(os.environ.get("MK_PASS_OPTIONS", "").replace("+", " ").split())


def mk_runner(text: str, inputs: list[torch.Tensor]) -> tuple[Callable[[], object], object] | None:
    try:
        import mk

        prog = mk.compile(text, target="cuda", **pass_options())
    except Exception as e:  # noqa: BLE001 - the table says why mk did not run
        print(f"  mk: not run ({type(e).__name__}: {str(e).splitlines()[0][:100]})")
        return None
    outs = prog(*inputs)  # type: ignore[operator]
    return capture_graph(lambda: prog.launch(*inputs, out=outs)), prog  # type: ignore[attr-defined]


def max_error(outs: tuple[torch.Tensor, ...], refs: tuple[torch.Tensor, ...]) -> float:
    """Largest |mk − torch| / (1 + |torch|) over all outputs (NaN shows unwritten elements)."""
    worst = 0.0
    for o, r in zip(outs, refs, strict=True):
        o, r = o.double(), r.double()
        err = ((o - r).abs() / (1 + r.abs())).max().item()
        worst = max(worst, err) if err == err else float("nan")
    return worst


def at_full_context(fn: FuncOp, arrays: list[np.ndarray]) -> list[np.ndarray]:
    """Decode positions (nn.step bases) at their last valid value: every cache slot is read."""
    for i, arg in enumerate(fn.args):
        steps = [u.operation for u in arg.uses if u.operation.name == "nn.step"]
        if steps:
            arrays[i][...] = min(step_high(s) for s in steps) - 1
    return arrays


def bench_one(
    name: str, text: str, bandwidth: float, runs: int, queued: bool = True
) -> dict[str, object]:
    fn = entry_function(load_module(text))
    arrays = at_full_context(fn, random_inputs(fn, seed=0))
    inputs = [to_torch(a) for a in arrays]
    run = torch_callable(text)
    outs = run(*inputs)
    moved = sum(a.nbytes for a in arrays) + sum(o.numel() * o.element_size() for o in outs)
    row: dict[str, object] = {"workload": name, "bytes": moved, "floor_ms": moved / bandwidth * 1e3}
    row["read_ms"] = read_ms(moved, runs, queued)
    row["eager_ms"] = median_ms(lambda: run(*inputs), runs)
    row["graph_ms"] = median_ms(capture_graph(lambda: run(*inputs)), runs, queued=queued)
    mk_run = mk_runner(text, inputs)
    row["mk_ms"] = row["mk_error"] = None
    if mk_run is not None:
        launch, prog = mk_run
        row["mk_error"] = max_error(prog(*inputs), outs)  # type: ignore[operator]
        row["mk_ms"] = median_ms(launch, runs, queued=queued)
        prog.check()  # type: ignore[attr-defined]
    print(f"  {name}: {row}", flush=True)
    return row


def _fmt(value: object) -> str:
    return f"{value:.1e}" if isinstance(value, float) else "—"


def table(rows: list[dict[str, object]], bandwidth: float, commit: str, how: str, gpu: str) -> str:
    head = (
        f"### {datetime.date.today().isoformat()} — {gpu}, commit {commit}, copy bandwidth "
        f"{bandwidth / 1e12:.2f} TB/s (median of runs, CUDA events; graph replays {how})\n\n"
        "| workload | MB moved | floor ms | one read ms | mk ms | PyTorch eager ms | PyTorch + CUDA graph ms | mk / floor | mk error |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    )
    lines = []
    for r in rows:
        mk_ms = r["mk_ms"]
        mk_txt = f"{mk_ms:.4f}" if isinstance(mk_ms, float) else "—"
        read = r.get("read_ms")
        read_txt = f"{read:.4f}" if isinstance(read, float) else "—"
        ratio = f"{mk_ms / r['floor_ms']:.2f}×" if isinstance(mk_ms, float) else "—"  # type: ignore[operator]
        lines.append(
            f"| {r['workload']} | {r['bytes'] / 1e6:.1f} | {r['floor_ms']:.4f} | {read_txt} | {mk_txt} | "  # type: ignore[operator]
            f"{r['eager_ms']:.4f} | {r['graph_ms']:.4f} | {ratio} | {_fmt(r['mk_error'])} |"
        )
    return head + "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--only", default="")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--baseline", type=Path, default=None, help="an earlier run's bench.json to compare with"
    )
    parser.add_argument(
        "--host-gaps",
        action="store_true",
        help="time graph replays on an idle GPU, the host's submission included",
    )
    args = parser.parse_args()
    if args.runs < 50:
        parser.error("--runs: the method asks for at least 50 timed runs")
    commit = os.environ.get("MK_COMMIT") or (
        subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
        ).stdout.strip()
        or "unknown"
    )
    before = baseline.read(args.baseline) if args.baseline is not None else None
    bandwidth = copy_bandwidth(args.runs)
    queued = not args.host_gaps
    rows = [
        bench_one(n, t, bandwidth, args.runs, queued)
        for n, t in workloads().items()
        if args.only in n
    ]
    how = "as device time" if queued else "with the host's submission"
    device = torch.cuda.get_device_name(0)
    md = table(rows, bandwidth, commit, how, device)
    if before is not None:
        md += "\n" + baseline.report(rows, device, before)
    print(md)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bench.md").write_text(md)
        (args.out / "bench.json").write_text(
            json.dumps({"device": device, "bandwidth": bandwidth, "rows": rows}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
