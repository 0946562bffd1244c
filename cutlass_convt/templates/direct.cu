// cutlass_convt: our own stride-1 transposed convolution ("direct" family), on the caller's
// layout (NCHW or NHWC in and out, no layout passes), built from CuTe's atoms: cp.async with
// zero fill (halo tiles, padding at the borders), and either SM90 wgmma m64nNk8 TF32 with the
// input operand from registers and the filter from shared memory (kWgmma) or mma.sync m16n8k8
// TF32 (any SM80+ GPU); both also as 3xTF32.
//
//   y[n, co, p, q] = bias[co]
//                    + sum_{ci, r, s} x[n, ci, p + pad_h - r, q + pad_w - s] * w[ci, co, r, s]
//
// (PyTorch's conv_transpose2d with stride 1, dilation 1; x outside the image reads as zero.)
// As an implicit GEMM per output tile: M = output pixels, N = a block of kCOBlock output
// channels (all kCO in one tile when the filter fits in shared memory), K = kCI x kR x kS,
// reduced from one input tile plus its halo staged in shared memory.
//
// Persistent and warp-specialized: the grid is kCOBlocks = kCO / kCOBlock groups of CTAs, CTA b
// computing output channel block b % kCOBlocks. Each CTA stages its block of the filter in
// shared memory once (in the layout its MMA reads, straight from PyTorch's (C_in, C_out, R, S)
// layout), then loops over output tiles (tile = b / kCOBlocks + j * gridDim.x / kCOBlocks,
// raster order: q fastest, then p, then n, so the halo rows of neighbouring tiles, and a tile's
// input for its other channel blocks, come from L2). kProducerWarps warps load each tile's input
// (all channels, plus halo) into one of kStages buffers with cp.async and zero fill;
// kConsumers groups of warps take turns at the tiles, each computing its tile and storing it
// from the accumulators while the other group computes. mbarriers pass the buffers around:
// full[group][stage] (a tile's input landed), empty[stage] (its group has read it). Without
// producer warps (the mma.sync configurations: 3xTF32 needs every register of 8 warps) the group
// loads its own tiles kStages - 1 ahead. Stores: NCHW with wgmma, each output row through
// shared memory, a warp store covering one channel's 64 columns; otherwise straight from the
// accumulators, a warp store covering 8 consecutive pixels of 4 channels (NCHW) or 8
// consecutive channels of 8 pixels (NHWC).
//
// precision: kThreePass = false is TF32 (operands rounded to the nearest TF32, ties away from
// zero, as cuDNN's TF32 kernels round), true is 3xTF32 (big * big + big * small + small * big,
// fp32-accurate; CUTLASS's OpMultiplyAddFastF32). docs/design/direct.md describes the kernel.
#include <cstdint>
#include <numeric>
#include <utility>

#include "common.cuh"  // tf32_nearest, mbarrier helpers, fence_async_shared, gmma_descriptor
#include "cute/arch/copy_sm80.hpp"
#include "cute/arch/mma_sm80.hpp"
#include "config.h"  // kCI kCO kCOBlock kR kS kTileH kTileW kWarpTilesM kStages kConsumers
                     // kProducerWarps kVec kNhwc kThreePass kWgmma, kConfigThreads kSharedBytes
                     // (from DirectConfig, families/direct.py)
#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || !defined(__CUDA_ARCH__)
#include "cute/arch/mma_sm90_desc.hpp"
#include "cute/arch/mma_sm90_gmma.hpp"
#elif defined(__CUDA_ARCH__)
static_assert(!kWgmma, "wgmma configurations are built for sm_90a");
#endif

