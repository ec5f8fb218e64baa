"""How fast one SM runs a decode task's product (mk::gpu::stream_rows) with its weights in HBM
or in L2.

A decode linear task reduces `rows` weight rows of `k` bf16 columns against one activation row.
In the megakernel its weight segment took 4.2 µs from HBM and 2.8 µs from L2 for 96 KB, and
3.65 µs with the weights staged in shared memory ahead of time (bench/RESULTS.md), where the
instruction issue alone would allow ~0.5 µs. This builds a standalone CUDA program around the
real header (no megakernel, no events) that times the same call, one CTA of 256 threads per SM,
all SMs at once or one:

- `hbm`: each repetition reads another slab (the buffer is larger than the L2);
- `l2`: every repetition reads the same slab (the first warms the L2).

(Its `smem` and `generic` modes, the slab read from shared memory, went with the staging ring
that they measured: bench/RESULTS.md keeps their numbers.)

For each template choice (RG rows at a time, S 256-column steps in flight) it prints the median
µs per task over the SMs and repetitions after the first (the global timer's wall time: before
2026-12-02 these were cycles over the nominal clock, which overstate the speed when the SMs run
slower under load), and the bytes per µs of one SM.

    python bench/product.py [--rows 48] [--k 1024] [--shapes 6x4,3x4,6x2] [--ctas all|1]
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
from pathlib import Path

MODES = ("hbm", "l2")
THREADS = 256
REPS = 8


def kernel_source(mode: str, rows: int, k: int, rg: int, s: int) -> str:
    """One kernel: REPS timed calls of stream_rows<1, rg, s> on this CTA's slab."""
    slab = rows * k
    # hbm: repetition r of CTA b reads slab r * gridDim.x + b; l2: slab b every time.
    pick = "(rep * gridDim.x + blockIdx.x)" if mode == "hbm" else "blockIdx.x"
    return f"""
__global__ void __launch_bounds__({THREADS}, 1)
run_{mode}(const uint16_t* w, float* sums, long long* clocks) {{
  float* xs = reinterpret_cast<float*>(mk::gpu::mk_dynamic_smem);
  for (int i = threadIdx.x; i < {k}; i += blockDim.x) xs[i] = 1e-3f * static_cast<float>(i % 7 + 1);
  const int warps = blockDim.x >> 5, warp = threadIdx.x >> 5;
  const int per_warp = ({rows} + warps - 1) / warps;
  const int begin = warp * per_warp, end = begin + per_warp < {rows} ? begin + per_warp : {rows};
  for (int rep = 0; rep < {REPS}; ++rep) {{
    const uint16_t* slab = w + static_cast<int64_t>({pick}) * {slab};
    mk::gpu::StreamLinear sl{{}};
    sl.w_dtype = mk::DTYPE_BF16;
    sl.k = {k};
    sl.kc = {k};
    sl.nw = 1;
    sl.assign = true;
    sl.w[0] = mk::gpu::StreamWeight{{slab, {k}, {rows}, sums + blockIdx.x * {rows}}};
    __syncthreads();
    const long long t0 = mk::gpu::mark_clock();  // ns: cycles run slow under load
    mk::gpu::stream_rows<1, {rg}, {s}, true>(sl, xs, {k}, {k}, 0, begin, end, sl.assign);
    __syncthreads();
    const long long t1 = mk::gpu::mark_clock();
    if (threadIdx.x == 0) clocks[blockIdx.x * {REPS} + rep] = t1 - t0;
  }}
}}
"""


