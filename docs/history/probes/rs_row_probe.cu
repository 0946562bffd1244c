// Probe for an NCHW strip kernel without the transpose pass (docs/perf-notes.md, v0.17): the
// shared-memory and tensor-core side alone of computing problem 71 (tf32) with x as wgmma's A
// from registers. No global memory: the times compare with v0.15's knock-out of the NCHW strip
// kernel without loads and stores (0.317 ms).
//
// Each warpgroup walks input rows of a 64-column strip. Per input row, 12 steps (filter column
// s, 8 input channels c8): 4 `ld.shared` of x from an untransposed [channel][column] row (the
// layout a TMA box of NCHW x lands in), rounded to TF32 in registers, then one
// m64n96k8 wgmma whose B is the filter block (s, c8) of all 3 filter rows x 32 output channels
// (K-major, in shared memory), so each input row is read once for all filter rows. Its 48
// accumulators (one set per row parity: the hardware wants them as one fixed register range,
// so they cannot rotate) hold input row h's parts of output rows h, h + 1 and h + 2. At the
// first step of row h + 1 they are added to the running sums of rows h + 1 and h + 2, and
// output row h, now complete, goes to a [channel][column] stage in shared memory (16
// `st.shared` per thread, conflict-free) and the warpgroup synchronizes, as before a TMA store.
// The rows needed for problem 71 (8 images x 17 strips x 516 input rows) are spread over 132
// CTAs of 2 or 3 warpgroups; the time is scaled to exactly that count. 3xTF32 (fp32): x split
// into big and small TF32 parts in registers, the filter's two parts in shared memory, three
// wgmmas per step into the same accumulators.
//
//   nvcc -std=c++17 -O3 -arch=sm_90a --expt-relaxed-constexpr -Xptxas=-v -I<cutlass include> \
//        -o rs_row_probe docs/history/probes/rs_row_probe.cu && ./rs_row_probe
#include <cstdint>
#include <cstdio>
#include <utility>

#include "cute/arch/mma_sm90_desc.hpp"
#include "cute/arch/mma_sm90_gmma.hpp"
#include "cute/arch/util.hpp"

constexpr int kC = 32, kPitch = 72;  // channel pitch 8 (mod 32) words: a warp's loads hit 32 banks
constexpr int kRing = 4, kStagePitch = 68;
constexpr int kRingFloats = kRing * kC * kPitch;
constexpr int kFilterFloats = 12 * 96 * 8;  // (s, c8) blocks of 96 n x 8 k
constexpr int kStageFloats = kC * kStagePitch;
constexpr long kProblemRows = 8L * 17 * 516;  // problem 71: images x strips x input rows

using Op = cute::SM90::GMMA::MMA_64x96x8_F32TF32TF32_RS_TN<>;

__device__ __forceinline__ uint32_t tf32_nearest(float v) {
  return (__float_as_uint(v) + 0x1000u) & 0xffffe000u;
}

template <std::size_t... I>
__device__ __forceinline__ void mma(uint32_t const (&a)[4], uint64_t desc, float (&d)[48],
                                    bool accumulate, std::index_sequence<I...>) {
  Op::fma(a[0], a[1], a[2], a[3], desc, d[I]...,
          accumulate ? cute::SM90::GMMA::ScaleOut::One : cute::SM90::GMMA::ScaleOut::Zero);
}