namespace {

// Kernel argument, passed by value; packed tensors. families/direct.py packs it
// (DIRECT_PARAMS).
struct DirectParams {
  float const *x;     // (N, kCI, H, W) NCHW or (N, H, W, kCI) NHWC
  float const *w;     // (kCI, kCO, kR, kS), PyTorch's layout
  float const *bias;  // (kCO,) or null
  float *y;           // (N, kCO, P, Q) NCHW or (N, P, Q, kCO) NHWC
  int N, H, W, P, Q, pad_h, pad_w;
  int tiles_q, tiles_p, total_tiles;
};
static_assert(sizeof(DirectParams) == 72, "families/direct.py packs 4 pointers and 10 ints");

static_assert(kCI % 8 == 0 && kCOBlock % 8 == 0 && kCO % kCOBlock == 0,
              "channels must be multiples of 8, C_out of the channel block");
constexpr int kCOBlocks = kCO / kCOBlock;
static_assert(kWgmma || kTileW % (16 * kWarpTilesM) == 0,
              "mma.sync: a warp covers 16 * kWarpTilesM pixels of a row");
static_assert(kNhwc || kVec == 4 || kVec == 1, "NCHW loads are 16 or 4 bytes");
static_assert(!kWgmma || (kTileW % 64 == 0 && kTileH % kWarpTilesM == 0 &&
                          (kCOBlock == 8 || kCOBlock == 16 || kCOBlock == 32)),
              "wgmma: warpgroups of 64 columns x kWarpTilesM rows, N = kCOBlock of 8, 16, 32");

// Warp roles: kProducerWarps warps load input tiles; kConsumers groups of kGroupWarps warps
// compute and store output tiles, each group its own tile. In a group, each warp computes
// kWarpTilesM m16 tiles (16 consecutive output pixels of a row each). mma.sync: one row per
// warp, the tiles side by side. wgmma: a warpgroup (4 warps) computes kWarpTilesM rows of 64
// columns, one m64 wgmma per row; warp w of it holds columns 16w..16w+15.
constexpr int kGroupWarps = kTileH * kTileW / (16 * kWarpTilesM);
constexpr int kGroupThreads = 32 * kGroupWarps;
constexpr int kProducerThreads = 32 * kProducerWarps;
constexpr int kThreads = kProducerThreads + kConsumers * kGroupThreads;
static_assert(!kWgmma || kProducerWarps % 4 == 0,
              "wgmma: warpgroups start at a multiple of 4 warps");
static_assert(kConsumers >= 1 && kStages >= kConsumers, "a stage per group at least");
constexpr int kRowStep = kWgmma ? 1 : 0, kColStep = kWgmma ? 0 : 16;  // from tile i to i + 1
constexpr int kNTiles = kCOBlock / 8;   // n8 tiles of the MMA
constexpr int kKSteps = kCI / 8;   // k8 steps per filter tap

// The input tile: rows [p0 + pad_h - (kR - 1), p0 + kTileH + pad_h), columns from the 16-byte
// aligned (NCHW) column at or left of q0 + pad_w - (kS - 1).
constexpr int kHaloH = kTileH + kR - 1;
constexpr int kColAlign = kNhwc ? 1 : kVec;
constexpr int kHaloW = (kTileW + kS - 1 + kColAlign - 1 + kColAlign - 1) / kColAlign * kColAlign;
// NHWC with wgmma: the k order of each 8-channel step is permuted, k = t and t + 4 of an A
// fragment being channels 2t and 2t + 1 (the filter is staged in the same order), so a lane
// loads both with one 8-byte ld.shared.
constexpr bool kPairedK = kWgmma && kNhwc;
// NCHW: [ci][row][col], the channel-plane pitch = 8 (mod 16) words, so the 8 pixels x 4
// channels of an A fragment fall in 32 different banks. NHWC: [row][col][ci], the pixel pitch
// kCI + 4 words (kCI + 8 for the 8-byte loads), for the same reason.
constexpr int kPlane0 = kHaloH * kHaloW;
constexpr int kPlane = kPlane0 + (24 - kPlane0 % 16) % 16;
constexpr int kPixelPitch = kCI + (kPairedK ? 8 : 4);
constexpr int kHaloFloats = kNhwc ? kHaloH * kHaloW * kPixelPitch : kCI * kPlane;
constexpr int kFilterFloats = kR * kS * kCI * kCOBlock;  // the CTA's channel block
// 3xTF32 with wgmma: the filter's big and small TF32 parts, one after the other.
constexpr int kFilterCopies = kWgmma && kThreePass ? 2 : 1;
// NCHW with wgmma: each consumer warpgroup stages one output row (64 pixels x kCOBlock channels,
// [co][col], a pitch that spreads a warp's writes over the 32 banks) at a time for coalesced
// stores. NHWC stores leave straight from the accumulators (a warp store covers 8 channels of
// 8 pixels): staging would add shared-memory traffic to a loop whose shared-memory pipe the A
// fragments already load (docs/design/direct.md, "Algorithm").
constexpr bool kStagedStore = kWgmma && !kNhwc;
constexpr int kStageCoPitch = 64 + 4;
constexpr int kStageFloats = kCOBlock * kStageCoPitch;
constexpr int kStagedWarpgroups = kStagedStore ? kConsumers * kGroupWarps / 4 : 0;
static_assert(kThreads == kConfigThreads &&
                  int(sizeof(float)) * (kFilterCopies * kFilterFloats + kStages * kHaloFloats +
                                        kStagedWarpgroups * kStageFloats) +
                          (kConsumers + 1) * kStages * int(sizeof(uint64_t)) == kSharedBytes,
              "shared memory layout differs from DirectConfig.shared_bytes (families/direct.py)");

// v = big + small, both TF32 (3xTF32's split).
__device__ __forceinline__ void split(float v, uint32_t &big, uint32_t &small) {
  big = tf32_nearest(v);
  small = tf32_nearest(v - __uint_as_float(big));
}

// The tensor cores round each mma's sum toward zero; one accumulator over every tap can take
// 3xTF32's error past the 1e-6 bound. So 3xTF32 accumulates each filter tap (its kCI
// input channels) in registers of its own and adds that to the result with ordinary fp32 adds:
// the error then grows with kCI only, hence fp32 up to 64 input channels
// (docs/design/direct.md, "Limits").
constexpr bool kTapPartials = kThreePass;

// Output row and column (in the tile) of the first pixel of the warp's m tile 0.
__device__ __forceinline__ int2 warp_origin(int warp) {
  if constexpr (kWgmma) {
    constexpr int kGroupsPerRow = kTileW / 64;
    int const group = warp / 4;
    return {group / kGroupsPerRow * kWarpTilesM, group % kGroupsPerRow * 64 + warp % 4 * 16};
  } else {
    constexpr int kWarpsPerRow = kWgmma ? 1 : kTileW / (16 * kWarpTilesM);
    return {warp / kWarpsPerRow, warp % kWarpsPerRow * 16 * kWarpTilesM};
  }
}

// Stage the filter (w: the CTA's first output channel), one block of kCOBlock x 8 values per k
// step (tap, c8): ci = 8 c8 + k, co counted from the block's first channel.
// mma.sync: element (tap, c8, j, lane, e) = w[ci: k = lane % 4 + 4 e][co = 8 j + lane / 4][tap],
// the B fragment (b0, b1) of lane for n tile j; raw fp32 (rounded or split at use).
// wgmma: GMMA's K-major canonical layout without swizzle, core matrices of 8 channels co x 4 k
// (16-byte rows), core (co / 8, k / 4) at byte 128 (2 (co / 8) + k / 4), k = ci - 8 c8 (with
// kPairedK: ci - 8 c8 = 2 (k % 4) + k / 4); rounded to TF32 here (the tensor cores read it
// straight from shared memory; 3xTF32: the big parts, then the small parts).
__device__ void stage_filter(float const *__restrict__ w, float *smem_w) {
  for (int i = threadIdx.x; i < kFilterFloats; i += kThreads) {
    int const step = i / (8 * kCOBlock), c8 = step % kKSteps, tap = step / kKSteps;
    int const in = i % (8 * kCOBlock);
    int co, k;
    if constexpr (kWgmma) {
      co = in / 64 * 8 + in % 32 / 4, k = in / 32 % 2 * 4 + in % 4;
    } else {
      int const e = in % 2, lane = in / 2 % 32;
      co = in / 64 * 8 + lane / 4, k = lane % 4 + 4 * e;
    }
    int const ci = 8 * c8 + (kPairedK ? 2 * (k % 4) + k / 4 : k);
    float const v = w[(ci * kCO + co) * (kR * kS) + tap];
    if constexpr (kFilterCopies == 2) {
      uint32_t big, small;
      split(v, big, small);
      smem_w[i] = __uint_as_float(big), smem_w[kFilterFloats + i] = __uint_as_float(small);
    } else {
      smem_w[i] = kWgmma ? __uint_as_float(tf32_nearest(v)) : v;
    }
  }
  if constexpr (kWgmma) fence_async_shared();  // make the writes visible to wgmma's reads
}

struct Tile {
  int n, p0, q0;
};

__device__ __forceinline__ Tile tile_at(DirectParams const &prm, int t) {
  int const tq = t % prm.tiles_q, rest = t / prm.tiles_q;
  return {rest / prm.tiles_p, rest % prm.tiles_p * kTileH, tq * kTileW};
}

// First input column of the staged tile, and the offset of q0 + pad_w - (kS - 1) in it.
__device__ __forceinline__ int halo_col0(DirectParams const &prm, Tile tile) {
  int const start = tile.q0 + prm.pad_w - (kS - 1);
  return start - ((start % kColAlign) + kColAlign) % kColAlign;
}

// Shared-memory index of input element (channel ci, tile row, tile column).
__device__ __forceinline__ int halo_index(int ci, int row, int col) {
  return kNhwc ? (row * kHaloW + col) * kPixelPitch + ci : ci * kPlane + row * kHaloW + col;
}

// Issue the cp.async loads of one tile's input (zero-filled outside the image), spread over
// `threads` loader threads (this one is `thread`). NHWC: a thread takes a column of 16 bytes
// (chunk c4 of pixel col) and copies it for every halo row, moving only the row pointer. NCHW:
// the loader threads walk the (ci, row, chunk) chunks in order, so each warp's copies cover
// consecutive rows of one channel plane, not a column across channels
// (docs/design/direct.md, "Algorithm").
static_assert(kHaloH <= 32, "one bit per halo row");
__device__ void load_halo(DirectParams const &prm, Tile tile, float *smem_x, int thread,
                          int threads) {
  int const h0 = tile.p0 + prm.pad_h - (kR - 1), w0 = halo_col0(prm, tile);
  uint32_t rows_inside = 0;  // bit row: input row h0 + row is in the image
#pragma unroll
  for (int row = 0; row < kHaloH; ++row) {
    rows_inside |= uint32_t(unsigned(h0 + row) < unsigned(prm.H)) << row;
  }
  if constexpr (kNhwc) {
    constexpr int kChunks = kCI / 4;  // 16-byte chunks of one pixel
    int64_t const row_pitch = int64_t(prm.W) * kCI;
    for (int column = thread; column < kHaloW * kChunks; column += threads) {
      int const col = column / kChunks, c4 = column % kChunks, w = w0 + col;
      int64_t const offset = ((int64_t(tile.n) * prm.H + h0) * prm.W + w) * kCI + 4 * c4;
      bool const column_inside = unsigned(w) < unsigned(prm.W);
#pragma unroll
      for (int row = 0; row < kHaloH; ++row) {
        bool const inside = column_inside && (rows_inside >> row & 1u);
        float const *src = inside ? prm.x + (offset + row * row_pitch) : prm.x;
        cute::SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<cute::uint128_t>::copy(
            *reinterpret_cast<cute::uint128_t const *>(src),
            *reinterpret_cast<cute::uint128_t *>(smem_x + halo_index(4 * c4, row, col)), inside);
      }
    }
  } else {
    constexpr int kChunks = kHaloW / kVec;  // chunks of one row
    using Chunk = std::conditional_t<kVec == 4, cute::uint128_t, uint32_t>;
    using Copy = std::conditional_t<kVec == 4, cute::SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<Chunk>,
                                    cute::SM80_CP_ASYNC_CACHEALWAYS_ZFILL<Chunk>>;
    for (int i = thread; i < kCI * kHaloH * kChunks; i += threads) {
      int const chunk = i % kChunks, row = i / kChunks % kHaloH, ci = i / (kChunks * kHaloH);
      int const w = w0 + kVec * chunk;
      // with kVec = 4, W % 4 == 0 and w % 4 == 0: a chunk is wholly inside or outside
      bool const inside = (rows_inside >> row & 1u) && unsigned(w) < unsigned(prm.W);
      float const *src = inside
          ? prm.x + ((int64_t(tile.n) * kCI + ci) * prm.H + h0 + row) * prm.W + w : prm.x;
      Copy::copy(*reinterpret_cast<Chunk const *>(src),
                 *reinterpret_cast<Chunk *>(smem_x + halo_index(ci, row, kVec * chunk)), inside);
    }
  }
}

__device__ __forceinline__ void mma(float (&d)[4], uint32_t const (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  cute::SM80_16x8x8_F32TF32TF32F32_TN::fma(d[0], d[1], d[2], d[3], a[0], a[1], a[2], a[3], b0,
                                           b1, d[0], d[1], d[2], d[3]);
}

// One A fragment (m16 x k8) from x0, its lane's first element, rounded to TF32 (or split into
// big and small parts): (pixel g, channel t), (g + 8, t), (g, t + 4), (g + 8, t + 4).
__device__ __forceinline__ void load_fragment(float const *x0, uint32_t (&ah)[4],
                                              uint32_t (&al)[4]) {
  float a[4];
  if constexpr (kPairedK) {  // x0 is channel 2t: channels 2t and 2t + 1 of pixels g and g + 8
    float2 const lo = *reinterpret_cast<float2 const *>(x0);
    float2 const hi = *reinterpret_cast<float2 const *>(x0 + halo_index(0, 0, 8));
    a[0] = lo.x, a[1] = hi.x, a[2] = lo.y, a[3] = hi.y;
  } else {
    a[0] = x0[0], a[1] = x0[halo_index(0, 0, 8)], a[2] = x0[halo_index(4, 0, 0)];
    a[3] = x0[halo_index(4, 0, 8)];
  }
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    if constexpr (kThreePass) {
      split(a[e], ah[e], al[e]);
    } else {
      ah[e] = tf32_nearest(a[e]);
    }
  }
}

// The A fragments of k step (r, s, c8) for the warp's m tiles.
__device__ __forceinline__ void load_a(float const *x_lane, int r, int s, int c8,
                                       uint32_t (&ah)[kWarpTilesM][4],
                                       uint32_t (&al)[kWarpTilesM][4]) {
#pragma unroll
  for (int i = 0; i < kWarpTilesM; ++i) {
    load_fragment(x_lane + halo_index(8 * c8, kR - 1 - r + i * kRowStep,
                                      kS - 1 - s + i * kColStep),
                  ah[i], al[i]);
  }
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || !defined(__CUDA_ARCH__)
template <int N> struct WgmmaTf32;  // m64 nN k8, A from registers, B (K-major) from shared memory
template <> struct WgmmaTf32<8> { using Op = cute::SM90::GMMA::MMA_64x8x8_F32TF32TF32_RS_TN<>; };
template <> struct WgmmaTf32<16> { using Op = cute::SM90::GMMA::MMA_64x16x8_F32TF32TF32_RS_TN<>; };
template <> struct WgmmaTf32<32> { using Op = cute::SM90::GMMA::MMA_64x32x8_F32TF32TF32_RS_TN<>; };

// d = a b (accumulate = false) or d += a b.
template <std::size_t... I>
__device__ __forceinline__ void wgmma(uint32_t const (&a)[4], uint64_t desc, float *d,
                                      bool accumulate, std::index_sequence<I...>) {
  WgmmaTf32<kCOBlock>::Op::fma(a[0], a[1], a[2], a[3], desc, d[I]...,
                               accumulate ? cute::SM90::GMMA::ScaleOut::One
                                          : cute::SM90::GMMA::ScaleOut::Zero);
}

__device__ __forceinline__ void fence_accumulators(float (&acc)[kWarpTilesM][kNTiles][4]) {
#pragma unroll
  for (int i = 0; i < kWarpTilesM; ++i)
#pragma unroll
    for (int j = 0; j < kNTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) cute::warpgroup_fence_operand(acc[i][j][e]);
}

// The wgmma main loop. The warpgroup's kWarpTilesM output rows read kWarpTilesM + kR - 1 input
// rows; output row i takes input row h through filter row r = kR - 1 - h + i. So each step
// (input row h, filter column s, c8) loads one A fragment and issues one m64 wgmma for every
// output row that the input row reaches (up to kR) on the filter block of (r, s, c8): each
// fragment is loaded and rounded once per tile, not once per filter row. The fragments load two
// steps ahead into three register sets: when step k is issued, step k - 1 is the only other one
// in flight, and step k + 1's operands are ready. 3xTF32: per output row, the kKSteps steps of
// one (h, s) are one filter tap; its sum (3 wgmma per step, small products first) goes to
// registers of its own, added to the result with fp32 adds (see kTapPartials).
__device__ __forceinline__ void compute_wgmma(float const *x_lane, float const *smem_w,
                                              float (&acc)[kWarpTilesM][kNTiles][4]) {
  constexpr int kSteps = (kWarpTilesM + kR - 1) * kS * kKSteps;
  constexpr uint32_t kBlockBytes = 8 * kCOBlock * sizeof(float);
  // leading: the next 4 k are the next core matrix; stride: the next 8 channels co; no swizzle
  uint64_t const desc = gmma_descriptor(smem_w, 128, 256, 0);
  uint32_t a[3][4], al[3][4];  // TF32 (3xTF32: big) and 3xTF32's small parts
  float part[kThreePass ? kWarpTilesM : 1][kNTiles][4];  // 3xTF32: one filter tap's sums
  constexpr auto kAccumulators = std::make_index_sequence<kCOBlock / 2>{};  // per thread
  auto load_step = [&](int k) {
    int const c8 = k % kKSteps, s = k / kKSteps % kS, h = k / (kKSteps * kS);
    load_fragment(x_lane + halo_index(8 * c8, h, kS - 1 - s), a[k % 3], al[k % 3]);
  };
  load_step(0);
  if (kSteps > 1) load_step(1);
  fence_accumulators(acc);
#pragma unroll
  for (int k = 0; k < kSteps; ++k) {
    int const c8 = k % kKSteps, s = k / kKSteps % kS, h = k / (kKSteps * kS);
    cute::warpgroup_arrive();
#pragma unroll
    for (int i = 0; i < kWarpTilesM; ++i) {
      int const r = kR - 1 - h + i;
      if (r >= 0 && r < kR) {
        uint64_t const block = (r * kS + s) * kKSteps + c8;
        uint64_t const big = desc + (block * kBlockBytes >> 4);
        if constexpr (kThreePass) {  // the tap's sum: small products first; c8 = 0 starts it
          uint64_t const small = big + (kFilterFloats * sizeof(float) >> 4);
          wgmma(al[k % 3], big, &part[i][0][0], c8 > 0, kAccumulators);
          wgmma(a[k % 3], small, &part[i][0][0], true, kAccumulators);
          wgmma(a[k % 3], big, &part[i][0][0], true, kAccumulators);
        } else {
          wgmma(a[k % 3], big, &acc[i][0][0], true, kAccumulators);
        }
      }
    }
    cute::warpgroup_commit_batch();
    if (kThreePass && c8 == kKSteps - 1) {  // the taps of (h, s) are complete: add them up
      cute::warpgroup_wait<0>();
#pragma unroll
      for (int i = 0; i < kWarpTilesM; ++i) {
        int const r = kR - 1 - h + i;
        if (r >= 0 && r < kR) {
#pragma unroll
          for (int j = 0; j < kNTiles; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              cute::warpgroup_fence_operand(part[i][j][e]);
              acc[i][j][e] += part[i][j][e];
            }
        }
      }
    }
    if (k + 2 < kSteps) {
      cute::warpgroup_wait<1>();  // step k - 1 is done: its A registers can be refilled
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        cute::warpgroup_fence_operand(a[(k + 2) % 3][e]);
        cute::warpgroup_fence_operand(al[(k + 2) % 3][e]);
      }
      load_step(k + 2);
    }
  }
  cute::warpgroup_wait<0>();
  fence_accumulators(acc);
}
#endif

// One warp (or, with wgmma, warpgroup): its kWarpTilesM m16 tiles from output pixel (row, col)
// of the tile x the kCOBlock channels of the CTA, over every tap and input channel.
__device__ __forceinline__ void compute(float const *smem_x, float const *smem_w, int row,
                                        int col, int col_shift,
                                        float (&acc)[kWarpTilesM][kNTiles][4]) {
  int const lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  float const *x_lane = smem_x + halo_index(kPairedK ? 2 * t : t, row, col + col_shift + g);
  if constexpr (kWgmma) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    compute_wgmma(x_lane, smem_w, acc);
#endif
    return;
  }
  float2 const *w_lane = reinterpret_cast<float2 const *>(smem_w) + lane;
#pragma unroll
  for (int r = 0; r < kR; ++r) {
#pragma unroll
    for (int s = 0; s < kS; ++s) {
      int const tap = r * kS + s;
      float part[kWarpTilesM][kNTiles][4] = {};
      auto &dst = kTapPartials ? part : acc;
#pragma unroll
      for (int c8 = 0; c8 < kKSteps; ++c8) {
        // B fragments of n tile j: TF32 (bh), or big (bh) and small (bl) parts
        uint32_t bh[kNTiles][2], bl[kNTiles][2];
#pragma unroll
        for (int j = 0; j < kNTiles; ++j) {
          float2 const v = w_lane[((tap * kKSteps + c8) * kNTiles + j) * 32];
          if constexpr (kThreePass) {
            split(v.x, bh[j][0], bl[j][0]);
            split(v.y, bh[j][1], bl[j][1]);
          } else {
            bh[j][0] = tf32_nearest(v.x), bh[j][1] = tf32_nearest(v.y);
          }
        }
        uint32_t ah[kWarpTilesM][4], al[kWarpTilesM][4];
        load_a(x_lane, r, s, c8, ah, al);
        if constexpr (kThreePass) {  // small products first, each pass over all tiles
#pragma unroll
          for (int i = 0; i < kWarpTilesM; ++i)
#pragma unroll
            for (int j = 0; j < kNTiles; ++j) mma(dst[i][j], al[i], bh[j][0], bh[j][1]);
#pragma unroll
          for (int i = 0; i < kWarpTilesM; ++i)
#pragma unroll
            for (int j = 0; j < kNTiles; ++j) mma(dst[i][j], ah[i], bl[j][0], bl[j][1]);
        }
#pragma unroll
        for (int i = 0; i < kWarpTilesM; ++i)
#pragma unroll
          for (int j = 0; j < kNTiles; ++j) mma(dst[i][j], ah[i], bh[j][0], bh[j][1]);
      }
      if constexpr (kTapPartials) {
#pragma unroll
        for (int i = 0; i < kWarpTilesM; ++i)
#pragma unroll
          for (int j = 0; j < kNTiles; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] += part[i][j][e];
      }
    }
  }
}

