// Byte copies between buffers inside a task body: concats, and reshapes that change nothing
// but the shape.
#pragma once

#include <stdint.h>

#include "mk/cuda_kernels.h"

namespace mk {
namespace gpu {

struct CopyPart {
  const void* src;
  int64_t run;  // bytes per outer row
};

// dst row o = part 0 row o, part 1 row o, ... for o < outer (a concat, or with one part and one
// row a reshape). Plain loads: the sources may have been written earlier in this launch.
// All threads; 16-byte vectors, four in flight per thread, when everything is aligned.
__device__ inline void concat_runs(void* dst, const CopyPart* parts, int n, int64_t outer) {
  int64_t total = 0;
  bool vec = (reinterpret_cast<uintptr_t>(dst) & 15) == 0;
  for (int i = 0; i < n; ++i) {
    total += parts[i].run;
    vec = vec && parts[i].run % 16 == 0 && (reinterpret_cast<uintptr_t>(parts[i].src) & 15) == 0;
  }
  const int64_t unit = vec ? 16 : 1, row = total / unit, count = outer * row;
  const bool narrow = count <= 0xffffffffLL;  // 32-bit index math (see u32) when it fits
  const int64_t step = blockDim.x;
  for (int64_t e0 = threadIdx.x; e0 < count; e0 += 4 * step) {
    uint4 v[4];
    int64_t at[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int64_t e = e0 + u * step;
      at[u] = -1;
      if (e >= count) continue;
      const int64_t o = narrow ? u32(e) / u32(row) : e / row;
      int64_t c = (narrow ? u32(e) % u32(row) : e % row) * unit;
      int i = 0;
      while (c >= parts[i].run) c -= parts[i++].run;
      const unsigned char* src = static_cast<const unsigned char*>(parts[i].src) + o * parts[i].run + c;
      if (vec) {
        v[u] = *reinterpret_cast<const uint4*>(src);
      } else {
        v[u].x = *src;
      }
      at[u] = e * unit;
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      if (at[u] < 0) continue;
      unsigned char* out = static_cast<unsigned char*>(dst) + at[u];
      if (vec) {
        *reinterpret_cast<uint4*>(out) = v[u];
      } else {
        *out = static_cast<unsigned char>(v[u].x);
      }
    }
  }
  __syncthreads();
}

}  // namespace gpu
}  // namespace mk
