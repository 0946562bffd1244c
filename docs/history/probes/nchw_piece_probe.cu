// Probe of the memory side alone of the strip family (docs/perf-notes.md v0.22): how fast can
// persistent CTAs copy problem 71's x (8 x 32 x 512 x 1024 fp32) when, as the strip kernels do,
// each moves pieces of one input row (a TMA box of `kBw` columns x `kBc` channels, NCHW; or
// `kBw` pixels x 32 channels, NHWC) through a ring in shared memory and back out with TMA
// stores? The question it answers: is the NCHW strip kernel's cost over channels_last (0.388
// against 0.311 ms) in the pieces of 400-550 bytes per channel plane that a strip of ~100
// columns reads and writes, and would wider pieces (more columns per CTA) remove it?
//
// Walks (which CTA moves which piece when), over units (strip, n, h, channel group):
// - 0 "strips": as strip.cu's (unpaced): CTA c takes strip c % strips and a contiguous range of
//   (n, h, channel group) of that strip, split evenly among the strip's CTAs;
// - 1 "rows": units in row-major order (strip fastest), dealt round-robin to the CTAs, so the
//   CTAs move neighbouring pieces of the same rows together, as a copy does.
// The output has x's shape (the kernels' output rows of 1026 floats are not 16-byte multiples;
// v0.15 measured alignment to make no difference). One thread issues the loads, another the
// stores; times are CUDA-event medians of 20 calls with L2 flushed before each, and every copy
// is checked against x (bit for bit, output poisoned first).
//
// Measured on an H200 (2026-11-30, docs/perf-notes.md v0.22): device copy 0.256-0.258 ms;
// 128-column pieces with a ring of 6 boxes: NCHW 0.280, NHWC 0.285; wider NCHW pieces
// 0.276-0.279 (256-1024 columns, as 1-4 boxes of 256); the rows walk 0.274 (NCHW; NHWC 0.276).
// With 1 load in flight (ring 2) both layouts fall to 0.38-0.40; with 2 (32 KB) NCHW is 5%
// behind NHWC.
//
//   nvcc -std=c++17 -O3 -arch=sm_90a --expt-relaxed-constexpr -I<cutlass include> \
//        -Icutlass_convt/templates -o nchw_piece_probe docs/history/probes/nchw_piece_probe.cu
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "common.cuh"  // mbarrier helpers, smem_address
#include "cute/arch/copy_sm90_tma.hpp"

constexpr int kN = 8, kC = 32, kH = 512, kW = 1024, kSMs = 132, kInFlight = 1;
constexpr long long kElems = 1ll * kN * kC * kH * kW;

template <bool kNhwc, int kBw, int kBc, int kBoxes, int kWalk, int kRing>
__global__ void __launch_bounds__(64, 1)
piece_copy(__grid_constant__ CUtensorMap const tmap_x, __grid_constant__ CUtensorMap const tmap_y) {
  constexpr int kBoxFloats = kBw * kBc, strips = kW / (kBw * kBoxes), groups = kC / kBc;
  constexpr long long kPerStrip = 1ll * kN * kH * groups;
  extern __shared__ __align__(1024) float smem[];
  uint64_t *landed = reinterpret_cast<uint64_t *>(smem + kRing * kBoxFloats);
  uint64_t *empty = landed + kRing;
  if (threadIdx.x < kRing) {
    barrier_init(&landed[threadIdx.x], 1);
    barrier_init(&empty[threadIdx.x], 1);
  }
  fence_async_shared();
  __syncthreads();
  if (threadIdx.x % 32 != 0) return;
  bool const loader = threadIdx.x == 0;
  // Calls f(box index of the CTA, strip, n, h, channel group) for the CTA's units in order.
  auto walk = [&](auto &&f) {
    uint32_t b = 0;
    auto unit = [&](int strip, long long u) {
      int const cg = int(u % groups), h = int(u / groups % kH), n = int(u / groups / kH);
      for (int i = 0; i < kBoxes; ++i, ++b) f(b, (strip * kBoxes + i) * kBw, n, h, cg * kBc);
    };
    if constexpr (kWalk == 0) {
      int const strip = blockIdx.x % strips, index = blockIdx.x / strips;
      int const count = (gridDim.x - 1 - strip) / strips + 1;
      for (long long u = kPerStrip * index / count; u < kPerStrip * (index + 1) / count; ++u)
        unit(strip, u);
    } else {
      for (long long t = blockIdx.x; t < kPerStrip * strips; t += gridDim.x)
        unit(int(t % strips), t / strips);
    }
  };
  walk([&](uint32_t b, int w0, int n, int h, int c0) {
    int const slot = b % kRing;
    float *box = smem + slot * kBoxFloats;
    if (loader) {
      barrier_wait(&empty[slot], (b / kRing + 1) % 2);
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(
                       smem_address(&landed[slot])),
                   "r"(kBoxFloats * 4)
                   : "memory");
      if constexpr (kNhwc)
        cute::SM90_TMA_LOAD_4D::copy(&tmap_x, &landed[slot], 0, box, c0, w0, h, n);
      else
        cute::SM90_TMA_LOAD_4D::copy(&tmap_x, &landed[slot], 0, box, w0, h, c0, n);
    } else {
      barrier_wait(&landed[slot], (b / kRing) % 2);
      if constexpr (kNhwc)
        cute::SM90_TMA_STORE_4D::copy(&tmap_y, box, c0, w0, h, n);
      else
        cute::SM90_TMA_STORE_4D::copy(&tmap_y, box, w0, h, c0, n);
      cute::tma_store_arrive();
      cute::tma_store_wait<kInFlight>();  // the store kInFlight boxes back has read its box
      if (b >= kInFlight) barrier_arrive(&empty[(b - kInFlight) % kRing]);
    }
  });
  if (!loader) cute::tma_store_wait<0>();
}