// Accumulator (m tile i, n tile j, element e) is the pixel at row p0 + i kRowStep, column
// q0 + i kColStep + g + 8 (e / 2), channel 8 j + 2 t + e % 2 of the block (prm.y and prm.bias
// start at the block's first channel).
__device__ __forceinline__ void store(DirectParams const &prm, int n, int p0, int q0,
                                      float (&acc)[kWarpTilesM][kNTiles][4],
                                      float const (&bias)[kNTiles][2]) {
  int const lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int i = 0; i < kWarpTilesM; ++i) {
    int const p = p0 + i * kRowStep;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      int const q = q0 + i * kColStep + g + 8 * half;
      if (p >= prm.P || q >= prm.Q) continue;
#pragma unroll
      for (int j = 0; j < kNTiles; ++j) {
        int const co = 8 * j + 2 * t;
        float const v0 = acc[i][j][2 * half] + bias[j][0];
        float const v1 = acc[i][j][2 * half + 1] + bias[j][1];
        if constexpr (kNhwc) {
          int64_t const pixel = (int64_t(n) * prm.P + p) * prm.Q + q;
          *reinterpret_cast<float2 *>(prm.y + pixel * kCO + co) = make_float2(v0, v1);
        } else {
          int64_t const plane = int64_t(prm.P) * prm.Q;
          float *y = prm.y + (int64_t(n) * kCO + co) * plane + int64_t(p) * prm.Q + q;
          y[0] = v0;
          y[plane] = v1;
        }
      }
    }
  }
}

