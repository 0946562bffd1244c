// cutlass_convt: the phase family's kernels (families/phase.py; docs/design/phase.md). A
// transposed convolution of stride (s_h, s_w) as stride-1 implicit GEMMs over its phase grid:
// output pixel (oh, ow) has phase (ph, pw) = ((oh + pad_h) % s_h, (ow + pad_w) % s_w) and
// phase-grid position J = (oh + pad_h) / s_h, I = (ow + pad_w) / s_w; it sums
// x[n, J - uh, I - uw, c] over taps (uh, uw) < (kTH, kTW) and input channels c, times the
// filter element that tap and phase pick (zero where the phase has no such tap):
//
//   y[n, k, J s_h + ph - pad_h, I s_w + pw - pad_w] = bias[k] +
//       sum_{uh, uw, c} x[n, c, J - uh, I - uw] * B[(ph, pw, k), (uh, uw, c)]
//
// with B[(ph, pw, k), (uh, uw, c)] = w[c, k, (uh s_h + ph) / d_h, (uw s_w + pw) / d_w] where the
// divisions are exact and the quotients below (R, S), else 0 (cutlass_convt_phase_filter).
// GEMM: M = phase-grid pixels, N = s_h s_w K columns (phase-major), K = taps x C. A CTA computes
// a tile of kTN images x kBH x kBW phase-grid pixels (M = 128, a warpgroup's 64 rows each) by
// kBN columns. Two grids (PhaseParams::exact):
// - unified: one grid for every phase, J from floor(pad_h / s_h); a tile's columns may span
//   phases (small K);
// - exact (dilation 1): a tile's columns lie in one phase (K % kBN == 0), its grid starts at
//   that phase's first J, ceil((pad_h - ph) / s_h), and it runs only that phase's
//   taps, ceil((R - ph) / s_h) x ceil((S - pw) / s_w), not the zero ones.
// - Warp 8 (lane 0; warpgroup 2 is the producer's) loads by TMA, per chunk of 32 input
//   channels, one box of the input pixels the tile's taps reach, kTN x (kBH + kTH - 1) x
//   (kBW + kTW - 1) pixels x 32 channels, 128-byte swizzled [pixel][channel], zero outside the
//   images, into a ring of kStagesA slots; and per (chunk, tap) the filter block B (kBN columns
//   x 32 channels, the same swizzle) into a ring of kStagesB slots. Persistent CTAs walk tiles
//   blockIdx.x, + gridDim.x, ...; the producer runs ahead into the next tile while the
//   consumers store.
// - Warpgroups 0 and 1 read their A fragments from the box with the tap's shift (wgmma's RS
//   form: x as A from registers, rounded to TF32 there, 3xTF32 split into big and small parts),
//   and issue one wgmma m64nkBNk8 per 8 channels, a commit group per (chunk, tap). 3xTF32: each
//   group accumulates afresh and is added to the running sums on the CUDA cores (round to
//   nearest), since wgmma's own accumulation of many groups misses fp32's 1e-6.
// - Epilogue: accumulators plus bias to y by the threads (NHWC 8-byte pairs where K is even,
//   NCHW single floats), masked outside the output.
// 16-bit elements (kHalf, kBf16): chunks of 64 channels, wgmma k16 on the words as read, y and
// bias in that type. Invariants: the ring slots are 1024-byte aligned (the swizzle); B's rows
// are K-major with 128 bytes (kChunk channels) per row and per (chunk, tap); x's channels per
// group make 16-byte TMA strides (a multiple of 4 floats or 8 16-bit elements).
#include <cstdint>
#include <type_traits>
#include <utility>

#include "common.cuh"  // tf32_nearest, mbarrier helpers, fence_async_shared, gmma_descriptor
#include "config.h"    // kTN kBH kBW kTH kTW kBN kStagesA kStagesB kMinBlocks kSharedBytes
                       // kThreePass kNchwOut kHalf kBf16 (from PhaseConfig)
#include "cute/arch/copy_sm90_tma.hpp"
#include "cute/arch/mma_sm90_desc.hpp"
#include "cute/arch/mma_sm90_gmma.hpp"
#include "cute/arch/mma_sm90_gmma_ext.hpp"
#include "cutlass/arch/reg_reconfig.h"
#include "element.cuh"  // Element, kSixteen, to_float, from_float, store_pair

