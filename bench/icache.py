"""How much code an SM's instruction cache keeps, and how fast code runs that does not fit.

A megakernel task body runs once per layer per SM, so the code it executes may come from L2 each
time. This builds a standalone CUDA program (nvcc, no mk) whose kernel calls straight-line FFMA
functions of a given total size in turn, four passes, on one CTA of 256 threads per SM, and
prints for each size the time of the first pass of the last of three launches (which finds
what the launches before it left in the caches) and the mean of the later passes: the same
while the code fits, slower once it does not.

    python bench/icache.py [--sizes 8,16,...] [--funcs 4] [--arch 90a]
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
from pathlib import Path

_FFMA_BYTES = 16  # one SASS instruction
_PER_STEP = 4  # FFMA per step: four independent chains


def function_source(name: str, kb: int, salt: int) -> str:
    """A __noinline__ function of about `kb` KB of straight-line FFMA on four chains."""
    steps = kb * 1024 // _FFMA_BYTES // _PER_STEP
    lines = [
        f"__device__ __noinline__ float {name}(float a, float b, float c, float d) {{",
    ]
    for i in range(steps):
        k = 1.0 + ((i * 7 + salt) % 97) * 1e-6
        lines.append(
            f"  a = fmaf(a, {k:.7f}f, b); b = fmaf(b, {k:.7f}f, c); "
            f"c = fmaf(c, {k:.7f}f, d); d = fmaf(d, {k:.7f}f, a);"
        )
    lines.append("  return a + b + c + d;")
    lines.append("}")
    return "\n".join(lines)


def program_source(kb: int, funcs: int, passes: int) -> str:
    """The kernel: `funcs` functions of kb/funcs KB each, called in turn, `passes` times; thread
    0 of each CTA records the clock after each pass."""
    per = max(1, kb // funcs)
    parts = ["#include <cstdio>", "#include <cstdint>", "#include <vector>"]
    parts += [function_source(f"f{i}", per, i) for i in range(funcs)]
    calls = " ".join(f"x = f{i}(x, y, x * 0.5f, y * 0.25f);" for i in range(funcs))
    parts.append(
        f"""
__device__ inline long long stamp() {{
  long long t;
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(t)::"memory");
  return t;
}}

__global__ void __launch_bounds__(256, 1) run(float* out, long long* clocks) {{
  // The volatile store before each stamp keeps the arithmetic inside the timed span.
  __shared__ volatile float sink[256];
  float x = threadIdx.x * 1e-3f, y = blockIdx.x * 1e-3f;
  for (int p = 0; p < {passes}; ++p) {{
    __syncthreads();
    const long long t0 = stamp();
    // x and y now depend on t0: the functions cannot start before it.
    asm volatile("mov.b32 %0, %0;" : "+f"(x) : "l"(t0));
    asm volatile("mov.b32 %0, %0;" : "+f"(y) : "l"(t0));
    {calls}
    sink[threadIdx.x] = x;
    __syncthreads();
    const long long t1 = stamp();
    if (threadIdx.x == 0) clocks[blockIdx.x * {passes} + p] = t1 - t0;
    y = sink[(threadIdx.x + 1) & 255];
  }}
  out[blockIdx.x * blockDim.x + threadIdx.x] = x;
}}

int main() {{
  int sms = 0, khz = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0);
  float* out; long long* clocks;
  cudaMalloc(&out, sms * 256 * sizeof(float));
  cudaMalloc(&clocks, sms * {passes} * sizeof(long long));
  for (int rep = 0; rep < 3; ++rep) run<<<sms, 256>>>(out, clocks);  // the last launch is measured
  if (cudaDeviceSynchronize() != cudaSuccess) {{ printf("error\\n"); return 1; }}
  std::vector<long long> h(sms * {passes});
  cudaMemcpy(h.data(), clocks, h.size() * sizeof(long long), cudaMemcpyDeviceToHost);
  double first = 0, rest = 0;
  for (int s = 0; s < sms; ++s) {{
    first += h[s * {passes}];
    for (int p = 1; p < {passes}; ++p) rest += h[s * {passes} + p];
  }}
  first /= sms; rest /= sms * ({passes} - 1);
  printf("%d %d %.1f %.1f %d\\n", {kb}, {funcs}, first, rest, khz);
  return 0;
}}
"""
    )
    return "\n".join(parts)


def measure(kb: int, funcs: int, work: Path, arch: str) -> str:
    src = work / f"icache_{kb}_{funcs}.cu"
    exe = work / f"icache_{kb}_{funcs}"
    src.write_text(program_source(kb, funcs, passes=4))
    subprocess.run(
        ["nvcc", "-O3", f"-gencode=arch=compute_{arch},code=sm_{arch}", "-o", str(exe), str(src)],
        check=True,
    )
    return subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.strip()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="4,8,16,32,48,64,96,128,160,192,256")
    ap.add_argument("--funcs", type=int, default=4)
    ap.add_argument("--arch", default="90a")
    args = ap.parse_args()
    print("| code KB | functions | first pass µs | later pass µs | cold KB/µs | warm KB/µs |")
    print("|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for kb in (int(s) for s in args.sizes.split(",")):
            size, funcs, first, rest, khz = measure(kb, args.funcs, Path(tmp), args.arch).split()
            us = 1e3 / float(khz)  # µs per clock
            t0, t1 = float(first) * us, float(rest) * us
            print(f"| {size} | {funcs} | {t0:.2f} | {t1:.2f} | {kb / t0:.1f} | {kb / t1:.1f} |")


if __name__ == "__main__":
    main()