// NCHW with wgmma: the warpgroup's output rows leave through `stage` (kStageFloats, its own),
// one row at a time, bias added, in 8-byte stores, a warp covering one channel's 64 columns
// (4-byte stores when Q is odd). Named barrier `barrier` (this warpgroup's 128 threads) orders
// the writes and reads of the stage. (p0, q0): the warpgroup's first output pixel.
__device__ void store_staged(DirectParams const &prm, int n, int p0, int q0,
                             float (&acc)[kWarpTilesM][kNTiles][4],
                             float const (&bias)[kNTiles][2], float *stage, int barrier) {
  int const thread = threadIdx.x % 128, warp = thread / 32, g = thread % 32 / 4, t = thread % 4;
  int const columns = min(64, prm.Q - q0);
  int64_t const plane = int64_t(prm.P) * prm.Q;
#pragma unroll
  for (int i = 0; i < kWarpTilesM; ++i) {
    asm volatile("bar.sync %0, 128;\n" ::"r"(barrier) : "memory");  // the last row was read
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      int const col = 16 * warp + g + 8 * half;
#pragma unroll
      for (int j = 0; j < kNTiles; ++j) {
        int const co = 8 * j + 2 * t;
        stage[co * kStageCoPitch + col] = acc[i][j][2 * half] + bias[j][0];
        stage[(co + 1) * kStageCoPitch + col] = acc[i][j][2 * half + 1] + bias[j][1];
      }
    }
    asm volatile("bar.sync %0, 128;\n" ::"r"(barrier) : "memory");  // the row is in place
    int const p = p0 + i;
    if (p >= prm.P) continue;
    float *y = prm.y + int64_t(n) * kCO * plane + int64_t(p) * prm.Q + q0;
    if (prm.Q % 2 == 0) {  // then every (co, p, q0 + col) with even col is 8-byte aligned
#pragma unroll
      for (int k = thread; k < kCOBlock * 32; k += 128) {
        int const co = k / 32, col = 2 * (k % 32);
        if (col < columns) {
          *reinterpret_cast<float2 *>(y + co * plane + col) =
              *reinterpret_cast<float2 const *>(stage + co * kStageCoPitch + col);
        }
      }
    } else {
#pragma unroll 1
      for (int k = thread; k < kCOBlock * 64; k += 128) {
        int const co = k / 64, col = k % 64;
        if (col < columns) y[co * plane + col] = stage[co * kStageCoPitch + col];
      }
    }
  }
}