namespace {

// A box row and a filter row are 128 bytes: kChunk channels (element.cuh's Element).
static_assert(!(kSixteen && kThreePass), "3xTF32 is fp32's");
constexpr int kChunk = 128 / int(sizeof(Element));

constexpr int kM = 128;  // tile pixels: two consumer warpgroups of 64 rows
static_assert(kTN * kBH * kBW == kM && kBW % 8 == 0, "a tile of 128 pixels, 8-pixel rows");
static_assert(kBN % 8 == 0 && kBN >= 8 && kBN <= 256, "wgmma's N");
constexpr int kTaps = kTH * kTW;
constexpr int kBoxH = kBH + kTH - 1, kBoxW = kBW + kTW - 1;
constexpr int kBoxPixels = kTN * kBoxH * kBoxW;
constexpr int kSlotA = (kBoxPixels * 128 + 1023) / 1024 * 1024;  // bytes
constexpr int kParts = kThreePass ? 2 : 1;  // B's big parts, then (3xTF32) its small ones
constexpr int kSlotB = kParts * kBN * 128;  // bytes, a multiple of 1024
constexpr int kBarriers = 2 * (kStagesA + kStagesB);
static_assert(kStagesA * kSlotA + kStagesB * kSlotB + 8 * kBarriers == kSharedBytes,
              "shared memory layout differs from PhaseConfig's");
constexpr int kThreads = 384;  // two consumer warpgroups and the producer's warpgroup
constexpr int kConsumerWarps = 8;
// Registers a thread after setmaxnreg: an SM's 4 register partitions of 16384 hold each CTA's
// warps a quarter each, so one CTA (launched at 168) moves 128 from each producer thread to
// 64 more for each consumer thread; two CTAs (launched at 80) keep 24 and 104.
constexpr int kProducerRegs = kMinBlocks == 2 ? 24 : 40;
constexpr int kConsumerRegs = kMinBlocks == 2 ? 104 : 232;
constexpr int kLaunchRegs = kMinBlocks == 2 ? 80 : 168;
static_assert(kProducerRegs + 2 * kConsumerRegs <= 3 * kLaunchRegs, "the CTA's register pool");

// The wgmma of kBN columns: TF32 x TF32 (k8), F16 x F16 or BF16 x BF16 (k16) -> f32, A from
// registers, B K-major in shared memory. A k step reads 32 bytes of a 128-byte row either way.
template <int N>
struct RsOp;
#define CUTLASS_CONVT_RS_OP(N)                                                          \
  template <>                                                                           \
  struct RsOp<N> {                                                                      \
    using type = std::conditional_t<                                                    \
        kBf16,                                                                          \
        cute::SM90::GMMA::MMA_64x##N##x16_F32BF16BF16_RS<cute::SM90::GMMA::Major::K,    \
                                                         cute::SM90::GMMA::Major::K>,   \
        std::conditional_t<                                                             \
            kHalf,                                                                      \
            cute::SM90::GMMA::MMA_64x##N##x16_F32F16F16_RS<cute::SM90::GMMA::Major::K,  \
                                                           cute::SM90::GMMA::Major::K>, \
            cute::SM90::GMMA::MMA_64x##N##x8_F32TF32TF32_RS_TN<>>>;                    \
  };
CUTLASS_CONVT_RS_OP(8) CUTLASS_CONVT_RS_OP(16) CUTLASS_CONVT_RS_OP(24) CUTLASS_CONVT_RS_OP(32)
CUTLASS_CONVT_RS_OP(40) CUTLASS_CONVT_RS_OP(48) CUTLASS_CONVT_RS_OP(56) CUTLASS_CONVT_RS_OP(64)
CUTLASS_CONVT_RS_OP(72) CUTLASS_CONVT_RS_OP(80) CUTLASS_CONVT_RS_OP(88) CUTLASS_CONVT_RS_OP(96)
CUTLASS_CONVT_RS_OP(104) CUTLASS_CONVT_RS_OP(112) CUTLASS_CONVT_RS_OP(120)
CUTLASS_CONVT_RS_OP(128) CUTLASS_CONVT_RS_OP(136) CUTLASS_CONVT_RS_OP(144)
CUTLASS_CONVT_RS_OP(152) CUTLASS_CONVT_RS_OP(160) CUTLASS_CONVT_RS_OP(168)
CUTLASS_CONVT_RS_OP(176) CUTLASS_CONVT_RS_OP(184) CUTLASS_CONVT_RS_OP(192)
CUTLASS_CONVT_RS_OP(200) CUTLASS_CONVT_RS_OP(208) CUTLASS_CONVT_RS_OP(216)
CUTLASS_CONVT_RS_OP(224) CUTLASS_CONVT_RS_OP(232) CUTLASS_CONVT_RS_OP(240)
CUTLASS_CONVT_RS_OP(248) CUTLASS_CONVT_RS_OP(256)
#undef CUTLASS_CONVT_RS_OP
using Op = typename RsOp<kBN>::type;
constexpr int kAcc = kBN / 2;  // accumulators a thread

template <std::size_t... I>
__device__ __forceinline__ void wgmma(uint32_t const (&a)[4], uint64_t db, float (&d)[kAcc],
                                      bool accumulate, std::index_sequence<I...>) {
  Op::fma(a[0], a[1], a[2], a[3], db, d[I]...,
          accumulate ? cute::SM90::GMMA::ScaleOut::One : cute::SM90::GMMA::ScaleOut::Zero);
}

// Kernel argument, passed by value before the two tensor maps. families/phase.py packs it
// (PHASE_PARAMS).
struct PhaseParams {
  Element *y;            // NHWC or NCHW (kNchwOut), packed, K_total channels
  Element const *bias;   // (K_total,) or null
  int N, P, Q;         // y's batch and size
  int K, K_total;      // output channels per group, in all
  int s_h, s_w, pad_h, pad_w;
  int J0, I0;          // the unified grid's first position, floor(pad / s)
  int tiles_j, tiles_i, tiles_n;  // tiles of the grid's rows and columns, ceil(s_h s_w K / kBN)
  int tiles_b;         // ceil(N / kTN)
  int chunks;          // ceil(C / kChunk), C the input channels per group
  int G;               // groups
  int R, S;            // the filter's size
  int exact;           // 0: the unified grid; 1: each tile's phase's own grid (J0, I0 unused)
                       // and only its own taps (dilation 1)
};
static_assert(sizeof(PhaseParams) == 2 * 8 + 20 * 4, "families/phase.py packs 2 pointers and "
              "20 ints");

// Arrive, and expect `bytes` more of TMA transactions in this phase.
__device__ __forceinline__ void barrier_expect_bytes(uint64_t *bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_address(bar)),
               "r"(bytes)
               : "memory");
}

