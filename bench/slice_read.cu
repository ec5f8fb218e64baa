// The fused down projection's weight read (rows_dot_lanes, the accumulating gated MLP's
// epilogue) in its two layouts, on 128 CTAs at once as in a decode phase: each CTA's KC columns
// of every one of N rows of a [N][LD] row-major weight (a piece of KC·2 bytes every LD·2 bytes,
// the PyTorch layout), against the same bytes laid out so that each CTA's slice is contiguous
// ([CTA][N][KC], what a transposed or packed down weight gives). The question: does the strided
// read (qwen3-0.6b: 48 bytes every 6 KB, two sectors a piece) cost more than its bytes?
//
// Build and run on the GPU machine, from the project root:
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr
//        -Iruntime/include bench/slice_read.cu -o /tmp/slice_read && /tmp/slice_read
// Each launch runs kPasses passes separated by grid barriers (a decode phase each); a pass reads
// one of enough weight copies that the L2 holds none of them. Rows: the median over 30 launches
// (after 5) of the CUDA-event time a pass, and of the mean per-CTA time of a pass (globaltimer
// from the barrier's release to the CTA's products). The last lines check every layout's
// products against a float64 host sum.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "mk/cuda_rows_add.cuh"

constexpr int kCtas = 128;
constexpr int kPasses = 32;
constexpr int kLaunches = 30, kWarmup = 5;

#define CHECK(call)                                                               \
  do {                                                                            \
    cudaError_t e_ = (call);                                                      \
    if (e_ != cudaSuccess) {                                                      \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
      std::exit(1);                                                               \
    }                                                                             \
  } while (0)

__device__ unsigned long long g_pass_ns[kCtas];

__device__ inline unsigned long long now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}

// Every CTA arrives, then waits for all of them (the launch is cooperative, so all are resident).
__device__ inline void grid_barrier(unsigned* counter, unsigned target) {
  __syncthreads();
  if (threadIdx.x == 0) {
    asm volatile("fence.acq_rel.gpu;" ::: "memory");
    atomicAdd(counter, 1u);
    unsigned seen = 0;
    do {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(counter) : "memory");
    } while (seen < target);
  }
  __syncthreads();
}

// Contiguous: CTA b's slice at w + b·N·KC with rows KC apart; strided: at w + b·KC, rows LD apart.
template <int KC, int N, int LD, bool Contiguous, bool Packed>
__global__ void __launch_bounds__(mk::kCudaThreads, 1)
    slices(const uint16_t* w, int64_t copy_elems, int copies, const float* a, float* out,
           unsigned* counter) {
  __shared__ float sa[KC];
  __shared__ float sd[N];
  const int b = static_cast<int>(blockIdx.x);
  for (int i = static_cast<int>(threadIdx.x); i < KC; i += mk::kCudaThreads) sa[i] = a[b * KC + i];
  unsigned long long spent = 0;
  for (int pass = 0; pass < kPasses; ++pass) {
    grid_barrier(counter, static_cast<unsigned>(kCtas) * (pass + 1));
    const unsigned long long start = now_ns();
    const uint16_t* copy = w + static_cast<int64_t>(pass % copies) * copy_elems;
    const uint16_t* slice = Contiguous ? copy + static_cast<int64_t>(b) * N * KC : copy + b * KC;
    mk::gpu::rows_dot_lanes<1, KC, N, true, Packed>(sa, slice, Contiguous ? KC : LD, sd);
    spent += now_ns() - start;
    if (pass == 0) {
      for (int i = static_cast<int>(threadIdx.x); i < N; i += mk::kCudaThreads) out[b * N + i] = sd[i];
    }
  }
  if (threadIdx.x == 0) g_pass_ns[b] = spent / kPasses;
}

float bf16_to_float(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

struct Timing {
  float event_us, cta_us;
};

template <int KC, int N, int LD, bool Contiguous, bool Packed>
Timing time_layout(const uint16_t* w, int64_t copy_elems, int copies, const float* a, float* out,
                   unsigned* counter) {
  auto kernel = slices<KC, N, LD, Contiguous, Packed>;
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  std::vector<float> ev, cta;
  for (int l = 0; l < kWarmup + kLaunches; ++l) {
    CHECK(cudaMemset(counter, 0, sizeof(unsigned)));
    void* args[] = {&w, &copy_elems, &copies, &a, &out, &counter};
    CHECK(cudaEventRecord(e0));
    CHECK(cudaLaunchCooperativeKernel(reinterpret_cast<void*>(kernel), dim3(kCtas),
                                      dim3(mk::kCudaThreads), args, 0, nullptr));
    CHECK(cudaEventRecord(e1));
    CHECK(cudaEventSynchronize(e1));
    if (l < kWarmup) continue;
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, e0, e1));
    ev.push_back(1000.0f * ms / kPasses);
    unsigned long long ns[kCtas];
    CHECK(cudaMemcpyFromSymbol(ns, g_pass_ns, sizeof(ns)));
    double sum = 0;
    for (unsigned long long v : ns) sum += static_cast<double>(v);
    cta.push_back(static_cast<float>(sum / kCtas / 1000.0));
  }
  std::sort(ev.begin(), ev.end());
  std::sort(cta.begin(), cta.end());
  CHECK(cudaEventDestroy(e0));
  CHECK(cudaEventDestroy(e1));
  return Timing{ev[ev.size() / 2], cta[cta.size() / 2]};
}