def program_source(rows: int, k: int, rg: int, s: int) -> str:
    """The kernels (one per mode) and a main that runs each on `ctas` CTAs (argv[1]; 0: one per SM) and
    prints `mode median_ns`."""
    kernels = "".join(kernel_source(m, rows, k, rg, s) for m in MODES)
    smem = k * 4
    slabs = f"static_cast<size_t>({REPS}) * ctas * {rows * k}"
    launches = "".join(
        f"""
  cudaFuncSetAttribute(run_{m}, cudaFuncAttributeMaxDynamicSharedMemorySize, {smem});
  for (int launch = 0; launch < 2; ++launch) {{
    cudaMemset(scratch, launch, kScratch);  // evicts the L2: the hbm slabs come from HBM
    run_{m}<<<ctas, {THREADS}, {smem}>>>(w, sums, clocks);
  }}
  report("{m}", clocks, ctas);"""
        for m in MODES
    )
    return f"""#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include "mk/cuda_stream.cuh"
{kernels}
static void report(const char* mode, long long* clocks, int ctas) {{
  if (cudaDeviceSynchronize() != cudaSuccess) {{ printf("%s error\\n", mode); exit(1); }}
  std::vector<long long> h(static_cast<size_t>(ctas) * {REPS});
  cudaMemcpy(h.data(), clocks, h.size() * sizeof(long long), cudaMemcpyDeviceToHost);
  std::vector<long long> later;  // repetition 0 pays for what the others find warm
  for (int b = 0; b < ctas; ++b)
    for (int r = 1; r < {REPS}; ++r) later.push_back(h[b * {REPS} + r]);
  std::nth_element(later.begin(), later.begin() + later.size() / 2, later.end());
  printf("%s %lld\\n", mode, later[later.size() / 2]);
}}

int main(int argc, char** argv) {{
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  const int ctas = argc > 1 && atoi(argv[1]) > 0 ? atoi(argv[1]) : sms;
  uint16_t* w; float* sums; long long* clocks;
  cudaMalloc(&w, {slabs} * sizeof(uint16_t));
  cudaMemset(w, 0x3c, {slabs} * sizeof(uint16_t));  // bf16 0x3c3c: 0.0115, not zero
  cudaMalloc(&sums, static_cast<size_t>(ctas) * {rows} * sizeof(float));
  cudaMalloc(&clocks, static_cast<size_t>(ctas) * {REPS} * sizeof(long long));
  const size_t kScratch = size_t{{256}} << 20;  // several times the L2
  void* scratch;
  cudaMalloc(&scratch, kScratch);{launches}
  return 0;
}}
"""


def shapes(text: str) -> list[tuple[int, int]]:
    """ "6x4,3x4" -> [(6, 4), (3, 4)]: RG x S."""
    return [(int(a), int(b)) for a, b in (item.split("x") for item in text.split(","))]


def measure(rows: int, k: int, rg: int, s: int, ctas: int, work: Path, include: Path) -> str:
    src, exe = work / f"product_{rg}x{s}.cu", work / f"product_{rg}x{s}"
    src.write_text(program_source(rows, k, rg, s))
    subprocess.run(
        ["nvcc", "-O3", "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a",
         "--expt-relaxed-constexpr", f"-I{include}", "-o", str(exe), str(src)],
        check=True,
    )  # fmt: skip
    return subprocess.run([str(exe), str(ctas)], check=True, capture_output=True, text=True).stdout


def main() -> None:
    from mk.backends.cpu.build import include_dir

    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--rows", type=int, default=48, help="weight rows per task (default 48)")
    ap.add_argument("--k", type=int, default=1024, help="columns (default 1024)")
    ap.add_argument("--shapes", default="6x4,3x4,6x2,2x4", help="RGxS choices")
    ap.add_argument("--ctas", default="all", help="all (one per SM) or a number")
    args = ap.parse_args()
    ctas = 0 if args.ctas == "all" else int(args.ctas)
    kb = args.rows * args.k * 2 / 1024
    print(f"{args.rows} rows x {args.k} columns ({kb:.0f} KB) per task, CTAs: {args.ctas}")
    print("| RG x S | " + " | ".join(f"{m} µs | {m} GB/s per SM" for m in MODES) + " |")
    print("|---|" + "---:|---:|" * len(MODES))
    with tempfile.TemporaryDirectory() as tmp:
        for rg, s in shapes(args.shapes):
            out = measure(args.rows, args.k, rg, s, ctas, Path(tmp), include_dir())
            cells = []
            for line in out.split("\n"):
                if line.strip():
                    _, ns = line.split()
                    us = float(ns) / 1e3
                    cells += [f"{us:.2f}", f"{kb * 1.024 / us:.1f}"]
            print(f"| {rg} x {s} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