struct Tile {
  int n0, g, j0, i0, col0;  // first image, group, phase-grid origin (J, I), first column
  int th, tw;               // taps (0: the tile's phase has none, y = bias)
};

// a / b rounded up, for b > 0 and any a (C++ division truncates toward zero)
__device__ __forceinline__ int ceil_div(int a, int b) { return a > 0 ? (a + b - 1) / b : a / b; }

// Tile `index` of the sequence (group, image block, tile row, tile column, column block), the
// column block fastest (the CTAs of one input box run at once: its reloads hit L2).
__device__ __forceinline__ Tile tile_of(PhaseParams const &p, int index) {
  int const nt = index % p.tiles_n;
  index /= p.tiles_n;
  int const it = index % p.tiles_i;
  index /= p.tiles_i;
  int const jt = index % p.tiles_j;
  index /= p.tiles_j;
  Tile t{kTN * (index % p.tiles_b), index / p.tiles_b, p.J0 + jt * kBH, p.I0 + it * kBW,
         nt * kBN, kTH, kTW};
  if (p.exact) {
    int const phase = t.col0 / p.K, ph = phase / p.s_w, pw = phase % p.s_w;
    t.j0 = ceil_div(p.pad_h - ph, p.s_h) + jt * kBH;
    t.i0 = ceil_div(p.pad_w - pw, p.s_w) + it * kBW;
    t.th = min(kTH, max(0, ceil_div(p.R - ph, p.s_h)));
    t.tw = min(kTW, max(0, ceil_div(p.S - pw, p.s_w)));
  }
  return t;
}

__device__ __forceinline__ int tile_count(PhaseParams const &p) {
  return p.tiles_j * p.tiles_i * p.tiles_n * p.tiles_b * p.G;
}