// Arrive once all cp.async issued so far by this thread have landed.
__device__ __forceinline__ void barrier_arrive_on_copies(uint64_t *bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_address(bar))
               : "memory");
}

// The CTA's place among the CTAs of its channel block, and their number: its tiles are tile
// j = cta() + j ctas(), j = 0, 1, ...
__device__ __forceinline__ int cta() { return blockIdx.x / kCOBlocks; }
__device__ __forceinline__ int ctas() { return gridDim.x / kCOBlocks; }

// Tile j's input goes to
// stage j % kStages, and consumer group j % kConsumers computes it. full[group][stage] completes
// a phase when one of the group's tiles has landed in the stage, empty[stage] when a group has
// read the stage. The loads are issued by the producer warps, or (kProducerWarps = 0, one
// group) by the group itself, kStages - 1 tiles ahead of its math.
constexpr int kLoaderThreads = kProducerWarps > 0 ? kProducerThreads : kGroupThreads;
// A group's tiles in one stage are kLap tiles apart. Each (group, stage) has a full barrier of
// its own, so a group's parity (j / kLap) % 2 names one phase even when kStages % kConsumers != 0
// and the groups take turns at a stage: a shared full[stage] could then be a phase behind
// (another group's tile not landed yet) and its parity would name the wrong phase.
constexpr int kLap = std::lcm(kStages, kConsumers);
static_assert(kProducerWarps > 0 || kConsumers == 1, "without producer warps, one group");