#define CHECK(x)                                                                    \
  do {                                                                              \
    auto e_ = (x);                                                                  \
    if (e_ != 0) {                                                                  \
      std::printf("%s:%d: %s failed (%d)\n", __FILE__, __LINE__, #x, int(e_));      \
      std::exit(1);                                                                 \
    }                                                                               \
  } while (0)

// cuTensorMapEncodeTiled through the runtime (no link against the driver library).
using EncodeTiled = decltype(&cuTensorMapEncodeTiled);
EncodeTiled encode_tiled() {
  void *f = nullptr;
  cudaDriverEntryPointQueryResult found;
  CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault,
                                         &found));
  CHECK(found != cudaDriverEntryPointSuccess);
  return reinterpret_cast<EncodeTiled>(f);
}

// x or y of problem 71 as a 4-D tensor map: NCHW as (W, H, C, N), NHWC as (C, W, H, N).
CUtensorMap tensor_map(float *base, bool nhwc, int bw, int bc) {
  CUtensorMap map;
  cuuint64_t dims[4], strides[3];
  cuuint32_t box[4], unit[4] = {1, 1, 1, 1};
  if (nhwc) {
    cuuint64_t d[4] = {kC, kW, kH, kN}, s[3] = {4ull * kC, 4ull * kC * kW, 4ull * kC * kW * kH};
    cuuint32_t bx[4] = {kC, cuuint32_t(bw), 1, 1};
    std::copy(d, d + 4, dims), std::copy(s, s + 3, strides), std::copy(bx, bx + 4, box);
  } else {
    cuuint64_t d[4] = {kW, kH, kC, kN}, s[3] = {4ull * kW, 4ull * kW * kH, 4ull * kW * kH * kC};
    cuuint32_t bx[4] = {cuuint32_t(bw), 1, cuuint32_t(bc), 1};
    std::copy(d, d + 4, dims), std::copy(s, s + 3, strides), std::copy(bx, bx + 4, box);
  }
  CHECK(encode_tiled()(&map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, base, dims, strides, box,
                               unit, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                               CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
  return map;
}

__global__ void mismatches(float const *x, float const *y, unsigned long long *count) {
  long long const i = blockIdx.x * 1ll * blockDim.x + threadIdx.x;
  if (i < kElems && __float_as_uint(x[i]) != __float_as_uint(y[i])) atomicAdd(count, 1ull);
}

__global__ void fill(float *x) {
  long long const i = blockIdx.x * 1ll * blockDim.x + threadIdx.x;
  if (i < kElems) x[i] = float((i * 2654435761ull) % 1000003) * 1e-3f;
}

struct Buffers {
  float *x, *y;
  char *flush;
  unsigned long long *count;
};

template <class Launch>
double time_ms(Buffers const &b, Launch &&launch) {
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  std::vector<float> ms;
  for (int trial = 0; trial < 23; ++trial) {
    CHECK(cudaMemsetAsync(b.flush, trial, 256 << 20));  // flush the 50 MB L2
    CHECK(cudaEventRecord(start));
    launch();
    CHECK(cudaEventRecord(stop));
    CHECK(cudaEventSynchronize(stop));
    float t;
    CHECK(cudaEventElapsedTime(&t, start, stop));
    if (trial >= 3) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

template <bool kNhwc, int kBw, int kBc, int kBoxes, int kWalk, int kRing = 6>
void run(Buffers const &b) {
  constexpr int strips = kW / (kBw * kBoxes);
  int const ctas = kWalk == 0 ? kSMs - kSMs % strips : kSMs;
  size_t const smem = kRing * kBw * kBc * 4 + 2 * kRing * 8;
  auto kernel = piece_copy<kNhwc, kBw, kBc, kBoxes, kWalk, kRing>;
  CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  CUtensorMap const mx = tensor_map(b.x, kNhwc, kBw, kBc), my = tensor_map(b.y, kNhwc, kBw, kBc);
  CHECK(cudaMemset(b.y, 0xff, kElems * 4));  // poison
  kernel<<<ctas, 64, smem>>>(mx, my);
  CHECK(cudaGetLastError());
  CHECK(cudaMemset(b.count, 0, 8));
  mismatches<<<(kElems + 255) / 256, 256>>>(b.x, b.y, b.count);
  unsigned long long wrong = 0;
  CHECK(cudaMemcpy(&wrong, b.count, 8, cudaMemcpyDeviceToHost));
  double const ms = time_ms(b, [&] { kernel<<<ctas, 64, smem>>>(mx, my); });
  std::printf("%-5s walk %-6s piece %4d columns x %2d channels (%5d B per plane row), %3d CTAs:"
              " ring %d, %.4f ms, %.2f TB/s, %llu wrong\n",
              kNhwc ? "NHWC" : "NCHW", kWalk ? "rows" : "strips", kBw * kBoxes,
              kNhwc ? 32 : kBc, kNhwc ? 0 : kBw * kBoxes * 4, ctas, kRing, ms, 2 * kElems * 4 / ms / 1e9,
              wrong);
}

int main() {
  Buffers b;
  CHECK(cudaMalloc(&b.x, kElems * 4));
  CHECK(cudaMalloc(&b.y, kElems * 4));
  CHECK(cudaMalloc(&b.flush, 256 << 20));
  CHECK(cudaMalloc(&b.count, 8));
  fill<<<(kElems + 255) / 256, 256>>>(b.x);
  CHECK(cudaDeviceSynchronize());
  for (int repeat = 0; repeat < 2; ++repeat) {
    double const copy =
        time_ms(b, [&] { CHECK(cudaMemcpyAsync(b.y, b.x, kElems * 4, cudaMemcpyDeviceToDevice)); });
    std::printf("device copy: %.4f ms, %.2f TB/s\n", copy, 2 * kElems * 4 / copy / 1e9);
    run<true, 128, 32, 1, 0>(b);
    run<true, 128, 32, 1, 1>(b);
    run<false, 64, 32, 1, 0>(b);
    run<false, 128, 32, 1, 0>(b);
    run<false, 256, 32, 1, 0>(b);
    run<false, 256, 32, 2, 0>(b);
    run<false, 256, 32, 4, 0>(b);
    run<false, 256, 8, 4, 0>(b);
    run<false, 64, 32, 1, 1>(b);
    run<false, 128, 32, 1, 1>(b);
    run<false, 256, 32, 1, 1>(b);
    run<true, 128, 32, 1, 0, 2>(b);
    run<false, 128, 32, 1, 0, 2>(b);
    run<true, 128, 32, 1, 0, 3>(b);
    run<false, 128, 32, 1, 0, 3>(b);
    run<true, 128, 32, 1, 0, 4>(b);
    run<false, 128, 32, 1, 0, 4>(b);
    run<false, 64, 32, 1, 0, 4>(b);
    run<false, 64, 32, 1, 0, 8>(b);
  }
}