// B's (unified) tap index of the tile's tap `tap`: (uh, uw) = (tap / tw, tap % tw).
__device__ __forceinline__ int unified_tap(Tile const &t, int tap) {
  return (tap / t.tw) * kTW + tap % t.tw;
}

// Warp 8, lane 0: the CTA's tiles (blockIdx.x, + gridDim.x, ...), every chunk's input box and
// its taps' filter blocks, in the consumers' order; ca and gb count the CTA's loads of boxes
// and filter blocks (their ring slots and phases).
__device__ void produce(PhaseParams const &p, cute::TmaDescriptor const *tmap_x,
                        cute::TmaDescriptor const *tmap_b, char *ring_a, char *ring_b,
                        uint64_t *full_a, uint64_t *empty_a, uint64_t *full_b, uint64_t *empty_b) {
  using Hint = cute::TMA::CacheHintSm90;
  uint32_t ca = 0, gb = 0;
  for (int index = blockIdx.x; index < tile_count(p); index += gridDim.x) {
    Tile const t = tile_of(p, index);
    int const taps = t.th * t.tw;
    if (taps == 0) continue;
    int const ih0 = t.j0 - (kTH - 1), iw0 = t.i0 - (kTW - 1);
    for (int c = 0; c < p.chunks; ++c, ++ca) {
      int const a = ca % kStagesA;
      barrier_wait(&empty_a[a], (ca / kStagesA + 1) % 2);
      barrier_expect_bytes(&full_a[a], kBoxPixels * 128);
      cute::SM90_TMA_LOAD_5D::copy(tmap_x, &full_a[a], uint64_t(Hint::EVICT_NORMAL),
                                   ring_a + a * kSlotA, kChunk * c, t.g, iw0, ih0, t.n0);
      for (int tap = 0; tap < taps; ++tap, ++gb) {
        int const b = gb % kStagesB;
        barrier_wait(&empty_b[b], (gb / kStagesB + 1) % 2);
        barrier_expect_bytes(&full_b[b], kSlotB);
        for (int part = 0; part < kParts; ++part)
          cute::SM90_TMA_LOAD_4D::copy(tmap_b, &full_b[b], uint64_t(Hint::EVICT_LAST),
                                       ring_b + b * kSlotB + part * kBN * 128,
                                       (unified_tap(t, tap) * p.chunks + c) * kChunk, t.col0,
                                       t.g,
                                       part);
      }
    }
  }
}

// Epilogue of one tile: accumulators plus bias to y; column col = (ph s_w + pw) K + k of
// pixel (J, I), written where the output has it.
__device__ __forceinline__ void store(PhaseParams const &p, Tile const &t, float const (&d)[kAcc],
                                      int m0, int t4) {
  int const ncols = p.s_h * p.s_w * p.K;
  long long const plane = (long long)p.P * p.Q;
  int J[2], I[2], n[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    int const m = m0 + 8 * h;
    n[h] = t.n0 + m / (kBH * kBW);
    J[h] = t.j0 + m / kBW % kBH;
    I[h] = t.i0 + m % kBW;
  }
#pragma unroll
  for (int j = 0; j < kBN / 8; ++j) {
    int const col = t.col0 + 8 * j + 2 * t4;
    if (col >= ncols) continue;
    bool const pair = p.K % 2 == 0;  // then col + 1 is the same phase's next channel
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      if (pair && e == 1) break;
      int const cc = col + e;
      if (cc >= ncols) break;
      int const k = cc % p.K, phase = cc / p.K;
      int const ph = phase / p.s_w, pw = phase % p.s_w, ko = t.g * p.K + k;
      float const b0 = p.bias ? to_float(p.bias[ko]) : 0.f;
      float const b1 = pair && p.bias ? to_float(p.bias[ko + 1]) : 0.f;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        int const oh = J[h] * p.s_h + ph - p.pad_h, ow = I[h] * p.s_w + pw - p.pad_w;
        if (n[h] >= p.N || oh < 0 || oh >= p.P || ow < 0 || ow >= p.Q) continue;
        float const v0 = d[4 * j + 2 * h + e] + b0;
        if constexpr (kNchwOut) {
          Element *const out = p.y + ((long long)n[h] * p.K_total + ko) * plane +
                               (long long)oh * p.Q + ow;
          out[0] = from_float(v0);
          if (pair) out[plane] = from_float(d[4 * j + 2 * h + 1] + b1);
        } else {
          Element *const out = p.y + (((long long)n[h] * p.P + oh) * p.Q + ow) * p.K_total + ko;
          if (pair)
            store_pair(out, v0, d[4 * j + 2 * h + 1] + b1);
          else
            out[0] = from_float(v0);
        }
      }
    }
  }
}