__device__ void load_tile(DirectParams const &prm, int j, float *smem_x, uint64_t *full,
                          uint64_t *empty, int thread) {
  int const t = cta() + j * ctas(), stage = j % kStages;
  if (t >= prm.total_tiles) return;
  barrier_wait(&empty[stage], (j / kStages + 1) % 2);  // its previous tile has been read
  load_halo(prm, tile_at(prm, t), smem_x + stage * kHaloFloats, thread, kLoaderThreads);
  barrier_arrive_on_copies(&full[j % kConsumers * kStages + stage]);
}

__device__ void produce(DirectParams const &prm, float *smem_x, uint64_t *full, uint64_t *empty) {
  for (int j = 0; cta() + j * ctas() < prm.total_tiles; ++j) {
    load_tile(prm, j, smem_x, full, empty, threadIdx.x);
  }
  asm volatile("cp.async.wait_all;\n" ::: "memory");
}

__device__ void consume(DirectParams const &prm, float *smem_x, float const *smem_w,
                        uint64_t *full, uint64_t *empty, float *staging, int group, int warp) {
  int const lane = threadIdx.x % 32;
  int2 const origin = warp_origin(warp);
  int const row = origin.x, col = origin.y;
  float bias[kNTiles][2];
#pragma unroll
  for (int j = 0; j < kNTiles; ++j) {
    int const co = 8 * j + 2 * (lane % 4);
    bias[j][0] = prm.bias ? prm.bias[co] : 0.f;
    bias[j][1] = prm.bias ? prm.bias[co + 1] : 0.f;
  }
  int const thread = threadIdx.x - kProducerThreads - group * kGroupThreads;
  if constexpr (kProducerWarps == 0) {
    for (int j = 0; j < kStages - 1; ++j) load_tile(prm, j, smem_x, full, empty, thread);
  }
  int j = group;
  for (int t = cta() + group * ctas(); t < prm.total_tiles; t += kConsumers * ctas(),
       j += kConsumers) {
    if constexpr (kProducerWarps == 0) {
      load_tile(prm, j + kStages - 1, smem_x, full, empty, thread);
    }
    int const stage = j % kStages;
    Tile const tile = tile_at(prm, t);
    int const start = tile.q0 + prm.pad_w - (kS - 1);
    float acc[kWarpTilesM][kNTiles][4] = {};
    barrier_wait(&full[group * kStages + stage], (j / kLap) % 2);
    compute(smem_x + stage * kHaloFloats, smem_w, row, col, start - halo_col0(prm, tile), acc);
    barrier_arrive(&empty[stage]);  // the group's reads of the stage are done
    if constexpr (kStagedStore) {
      int const warpgroup = (threadIdx.x - kProducerThreads) / 128;
      store_staged(prm, tile.n, tile.p0 + row, tile.q0 + col - 16 * (warp % 4), acc, bias,
                   staging + warpgroup * kStageFloats, 1 + warpgroup);
    } else {
      store(prm, tile.n, tile.p0 + row, tile.q0 + col, acc, bias);
    }
  }
  if constexpr (kProducerWarps == 0) asm volatile("cp.async.wait_all;\n" ::: "memory");
}

}  // namespace