// The worst relative error of out (pass 0, copy 0) against Σ a·w in float64 over every CTA's slice.
template <int KC, int N, int LD, bool Contiguous>
double check(const std::vector<uint16_t>& w, const std::vector<float>& a, const float* out_dev) {
  std::vector<float> out(static_cast<size_t>(kCtas) * N);
  CHECK(cudaMemcpy(out.data(), out_dev, out.size() * sizeof(float), cudaMemcpyDeviceToHost));
  double worst = 0;
  for (int b = 0; b < kCtas; ++b) {
    for (int n = 0; n < N; ++n) {
      double s = 0, mag = 0;
      for (int k = 0; k < KC; ++k) {
        const size_t at = Contiguous ? (static_cast<size_t>(b) * N + n) * KC + k
                                     : static_cast<size_t>(n) * LD + b * KC + k;
        const double term = static_cast<double>(a[b * KC + k]) * bf16_to_float(w[at]);
        s += term;
        mag += std::fabs(term);
      }
      worst = std::max(worst, std::fabs(out[static_cast<size_t>(b) * N + n] - s) / (mag + 1e-30));
    }
  }
  return worst;
}

// One shape: the strided layout (unpacked and packed lanes) and the contiguous one.
template <int KC, int N, int LD>
void run_shape(const char* name) {
  static_assert(KC * kCtas == LD, "the CTAs' slices cover the rows");
  const int64_t elems = static_cast<int64_t>(N) * LD;
  const double mb = elems * 2.0 / 1e6;
  const int copies = std::max(4, static_cast<int>(std::ceil(200.0 / mb)));  // 200 MB: past the L2
  std::vector<uint16_t> host(static_cast<size_t>(elems));
  uint32_t state = 12345u;
  for (auto& h : host) {  // random bf16 in ±[0.5, 2), never zero
    state = state * 1664525u + 1013904223u;
    const float v = (0.5f + 1.5f * ((state >> 8) & 0xffff) / 65536.0f) * ((state >> 31) ? -1.0f : 1.0f);
    uint32_t u;
    std::memcpy(&u, &v, 4);
    h = static_cast<uint16_t>(u >> 16);
  }
  std::vector<float> a(static_cast<size_t>(kCtas) * KC);
  for (auto& x : a) {
    state = state * 1664525u + 1013904223u;
    x = ((state >> 8) & 0xffff) / 32768.0f - 1.0f + 1e-3f;
  }
  // The contiguous copy holds the same values: element (n, b·KC + k) at (b·N + n)·KC + k.
  std::vector<uint16_t> packed(host.size());
  for (int b = 0; b < kCtas; ++b)
    for (int n = 0; n < N; ++n)
      for (int k = 0; k < KC; ++k)
        packed[(static_cast<size_t>(b) * N + n) * KC + k] = host[static_cast<size_t>(n) * LD + b * KC + k];
  uint16_t *w_strided, *w_packed;
  float *a_dev, *out;
  unsigned* counter;
  CHECK(cudaMalloc(&w_strided, copies * elems * 2));
  CHECK(cudaMalloc(&w_packed, copies * elems * 2));
  CHECK(cudaMalloc(&a_dev, a.size() * sizeof(float)));
  CHECK(cudaMalloc(&out, static_cast<size_t>(kCtas) * N * sizeof(float)));
  CHECK(cudaMalloc(&counter, sizeof(unsigned)));
  for (int c = 0; c < copies; ++c) {
    CHECK(cudaMemcpy(w_strided + c * elems, host.data(), elems * 2, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(w_packed + c * elems, packed.data(), elems * 2, cudaMemcpyHostToDevice));
  }
  CHECK(cudaMemcpy(a_dev, a.data(), a.size() * sizeof(float), cudaMemcpyHostToDevice));
  std::printf("\n%s: %d rows x %d of %d columns a CTA (%.1f KB a CTA, %.2f MB a pass), %d copies\n",
              name, N, KC, LD, N * KC * 2 / 1024.0, mb, copies);
  std::printf("| layout | us a pass (events) | us a CTA (globaltimer) | max rel error |\n|---|---:|---:|---:|\n");
  auto row = [&](const char* layout, Timing t, double err) {
    std::printf("| %s | %.3f | %.3f | %.1e%s |\n", layout, t.event_us, t.cta_us, err, err < 1e-5 ? "" : " FAIL");
  };
  CHECK(cudaMemset(out, 0xff, static_cast<size_t>(kCtas) * N * sizeof(float)));  // NaN
  Timing t = time_layout<KC, N, LD, false, false>(w_strided, elems, copies, a_dev, out, counter);
  row("strided, a row's pieces on a power of two of lanes", t, check<KC, N, LD, false>(host, a, out));
  CHECK(cudaMemset(out, 0xff, static_cast<size_t>(kCtas) * N * sizeof(float)));
  t = time_layout<KC, N, LD, false, true>(w_strided, elems, copies, a_dev, out, counter);
  row("strided, packed lanes", t, check<KC, N, LD, false>(host, a, out));
  CHECK(cudaMemset(out, 0xff, static_cast<size_t>(kCtas) * N * sizeof(float)));
  t = time_layout<KC, N, LD, true, false>(w_packed, elems, copies, a_dev, out, counter);
  row("contiguous slice", t, check<KC, N, LD, true>(packed, a, out));
  std::printf("(a pass's bytes at 3.0 TB/s: %.3f us)\n", mb / 3.0);
  CHECK(cudaFree(w_strided));
  CHECK(cudaFree(w_packed));
  CHECK(cudaFree(a_dev));
  CHECK(cudaFree(out));
  CHECK(cudaFree(counter));
}

int main() {
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s, %d SMs; %d passes a launch, median of %d launches\n", prop.name,
              prop.multiProcessorCount, kPasses, kLaunches);
  run_shape<24, 1024, 3072>("qwen3-0.6b down (48 B pieces)");
  run_shape<64, 2048, 8192>("llama-3.2-1b down (128 B pieces)");
  return 0;
}