// A consumer thread's A fragments of one (chunk, tap) group, [k8 step][fragment] (3xTF32: the
// big parts in one set, the small ones in another).
using Fragments = uint32_t[4][4];

// Consumer warpgroup wg (0 or 1) of the CTA's tiles: tile rows 64 wg ... 64 wg + 63.
// Fragments come in two sets, by the parity of the group, indexed at compile time: a group's
// set stays untouched until its wgmmas are done. TF32: group i + 1's fragments are read after
// wait<1> of group i (group i - 1 done), and every group accumulates into d. 3xTF32: group
// i + 1's fragments are read while group i runs; each group accumulates afresh into dg, which
// is added to d after wait<0> (ptxas serializes wgmmas whose accumulators are read earlier).
__device__ void consume(PhaseParams const &p, char const *ring_a, char const *ring_b,
                        uint64_t *full_a, uint64_t *empty_a, uint64_t *full_b, uint64_t *empty_b,
                        int wg) {
  int const lane = threadIdx.x % 32, warp = threadIdx.x / 32 % 4;
  int const t4 = lane % 4;
  // the thread's two tile rows m and m + 8 (image m / (kBH kBW), pixel (m / kBW % kBH,
  // m % kBW)): their box rows at tap (0, 0) are ((img kBoxH + jh + kTH - 1) kBoxW + iw +
  // kTW - 1; tap (uh, uw) is uh kBoxW + uw fewer
  int const m0 = 64 * wg + 16 * warp + lane / 4;
  int rho[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    int const m = m0 + 8 * h;
    rho[h] = ((m / (kBH * kBW)) * kBoxH + m / kBW % kBH + kTH - 1) * kBoxW + m % kBW + kTW - 1;
  }
  float d[kAcc];                    // the tile's sums (TF32: wgmma's accumulators)
  float dg[kAcc];                   // 3xTF32: one group's products (TF32: unused)
  Fragments a[2], al[kThreePass ? 2 : 1];
  uint32_t ca = 0, gb = 0;
  // Group i of tile t: its fragments from the box, rounded (3xTF32: split); the box's slot
  // released after its last tap's reads.
  auto load = [&](Tile const &t, int i, Fragments &frag, Fragments &small) {
    int const taps = t.th * t.tw, c = i / taps, tap = i % taps;
    uint32_t const ga = ca + c;
    int const sa = ga % kStagesA;
    if (tap == 0) barrier_wait(&full_a[sa], (ga / kStagesA) % 2);
    uint32_t const *box = reinterpret_cast<uint32_t const *>(ring_a + sa * kSlotA);
    int const shift = (tap / t.tw) * kBoxW + tap % t.tw;
#pragma unroll
    for (int k = 0; k < 4; ++k)
#pragma unroll
      for (int f = 0; f < 4; ++f) {
        cute::warpgroup_fence_operand(frag[k][f]);
        if constexpr (kThreePass) cute::warpgroup_fence_operand(small[k][f]);
      }
#pragma unroll
    for (int k = 0; k < 4; ++k) {
#pragma unroll
      for (int f = 0; f < 4; ++f) {
        int const row = rho[f % 2] - shift, chunk = 2 * k + f / 2;  // 16-byte chunk of the row
        // a 4-byte word: one float (TF32: rounded here) or two 16-bit channels
        uint32_t const word = box[row * 32 + ((chunk ^ (row % 8)) * 4) + t4];
        if constexpr (kSixteen) {
          frag[k][f] = word;
        } else {
          float const v = __uint_as_float(word);
          uint32_t const big = tf32_nearest(v);
          frag[k][f] = big;
          if constexpr (kThreePass) small[k][f] = tf32_nearest(v - __uint_as_float(big));
        }
      }
    }
    if (tap == taps - 1) {  // the box's last reads are in registers: release its slot
      // The TMA write that refills the slot (async proxy) must follow these ld.shared reads
      // (generic proxy): without the proxy fence it overtook them (wrong tiles at scale).
      fence_async_shared();
      __syncwarp();
      if (lane == 0) barrier_arrive(&empty_a[sa]);
    }
  };
  // Group i's wgmmas (4 k8 steps; 3xTF32: small x big, big x small, big x big each) into acc
  // (3xTF32: afresh), one commit group.
  auto issue = [&](int i, Fragments &frag, Fragments &small, float(&acc)[kAcc]) {
    uint32_t const g = gb + i;
    int const sb = g % kStagesB;
    barrier_wait(&full_b[sb], (g / kStagesB) % 2);
    uint64_t const desc = gmma_descriptor(ring_b + sb * kSlotB, 16, 1024, 1);
#pragma unroll
    for (int k = 0; k < 4; ++k)
#pragma unroll
      for (int f = 0; f < 4; ++f) {
        cute::warpgroup_fence_operand(frag[k][f]);
        if constexpr (kThreePass) cute::warpgroup_fence_operand(small[k][f]);
      }
#pragma unroll
    for (int e = 0; e < kAcc; ++e) cute::warpgroup_fence_operand(acc[e]);
    cute::warpgroup_arrive();
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      uint64_t const big = desc + ((32 * k) >> 4);
      if constexpr (kThreePass) {
        uint64_t const lower = big + ((kBN * 128) >> 4);
        wgmma(small[k], big, acc, k > 0, std::make_index_sequence<kAcc>{});
        wgmma(frag[k], lower, acc, true, std::make_index_sequence<kAcc>{});
      }
      wgmma(frag[k], big, acc, true, std::make_index_sequence<kAcc>{});
    }
    cute::warpgroup_commit_batch();
  };
  auto release_b = [&](int i) {
    __syncwarp();
    if (lane == 0) barrier_arrive(&empty_b[(gb + i) % kStagesB]);
  };
  // One group, TF32: group i - 1 done after wait<1> frees its set and slot.
  auto step_tf32 = [&](Tile const &t, int i, Fragments &frag) {
    load(t, i, frag, frag);
    issue(i, frag, frag, d);
    cute::warpgroup_wait<1>();
#pragma unroll
    for (int e = 0; e < kAcc; ++e) cute::warpgroup_fence_operand(d[e]);
    if (i > 0) release_b(i - 1);
  };
  // One group, 3xTF32 (its fragments loaded): the next group's fragments read while it runs,
  // then its products added to d.
  auto step_fp32 = [&](Tile const &t, int i, int groups, Fragments &frag, Fragments &small,
                       Fragments &next, Fragments &next_small) {
    issue(i, frag, small, dg);
    if (i + 1 < groups) load(t, i + 1, next, next_small);
    cute::warpgroup_wait<0>();
#pragma unroll
    for (int e = 0; e < kAcc; ++e) {
      cute::warpgroup_fence_operand(dg[e]);
      d[e] += dg[e];
    }
    release_b(i);
  };
  for (int index = blockIdx.x; index < tile_count(p); index += gridDim.x) {
    Tile const t = tile_of(p, index);
    int const groups = p.chunks * t.th * t.tw;
#pragma unroll
    for (int e = 0; e < kAcc; ++e) d[e] = 0.f;
    if constexpr (kThreePass) {
      if (groups > 0) load(t, 0, a[0], al[0]);
      int i = 0;
      for (; i + 1 < groups; i += 2) {
        step_fp32(t, i, groups, a[0], al[0], a[1], al[1]);
        step_fp32(t, i + 1, groups, a[1], al[1], a[0], al[0]);
      }
      if (i < groups) step_fp32(t, i, groups, a[0], al[0], a[1], al[1]);
    } else {
      int i = 0;
      for (; i + 1 < groups; i += 2) {
        step_tf32(t, i, a[0]);
        step_tf32(t, i + 1, a[1]);
      }
      if (i < groups) step_tf32(t, i, a[0]);  // (group i - 1, on a[1], may still run)
      cute::warpgroup_wait<0>();
#pragma unroll
      for (int e = 0; e < kAcc; ++e) cute::warpgroup_fence_operand(d[e]);
      if (groups > 0) release_b(groups - 1);
    }
    ca += groups > 0 ? p.chunks : 0;
    gb += groups;
    store(p, t, d, m0, t4);
  }
}

}  // namespace