// The grid is a multiple of kCOBlocks (DirectKernel.plan, families/direct.py).
extern "C" __global__ void __launch_bounds__(kThreads, 1)
cutlass_convt_direct_kernel(DirectParams const params) {
  // the CTA's channel block: the filter, bias and output from its first channel on
  int const co0 = blockIdx.x % kCOBlocks * kCOBlock;
  DirectParams prm = params;
  prm.w += co0 * kR * kS;
  if (prm.bias) prm.bias += co0;
  prm.y += kNhwc ? co0 : co0 * (int64_t(prm.P) * prm.Q);
  extern __shared__ __align__(16) float smem[];
  float *smem_w = smem;
  float *smem_x = smem + kFilterCopies * kFilterFloats;  // kStages buffers of kHaloFloats
  // full[group][stage], then empty[stage]
  uint64_t *full = reinterpret_cast<uint64_t *>(smem_x + kStages * kHaloFloats);
  uint64_t *empty = full + kConsumers * kStages;
  float *staging = reinterpret_cast<float *>(empty + kStages);  // kStagedWarpgroups stages

  stage_filter(prm.w, smem_w);
  if (threadIdx.x < kConsumers * kStages) barrier_init(&full[threadIdx.x], kLoaderThreads);
  if (threadIdx.x < kStages) barrier_init(&empty[threadIdx.x], kGroupThreads);
  __syncthreads();  // the filter and the barriers are in place
  int const warp = threadIdx.x / 32;
  if (warp < kProducerWarps) {
    produce(prm, smem_x, full, empty);
  } else {
    int const consumer_warp = warp - kProducerWarps;
    consume(prm, smem_x, smem_w, full, empty, staging, consumer_warp / kGroupWarps,
            consumer_warp % kGroupWarps);
  }
}
