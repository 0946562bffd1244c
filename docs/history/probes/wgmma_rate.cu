// The rate of SM90 TF32 wgmma shapes, back to back, 1-3 warpgroups per SM on every SM: the
// tensor-core ceiling the direct family's main loop is measured against (docs/perf-notes.md,
// v0.6). Prints clocks per instruction per SM (at 1.98 GHz) and TFLOP/s. Build and run on an
// H100/H200 (the include folder is nvidia-cutlass's, `cutlass_convt.env.cutlass_include_dirs()`):
//
//   nvcc -std=c++20 -O3 -arch=sm_90a --expt-relaxed-constexpr -I<cutlass include> \
//        -o wgmma_rate docs/history/probes/wgmma_rate.cu && ./wgmma_rate
#include <cstdio>
#include <cstdint>
#include <utility>
#include "cute/arch/util.hpp"
#include "cute/arch/mma_sm90_desc.hpp"
#include "cute/arch/mma_sm90_gmma.hpp"

// Each warpgroup issues `iters` batches of 4 wgmma (Op: kRegs accumulator registers per thread,
// A from registers if kRS, else from shared memory; B from shared memory, zeros) into kAcc
// accumulators in turn, committing each batch and waiting until one batch is in flight.
template <class Op, int kRegs, bool kRS, int kAcc>
__global__ void __launch_bounds__(384, 1) bench(int iters, float *out) {
  extern __shared__ __align__(1024) float smem[];
  for (int i = threadIdx.x; i < 64 * 256 * 2; i += blockDim.x) smem[i] = 0.f;
  __syncthreads();
  cute::GmmaDescriptor desc;
  desc.bitfield.start_address_ = cute::cast_smem_ptr_to_uint(smem) >> 4;
  desc.bitfield.leading_byte_offset_ = 128 >> 4;
  desc.bitfield.stride_byte_offset_ = 256 >> 4;
  desc.bitfield.base_offset_ = 0;
  desc.bitfield.layout_type_ = 0;
  float acc[kAcc][kRegs];
  for (int j = 0; j < kAcc; ++j) for (int e = 0; e < kRegs; ++e) acc[j][e] = 0.f;
  uint32_t a[4] = {threadIdx.x, 1u, 2u, 3u};
  for (int it = 0; it < iters; ++it) {
    cute::warpgroup_arrive();
#pragma unroll
    for (int jj = 0; jj < 4; ++jj) {
      int const j = jj % kAcc;
      [&]<std::size_t... I>(std::index_sequence<I...>) {
        if constexpr (kRS) Op::fma(a[0], a[1], a[2], a[3], desc.desc_, acc[j][I]...);
        else Op::fma(desc.desc_, desc.desc_, acc[j][I]...);
      }(std::make_index_sequence<kRegs>{});
    }
    cute::warpgroup_commit_batch();
    cute::warpgroup_wait<1>();
  }
  cute::warpgroup_wait<0>();
  float s = 0.f;
  for (int j = 0; j < kAcc; ++j) for (int e = 0; e < kRegs; ++e) s += acc[j][e];
  if (s == 12345.f) out[threadIdx.x] = s;
}

// Times one launch of `warpgroups` warpgroups x 132 CTAs (one per SM on an H100/H200 SXM).
template <class Op, int kRegs, bool kRS, int kAcc>
void run(const char *name, int warpgroups, long mac_per_op) {
  float *out; cudaMalloc(&out, 4096);
  int iters = 20000;
  auto k = bench<Op, kRegs, kRS, kAcc>;
  cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 256 * 2 * 4);
  k<<<132, 128 * warpgroups, 64 * 256 * 2 * 4>>>(10, out);
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  cudaEventRecord(a);
  k<<<132, 128 * warpgroups, 64 * 256 * 2 * 4>>>(iters, out);
  cudaEventRecord(b); cudaEventSynchronize(b);
  float ms; cudaEventElapsedTime(&ms, a, b);
  double ops = 132.0 * warpgroups * iters * 4;
  printf("%-28s WGs/SM %d: %.3f ms, %.1f clk per op per SM at 1.98 GHz, %.0f TFLOP/s (err %s)\n", name,
         warpgroups, ms, ms * 1e-3 * 1.98e9 / (ops / 132), ops * mac_per_op * 2 / (ms * 1e-3) / 1e12,
         cudaGetErrorString(cudaGetLastError()));
}

int main() {
  using namespace cute::SM90::GMMA;
  for (int wg : {1, 2, 3}) {
    run<MMA_64x32x8_F32TF32TF32_RS_TN<>, 16, true, 4>("m64n32k8 RS 4 acc", wg, 64 * 32 * 8);
    run<MMA_64x32x8_F32TF32TF32_RS_TN<>, 16, true, 1>("m64n32k8 RS 1 acc", wg, 64 * 32 * 8);
    run<MMA_64x32x8_F32TF32TF32_SS_TN<>, 16, false, 4>("m64n32k8 SS 4 acc", wg, 64 * 32 * 8);
    run<MMA_64x64x8_F32TF32TF32_RS_TN<>, 32, true, 2>("m64n64k8 RS 2 acc", wg, 64 * 64 * 8);
    run<MMA_64x128x8_F32TF32TF32_SS_TN<>, 64, false, 1>("m64n128k8 SS 1 acc", wg, 64 * 128 * 8);
    if (wg < 3) run<MMA_64x256x8_F32TF32TF32_SS_TN<>, 128, false, 1>("m64n256k8 SS 1 acc", wg, 64 * 256 * 8);
  }
}