// tmap_x: x as (C, G, W, H, N) (C the channels per group), box (kChunk, 1, kBoxW, kBoxH, kTN);
// tmap_b: the prepared filter as (kTaps x chunks x kChunk, s_h s_w K, G, parts), box (kChunk,
// kBN, 1, 1); both of Element, 128-byte swizzle, zero fill. Persistent: any grid, 384 threads.
extern "C" __global__ void __launch_bounds__(kThreads, kMinBlocks)
cutlass_convt_phase_kernel(PhaseParams const p, __grid_constant__ cute::TmaDescriptor const tmap_x,
                           __grid_constant__ cute::TmaDescriptor const tmap_b) {
  extern __shared__ __align__(1024) char smem[];
  if (smem_address(smem) % 1024 != 0) __trap();  // the 128-byte swizzle's rows need it
  char *ring_a = smem;
  char *ring_b = ring_a + kStagesA * kSlotA;
  uint64_t *full_a = reinterpret_cast<uint64_t *>(ring_b + kStagesB * kSlotB);
  uint64_t *empty_a = full_a + kStagesA, *full_b = empty_a + kStagesA;
  uint64_t *empty_b = full_b + kStagesB;
  if (threadIdx.x < kStagesA) {
    barrier_init(&full_a[threadIdx.x], 1);
    barrier_init(&empty_a[threadIdx.x], kConsumerWarps);
  }
  if (threadIdx.x < kStagesB) {
    barrier_init(&full_b[threadIdx.x], 1);
    barrier_init(&empty_b[threadIdx.x], kConsumerWarps);
  }
  fence_async_shared();
  __syncthreads();
  int const warp = threadIdx.x / 32;
  if (warp >= kConsumerWarps) {
    cutlass::arch::warpgroup_reg_dealloc<kProducerRegs>();
    if (threadIdx.x == 32 * kConsumerWarps)
      produce(p, &tmap_x, &tmap_b, ring_a, ring_b, full_a, empty_a, full_b, empty_b);
  } else {
    cutlass::arch::warpgroup_reg_alloc<kConsumerRegs>();
    consume(p, ring_a, ring_b, full_a, empty_a, full_b, empty_b, warp / 4);
  }
}

