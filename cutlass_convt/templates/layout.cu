// cutlass_convt: layout passes between PyTorch's NCHW and the NHWC that CUTLASS's convolution
// kernels read and write. One batched transpose of [N][C][HW] <-> [N][HW][C] through a padded
// shared-memory tile of 32 channels x 128 pixels: every global load and store of a warp covers
// 32 consecutive elements (128 bytes of float32, 64 of 16-bit ones), and each block touches 128
// contiguous elements of every channel row it reads or writes. Elements are moved as bits
// (float, or uint16_t for float16 / bfloat16). 64-bit indexing throughout.
#include <cstdint>

namespace {
constexpr int kTileC = 32;
constexpr int kTilePixels = 128;
constexpr int kRows = 8;  // blockDim = (32, kRows)

// Grid (ceil(HW / kTilePixels), ceil(C / kTileC), N). kToNhwc: src [N][C][HW] -> dst
// [N][HW][C]; else src [N][HW][C] -> dst [N][C][HW].
template <class T, bool kToNhwc>
__device__ void transpose(T const *__restrict__ src, T *__restrict__ dst, int C, int64_t HW) {
  __shared__ T tile[kTileC][kTilePixels + 1];  // [channel][pixel], +1: no bank conflicts
  int64_t const base = int64_t(blockIdx.z) * C * HW;
  int64_t const p0 = int64_t(blockIdx.x) * kTilePixels;
  int const c0 = blockIdx.y * kTileC;
  int const tx = threadIdx.x;
  if (kToNhwc) {  // tx runs along pixels of one channel row
#pragma unroll
    for (int i = threadIdx.y; i < kTileC; i += kRows) {
#pragma unroll
      for (int j = 0; j < kTilePixels; j += 32) {
        int64_t const p = p0 + j + tx;
        if (c0 + i < C && p < HW) tile[i][j + tx] = src[base + int64_t(c0 + i) * HW + p];
      }
    }
  } else {  // tx runs along the channels of one pixel
#pragma unroll
    for (int i = threadIdx.y; i < kTilePixels; i += kRows) {
      int64_t const p = p0 + i;
      if (c0 + tx < C && p < HW) tile[tx][i] = src[base + p * C + c0 + tx];
    }
  }
  __syncthreads();
  if (kToNhwc) {  // tx runs along the channels of one pixel
#pragma unroll
    for (int i = threadIdx.y; i < kTilePixels; i += kRows) {
      int64_t const p = p0 + i;
      if (c0 + tx < C && p < HW) dst[base + p * C + c0 + tx] = tile[tx][i];
    }
  } else {  // tx runs along pixels of one channel row
#pragma unroll
    for (int i = threadIdx.y; i < kTileC; i += kRows) {
#pragma unroll
      for (int j = 0; j < kTilePixels; j += 32) {
        int64_t const p = p0 + j + tx;
        if (c0 + i < C && p < HW) dst[base + int64_t(c0 + i) * HW + p] = tile[i][j + tx];
      }
    }
  }
}
}  // namespace

extern "C" __global__ void __launch_bounds__(32 * kRows)
cutlass_convt_nchw_to_nhwc(float const *__restrict__ src, float *__restrict__ dst, int C,
                           int64_t HW) {
  transpose<float, true>(src, dst, C, HW);
}

extern "C" __global__ void __launch_bounds__(32 * kRows)
cutlass_convt_nhwc_to_nchw(float const *__restrict__ src, float *__restrict__ dst, int C,
                           int64_t HW) {
  transpose<float, false>(src, dst, C, HW);
}

// The same for 16-bit elements (float16, bfloat16).
extern "C" __global__ void __launch_bounds__(32 * kRows)
cutlass_convt_nchw_to_nhwc_16(uint16_t const *__restrict__ src, uint16_t *__restrict__ dst,
                              int C, int64_t HW) {
  transpose<uint16_t, true>(src, dst, C, HW);
}

extern "C" __global__ void __launch_bounds__(32 * kRows)
cutlass_convt_nhwc_to_nchw_16(uint16_t const *__restrict__ src, uint16_t *__restrict__ dst,
                              int C, int64_t HW) {
  transpose<uint16_t, false>(src, dst, C, HW);
}