template <int kWG, bool kThreePass>
__global__ void __launch_bounds__(128 * kWG, 1) probe(int rows, int epilogue, float *out) {
  extern __shared__ __align__(1024) float smem[];
  int const wg = threadIdx.x / 128, thread = threadIdx.x % 128;
  int const warp = thread / 32, g = thread % 32 / 4, t = thread % 4;
  constexpr int kFilters = kThreePass ? 2 : 1;  // 3xTF32: the filter's big and small parts
  float *filter = smem;
  float *ring = smem + kFilters * kFilterFloats + wg * kRingFloats;
  float *stage = smem + kFilters * kFilterFloats + kWG * kRingFloats + wg * kStageFloats;
  for (int i = threadIdx.x; i < kFilters * kFilterFloats + kWG * (kRingFloats + kStageFloats);
       i += blockDim.x) {
    smem[i] = float(i % 7) * 0.1f + 0.01f;
  }
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();
  cute::GmmaDescriptor desc;  // K-major, no swizzle: 8 n x 16-byte core matrices
  desc.bitfield.start_address_ = cute::cast_smem_ptr_to_uint(filter) >> 4;
  desc.bitfield.leading_byte_offset_ = 128 >> 4;
  desc.bitfield.stride_byte_offset_ = 256 >> 4;
  desc.bitfield.base_offset_ = 0;
  desc.bitfield.layout_type_ = 0;
  float D[2][48];            // input row h's parts of output rows h, h + 1, h + 2 (by parity)
  float R1[16] = {}, R2[16] = {};  // running sums of the next two output rows
  uint32_t a[3][4], al[3][4];  // TF32 (3xTF32: the big parts), 3xTF32's small parts
  // A fragment of step k (s = k / 4, c8 = k % 4) of input row `row`: (pixel g, channel t),
  // (g + 8, t), (g, t + 4), (g + 8, t + 4) of the warp's 16 pixels, shifted by s
  auto load = [&](int row, int k, uint32_t(&dst)[4], uint32_t(&small)[4]) {
    float const *x = ring + (row % kRing) * kC * kPitch + (8 * (k % 4) + t) * kPitch + 16 * warp +
                     g + k / 4;
    float const v[4] = {x[0], x[8], x[4 * kPitch], x[4 * kPitch + 8]};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      dst[e] = tf32_nearest(v[e]);
      if (kThreePass) small[e] = tf32_nearest(v[e] - __uint_as_float(dst[e]));
    }
  };
  load(0, 0, a[0], al[0]);
  load(0, 1, a[1], al[1]);
  for (int h0 = 0; h0 < rows; h0 += 2) {
#pragma unroll
    for (int K = 0; K < 24; ++K) {
      int const p = K / 12, k = K % 12;
      cute::warpgroup_arrive();
      uint64_t const big = desc.desc_ + ((k * 96 * 8 * 4) >> 4);
      if (kThreePass) {  // small products first, then big x big
        uint64_t const small = big + ((kFilterFloats * 4) >> 4);
        mma(al[K % 3], big, D[p], k > 0, std::make_index_sequence<48>{});
        mma(a[K % 3], small, D[p], true, std::make_index_sequence<48>{});
        mma(a[K % 3], big, D[p], true, std::make_index_sequence<48>{});
      } else {
        mma(a[K % 3], big, D[p], k > 0, std::make_index_sequence<48>{});
      }
      cute::warpgroup_commit_batch();
      if (k == 0) {
        cute::warpgroup_wait<0>();  // ptxas serializes every wgmma (C7514) if D[1 - p] is read
                                    // with this step in flight
      } else {
        cute::warpgroup_wait<1>();  // step K - 1 is done: its A registers can be refilled
      }
      if (k == 0 && h0 + p > 0) {  // the previous input row is done: D[1 - p]
        float(&d)[48] = D[1 - p];
#pragma unroll
        for (int e = 0; e < 48; ++e) cute::warpgroup_fence_operand(d[e]);
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            int const i = 4 * j + e;
            if (epilogue) {
              stage[(8 * j + 2 * t + e % 2) * kStagePitch + 16 * warp + g + 8 * (e / 2)] =
                  R1[i] + d[i];
            }
            R1[i] = R2[i] + d[16 + i];
            R2[i] = d[32 + i];
          }
        if (epilogue) asm volatile("bar.sync %0, 128;\n" ::"r"(1 + wg) : "memory");
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        cute::warpgroup_fence_operand(a[(K + 2) % 3][e]);
        cute::warpgroup_fence_operand(al[(K + 2) % 3][e]);
      }
      load(h0 + (K + 2) / 12, (K + 2) % 12, a[(K + 2) % 3], al[(K + 2) % 3]);
    }
  }
  cute::warpgroup_wait<0>();
  float s = 0.f;
  for (int e = 0; e < 16; ++e) s += R1[e] + R2[e] + D[0][e] + D[1][e];
  if (s == 12345.f) out[threadIdx.x] = s;
}

template <int kWG, bool kThreePass>
void run(int epilogue) {
  float *out;
  cudaMalloc(&out, 4096);
  int const rows = int((kProblemRows + 132 * kWG - 1) / (132 * kWG) + 1) / 2 * 2;
  int const bytes = 4 * ((kThreePass ? 2 : 1) * kFilterFloats + kWG * (kRingFloats + kStageFloats));
  auto k = probe<kWG, kThreePass>;
  cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  k<<<132, 128 * kWG, bytes>>>(8, epilogue, out);
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  float best = 1e9f;
  for (int rep = 0; rep < 20; ++rep) {
    cudaEventRecord(a);
    k<<<132, 128 * kWG, bytes>>>(rows, epilogue, out);
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms;
    cudaEventElapsedTime(&ms, a, b);
    best = ms < best ? ms : best;
  }
  double const scale = double(kProblemRows) / (132.0 * kWG * rows);
  double const mac = double(kProblemRows) * 12 * 64 * 96 * 8 * (kThreePass ? 3 : 1);
  printf("%s, %d warpgroups/SM, %d rows each, epilogue %d: %.4f ms (best of 20), problem 71: "
         "%.4f ms, %.0f TFLOP/s of TF32 wgmma counting the strips' padding (%s)\n",
         kThreePass ? "3xTF32" : "TF32", kWG, rows, epilogue, best, best * scale,
         2 * mac / (best * scale * 1e-3) / 1e12,
         cudaGetErrorString(cudaGetLastError()));
}

int main() {
  for (int epilogue : {0, 1}) {
    run<2, false>(epilogue);
    run<3, false>(epilogue);
    run<2, true>(epilogue);
    run<3, true>(epilogue);
  }
}