// The filter as the kernel's B, for one call: b[part][g][col][(tap chunks + c / kChunk) kChunk +
// c % kChunk] = the TF32 value (part 0; 3xTF32: part 1 the TF32 rest; 16-bit: the value itself)
// of w[g C + c, k, r, s] for column
// col = (ph s_w + pw) K + k and tap (uh, uw), r = (uh s_h + ph) / d_h, s = (uw s_w + pw) / d_w
// where those are exact and inside the filter and c < C; else 0. w is PyTorch's
// (G C, K, R, S), packed. One thread per element of b's parts-0 layout.
struct FilterParams {
  Element const *w;
  Element *b;
  int G, C, K, R, S, s_h, s_w, d_h, d_w, chunks;
};

extern "C" __global__ void __launch_bounds__(256)
cutlass_convt_phase_filter(FilterParams const p) {
  int const cpad = kChunk * p.chunks, kd = kTaps * cpad, ncols = p.s_h * p.s_w * p.K;
  long long const total = (long long)p.G * ncols * kd;
  for (long long i = blockIdx.x * 256LL + threadIdx.x; i < total; i += 256LL * gridDim.x) {
    int const within = int(i % kd);
    long long const row = i / kd;
    int const col = int(row % ncols), g = int(row / ncols);
    int const tap = within / cpad, c = within % cpad;
    int const uh = tap / kTW, uw = tap % kTW, k = col % p.K, phase = col / p.K;
    int const ph = phase / p.s_w, pw = phase % p.s_w;
    int const rh = uh * p.s_h + ph, rw = uw * p.s_w + pw;
    float v = 0.f;
    if (c < p.C && rh % p.d_h == 0 && rw % p.d_w == 0 && rh / p.d_h < p.R && rw / p.d_w < p.S)
      v = to_float(
          p.w[(((long long)(g * p.C + c) * p.K + k) * p.R + rh / p.d_h) * p.S + rw / p.d_w]);
    if constexpr (kSixteen) {
      p.b[i] = from_float(v);  // exact: v is an element
    } else {
      uint32_t const big = tf32_nearest(v);
      p.b[i] = __uint_as_float(big);
      if constexpr (kThreePass)
        p.b[total + i] = __uint_as_float(tf32_nearest(v - __uint_as_float(big)));
    }
  }
}
