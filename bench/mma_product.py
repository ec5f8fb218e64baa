"""How fast one SM runs a batch-M decode task's tensor-core product (mk::gpu::mma_chunk) with its
weights in HBM: the weight fragments loaded straight into registers, or copied through each
warp's cp.async ring of D stages (mma_ring_walk).

A standalone CUDA program around the real header (no megakernel, no events): one CTA of 256
threads per SM, every SM at once, each repetition reading another slab (the buffer is larger
than the L2). Prints the median µs per task over the SMs and repetitions after the first, the
bytes per µs of one SM, and the largest difference of the sums from the register variant's.
Times are the global timer's (ns); before 2026-12-02 they were cycles over the nominal clock,
which overstate the speed when the SMs run slower under load.

    python bench/mma_product.py [--m 8] [--rows 224] [--k 4096] [--rings 2,3,4]
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
from pathlib import Path

THREADS = 256
REPS = 6
LOADS = 16  # the register variant's 32-column steps in flight (stream.py's MMA_LOADS)


def kernel_source(name: str, m: int, rows: int, k: int, ring: int) -> str:
    """REPS timed calls of mma_chunk on this CTA's slabs, then one untimed call on slab 0 of
    this CTA into `check`."""
    return f"""
__global__ void __launch_bounds__({THREADS}, 1)
run_{name}(const uint16_t* w, float* sums, float* check, long long* clocks) {{
  uint16_t* xs = reinterpret_cast<uint16_t*>(mk::gpu::mk_dynamic_smem);
  uint16_t* ring = reinterpret_cast<uint16_t*>(mk::gpu::mk_dynamic_smem + {(m * k * 2 + 127) // 128 * 128});
  for (int i = threadIdx.x; i < {m * k}; i += blockDim.x) {{
    xs[i] = static_cast<uint16_t>(mk::gpu::pack2(1e-2f * static_cast<float>(i % 13 - 6), 0.0f, true));
  }}
  for (int rep = 0; rep <= {REPS}; ++rep) {{
    const bool last = rep == {REPS};
    const uint16_t* slab = w + static_cast<int64_t>(last ? blockIdx.x : rep * gridDim.x + blockIdx.x) * {rows * k};
    float* out = (last ? check : sums) + blockIdx.x * {m * rows};
    for (int i = threadIdx.x; i < {m * rows}; i += blockDim.x) out[i] = 0.0f;
    mk::gpu::StreamLinear sl{{}};
    sl.w_dtype = mk::DTYPE_BF16;
    sl.k = {k};
    sl.kc = {k};
    sl.nw = 1;
    sl.w[0] = mk::gpu::StreamWeight{{slab, {k}, {rows}, out}};
    __syncthreads();
    const long long t0 = mk::gpu::mark_clock();  // ns: cycles run slow under load
    mk::gpu::mma_chunk<{m}, {LOADS}, {ring}>(sl, xs, {k}, {k}, 0, {rows}, ring);
    __syncthreads();
    const long long t1 = mk::gpu::mark_clock();
    if (threadIdx.x == 0 && !last) clocks[blockIdx.x * {REPS} + rep] = t1 - t0;
  }}
}}
"""


SMEM_MAX = 227 << 10  # dynamic shared memory a Hopper CTA may opt into


def smem_bytes(m: int, k: int, rings: list[int]) -> int:
    """The packed activation rows, then the deepest ring (mk::gpu::ring_bytes)."""
    return (m * k * 2 + 127) // 128 * 128 + 8 * max(rings, default=0) * 8 * 256 * 2


def program_source(m: int, rows: int, k: int, rings: list[int]) -> str:
    """The kernels (registers, then one per ring depth) and a main that runs each on every SM
    and prints `name median_ns max_diff max_sum`."""
    variants = [("regs", 0)] + [(f"ring{d}", d) for d in rings]
    kernels = "".join(kernel_source(n, m, rows, k, d) for n, d in variants)
    smem = smem_bytes(m, k, rings)
    slabs = f"static_cast<size_t>({REPS}) * sms * {rows * k}"
    launches = "".join(
        f"""
  cudaFuncSetAttribute(run_{n}, cudaFuncAttributeMaxDynamicSharedMemorySize, {smem});
  for (int launch = 0; launch < 2; ++launch) {{
    cudaMemset(scratch, launch, kScratch);  // evicts the L2: the slabs come from HBM
    run_{n}<<<sms, {THREADS}, {smem}>>>(w, sums, check + {i} * per, clocks);
  }}
  report("{n}", clocks, sms, check, check + {i} * per, per);"""
        for i, (n, _) in enumerate(variants)
    )
    return f"""#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include "mk/cuda_stream.cuh"
{kernels}
static void report(const char* name, long long* clocks, int sms, float* base, float* mine, size_t per) {{
  if (cudaDeviceSynchronize() != cudaSuccess) {{ printf("%s error\\n", name); exit(1); }}
  std::vector<long long> h(static_cast<size_t>(sms) * {REPS});
  cudaMemcpy(h.data(), clocks, h.size() * sizeof(long long), cudaMemcpyDeviceToHost);
  std::vector<long long> later;  // repetition 0 pays for what the others find warm
  for (int b = 0; b < sms; ++b)
    for (int r = 1; r < {REPS}; ++r) later.push_back(h[b * {REPS} + r]);
  std::nth_element(later.begin(), later.begin() + later.size() / 2, later.end());
  std::vector<float> a(per), b(per);
  cudaMemcpy(a.data(), base, per * sizeof(float), cudaMemcpyDeviceToHost);
  cudaMemcpy(b.data(), mine, per * sizeof(float), cudaMemcpyDeviceToHost);
  double diff = 0, scale = 0;
  for (size_t i = 0; i < per; ++i) {{
    diff = std::max(diff, static_cast<double>(std::fabs(a[i] - b[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(a[i])));
  }}
  printf("%s %lld %.3g %.3g\\n", name, later[later.size() / 2], diff, scale);
}}

int main() {{
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  uint16_t* w; float* sums; float* check; long long* clocks;
  cudaMalloc(&w, {slabs} * sizeof(uint16_t));
  // Not zero, and not one value: a pattern of bf16 values in [-1, 1).
  std::vector<uint16_t> pattern(1 << 20);
  for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<uint16_t>(0x3c00 + (i * 2654435761u >> 20) % 0x300) | ((i & 1) << 15);
  for (size_t at = 0; at < {slabs}; at += pattern.size()) {{
    const size_t n = std::min(pattern.size(), {slabs} - at);
    cudaMemcpy(w + at, pattern.data(), n * sizeof(uint16_t), cudaMemcpyHostToDevice);
  }}
  const size_t per = static_cast<size_t>(sms) * {m * rows};
  cudaMalloc(&sums, per * sizeof(float));
  cudaMalloc(&check, {len(variants)} * per * sizeof(float));
  cudaMalloc(&clocks, static_cast<size_t>(sms) * {REPS} * sizeof(long long));
  const size_t kScratch = size_t{{256}} << 20;  // several times the L2
  void* scratch;
  cudaMalloc(&scratch, kScratch);{launches}
  return 0;
}}
"""


def main() -> None:
    from mk.backends.cpu.build import include_dir

    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--m", type=int, default=8, help="activation rows (2..16)")
    ap.add_argument("--rows", type=int, default=224, help="weight rows per task")
    ap.add_argument("--k", type=int, default=4096, help="columns")
    ap.add_argument("--rings", default="2,3,4", help="ring depths to time beside the registers")
    ap.add_argument(
        "--define", action="append", default=[], help="a macro for the build, e.g. MK_MMA_PIPE"
    )
    args = ap.parse_args()
    rings = [int(d) for d in args.rings.split(",") if d]
    if smem_bytes(args.m, args.k, rings) > SMEM_MAX:
        raise SystemExit(
            f"M={args.m} x K={args.k} packed plus a {max(rings)}-stage ring take "
            f"{smem_bytes(args.m, args.k, rings) >> 10} KB of shared memory, more than "
            f"{SMEM_MAX >> 10} KB: fewer stages or a smaller K"
        )
    kb = args.rows * args.k * 2 / 1024
    print(f"M={args.m}, {args.rows} rows x {args.k} columns ({kb:.0f} KB) per task, every SM")
    print("| variant | µs | GB/s per SM | max diff / max sum |")
    print("|---|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = Path(tmp) / "mma.cu", Path(tmp) / "mma"
        src.write_text(program_source(args.m, args.rows, args.k, rings))
        subprocess.run(
            ["nvcc", "-O3", "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a",
             "--expt-relaxed-constexpr", f"-I{include_dir()}",
             *(f"-D{d}" for d in args.define), "-o", str(exe), str(src)],
            check=True,
        )  # fmt: skip
        out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    for line in out.splitlines():
        name, ns, diff, scale = line.split()
        us = float(ns) / 1e3
        print(
            f"| {name} | {us:.2f} | {kb * 1.024 / us:.1f} | {float(diff):.2e} / {float(scale):.2e} |"
        )


if __name__ == "__main__":
    main()
