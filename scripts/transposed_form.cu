// The "transposed form" of problem 71's stride-1 transposed convolution, as a standalone
// measurement (docs/perf-notes.md, v0.7): wgmma's A operand is the filter (M = 64 = 2 output
// rows x 32 output channels, a stack of [W(r, s); W(r + 1, s)] blocks with zero blocks at the
// ends, in shared memory), B the input (N = kN output columns, K-major [c4][pixel][4] rows in
// shared memory, the filter column s a 16-byte shift of the descriptor's start address), so one
// m64n104k8 replaces 3.25 m64n32k8 of the direct family. Each CTA walks vertical strips of kN
// columns (pairs of output rows, top to bottom) with a ring of input rows that two consumer
// warpgroups share (each interior row serves two pairs); a producer warpgroup loads rows with
// ld.global, rounds them to TF32 and stores them transposed to that layout.
//
// Knobs (-D): NHWC (0 NCHW, 1 NHWC), TILE_N (104), RING (rows, 10), BATCH (rows per producer
// step, 2), LOADMAP (NCHW producer lane order), ASYNC (1: the producer copies with cp.async,
// DEPTH rows in flight, and rounds the chunks it copied once they land), STAGED (1: output rows
// leave through shared memory in coalesced 16- / 8-byte stores), NOSTORE (skip the epilogue:
// timing only), ALIGNB (128-byte aligned B, an unshifted even pitch: timing only). Prints the
// error against a float64 reference on the GPU, the median kernel time (L2 flushed) and a
// copy of x.
//
//   nvcc -std=c++20 -O3 -arch=sm_90a --expt-relaxed-constexpr -I<cutlass include> -DNHWC=1 \
//        -o transposed_form scripts/transposed_form.cu && ./transposed_form [N H W pad]
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <utility>
#include <cmath>
#include "cute/arch/util.hpp"
#include "cute/arch/mma_sm90_desc.hpp"
#include "cute/arch/mma_sm90_gmma.hpp"
#include "cute/arch/mma_sm90_gmma_ext.hpp"

#ifndef NHWC
#define NHWC 0
#endif
#ifndef TILE_N
#define TILE_N 104
#endif
constexpr bool kNhwc = NHWC;
constexpr int kCI = 32, kCO = 32, kR = 3, kS = 3;
constexpr int kN = TILE_N;
constexpr int kQ = 64 / kCO;                     // output rows per accumulator
#ifndef RING
#define RING 10
#endif
constexpr int kRing = RING;  // input rows in the CTA's ring (both consumers)
constexpr int kPix = (kN + kS - 1 + 3 + 3) / 4 * 4;  // staged columns (4-aligned start)
#ifdef ALIGNB
constexpr int kPitch = kPix;
#else
constexpr int kPitch = kPix | 1;                 // pixels per c4 plane, odd
#endif
constexpr int kRowFloats = kCI / 4 * kPitch * 4;
constexpr int kBlocks = (kQ - 1) + kS * (kR + kQ - 1);
constexpr int kAFloats = kBlocks * kCO * kCI;
constexpr int kConsumers = 2;
constexpr int kThreads = 128 * (1 + kConsumers);
#ifndef STAGED
#define STAGED 0
#endif
#ifndef ASYNC
#define ASYNC 0
#endif
#ifndef DEPTH
#define DEPTH 4
#endif
constexpr int kStageFloats = STAGED ? kN * kCO : 0;  // one output row per consumer
constexpr int kSmemBytes = 4 * (kAFloats + kRing * kRowFloats + kConsumers * kStageFloats) + 2 * kRing * 8;
static_assert(kR == 3, "prototype: each interior row serves two pairs");

template <int N> struct Op;
template <> struct Op<104> { using T = cute::SM90::GMMA::MMA_64x104x8_F32TF32TF32_SS_TN<>; };
template <> struct Op<96> { using T = cute::SM90::GMMA::MMA_64x96x8_F32TF32TF32_SS_TN<>; };
template <> struct Op<128> { using T = cute::SM90::GMMA::MMA_64x128x8_F32TF32TF32_SS_TN<>; };
template <> struct Op<120> { using T = cute::SM90::GMMA::MMA_64x120x8_F32TF32TF32_SS_TN<>; };
template <> struct Op<88> { using T = cute::SM90::GMMA::MMA_64x88x8_F32TF32TF32_SS_TN<>; };
constexpr int kAcc = kN / 2;

struct Params {
  float const *x; float const *w; float const *bias; float *y;
  int N, H, W, P, Q, pad_h, pad_w, strips, pairs;
};

__device__ __forceinline__ uint32_t tf32_nearest(float v) {
  return (__float_as_uint(v) + 0x1000u) & 0xffffe000u;
}
__device__ __forceinline__ uint32_t smem_address(void const *p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void barrier_init(uint64_t *bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_address(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void barrier_arrive(uint64_t *bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_address(bar)) : "memory");
}
__device__ __forceinline__ void barrier_wait(uint64_t *bar, uint32_t parity) {
  asm volatile("{\n.reg .pred done;\nWAIT:\n"
               "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
               "@!done bra WAIT;\n}\n" ::"r"(smem_address(bar)), "r"(parity) : "memory");
}

// A: [c4][m][4], m = block * kCO + co; block (kQ-1) + s (kR + kQ - 1) + r holds w[:, :, r, s].
__device__ void stage_filter(float const *w, float *a) {
  for (int i = threadIdx.x; i < kAFloats; i += kThreads) {
    int const k = i % 4, m = i / 4 % (kBlocks * kCO), c4 = i / (4 * kBlocks * kCO);
    int const blk = m / kCO, co = m % kCO, ci = 4 * c4 + k;
    int const rel = blk - (kQ - 1);
    int const s = rel >= 0 ? rel / (kR + kQ - 1) : 0, r = rel >= 0 ? rel % (kR + kQ - 1) : kR;
    float v = 0.f;
    if (rel >= 0 && r < kR) v = w[(ci * kCO + co) * (kR * kS) + r * kS + s];
    a[i] = __uint_as_float(tf32_nearest(v));
  }
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

struct Walk {  // a CTA's work: strips first, first + step, ..., pairs [t0, t1) of each
  int first, step; long long t0, t1;
};
__device__ __forceinline__ Walk walk_of(Params const &p, int c, int C) {
  long long const T = (long long)p.N * p.pairs;
  if (C >= p.strips) {
    int const strip = c % p.strips, idx = c / p.strips, cnt = (C - 1 - strip) / p.strips + 1;
    return {strip, p.strips, T * idx / cnt, T * (idx + 1) / cnt};
  }
  return {c, C, 0, T};
}

__device__ __forceinline__ int col_start(Params const &p, int strip) {  // 4-aligned
  int const start = strip * kN + p.pad_w - (kS - 1);
  return start - (((start % 4) + 4) % 4);
}

#ifndef LOADMAP
#define LOADMAP 0
#endif
__device__ __forceinline__ float rnd(float a) { return __uint_as_float(tf32_nearest(a)); }
__device__ __forceinline__ float pick(float4 v, int j) {
  return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}
// Input rows h, h + 1 (kRows of them) of image n for strip into ring rows dst[] (64 loader
// threads): every load issued before any store.
template <int kRows>
__device__ __forceinline__ void load_rows(Params const &p, int n, int h, int strip, float *const *dst, int tid) {
  int const wa = col_start(p, strip);
  if constexpr (!kNhwc) {
    constexpr int kQuads = kPix / 4, kUnits = kCI / 4 * kQuads;
    constexpr int kPer = (kUnits + 127) / 128;
    float4 v[kRows][kPer][4];
#pragma unroll
    for (int rr = 0; rr < kRows; ++rr) {
      bool const row_in = unsigned(h + rr) < unsigned(p.H);
#pragma unroll
      for (int u = 0; u < kPer; ++u) {
        int const unit = tid + 128 * u;
        int const c4 = LOADMAP ? unit / kQuads : unit % (kCI / 4);
        int const quad = LOADMAP ? unit % kQuads : unit / (kCI / 4);
        int const w = wa + 4 * quad;
        bool const in = unit < kUnits && row_in && w >= 0 && w < p.W;
#pragma unroll
        for (int cc = 0; cc < 4; ++cc) {
          v[rr][u][cc] = in ? __ldg(reinterpret_cast<float4 const *>(
                                  p.x + ((long long)(n * kCI + 4 * c4 + cc) * p.H + h + rr) * p.W + w))
                            : make_float4(0.f, 0.f, 0.f, 0.f);
        }
      }
    }
#pragma unroll
    for (int rr = 0; rr < kRows; ++rr)
#pragma unroll
      for (int u = 0; u < kPer; ++u) {
        int const unit = tid + 128 * u;
        int const c4 = LOADMAP ? unit / kQuads : unit % (kCI / 4);
        int const quad = LOADMAP ? unit % kQuads : unit / (kCI / 4);
        if (unit >= kUnits) continue;
        float4 *d = reinterpret_cast<float4 *>(dst[rr]) + c4 * kPitch + 4 * quad;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          int const j = LOADMAP ? (e + (tid % 8) / 2) % 4 : e;  // LOADMAP 1: conflict-free
          d[j] = make_float4(rnd(pick(v[rr][u][0], j)), rnd(pick(v[rr][u][1], j)),
                             rnd(pick(v[rr][u][2], j)), rnd(pick(v[rr][u][3], j)));
        }
      }
  } else {
    constexpr int kUnits = kCI / 4 * kPix;
    constexpr int kPer = (kUnits + 127) / 128;
    float4 v[kRows][kPer];
#pragma unroll
    for (int rr = 0; rr < kRows; ++rr) {
      bool const row_in = unsigned(h + rr) < unsigned(p.H);
#pragma unroll
      for (int u = 0; u < kPer; ++u) {
        int const unit = tid + 128 * u, c4 = unit % (kCI / 4), j = unit / (kCI / 4);
        int const w = wa + j;
        bool const in = unit < kUnits && row_in && w >= 0 && w < p.W;
        v[rr][u] = in ? __ldg(reinterpret_cast<float4 const *>(
                            p.x + (((long long)n * p.H + h + rr) * p.W + w) * kCI + 4 * c4))
                      : make_float4(0.f, 0.f, 0.f, 0.f);
      }
    }
#pragma unroll
    for (int rr = 0; rr < kRows; ++rr)
#pragma unroll
      for (int u = 0; u < kPer; ++u) {
        int const unit = tid + 128 * u, c4 = unit % (kCI / 4), j = unit / (kCI / 4);
        if (unit >= kUnits) continue;
        reinterpret_cast<float4 *>(dst[rr])[c4 * kPitch + j] =
            make_float4(rnd(v[rr][u].x), rnd(v[rr][u].y), rnd(v[rr][u].z), rnd(v[rr][u].w));
      }
  }
}

__device__ __forceinline__ void cp_async(uint32_t dst, float const *src, bool in, std::integral_constant<int, 4>) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(in ? 4 : 0) : "memory");
}
__device__ __forceinline__ void cp_async(uint32_t dst, float const *src, bool in, std::integral_constant<int, 16>) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(in ? 16 : 0) : "memory");
}
// Asynchronous producer: a thread (NHWC) or a warp (NCHW) copies fixed 16-byte chunks of every
// row and later rounds the chunks it copied, once they landed.
constexpr int kChunks = kCI / 4 * kPix;                 // 16-byte chunks of a row
constexpr int kNhwcPer = (kChunks + 127) / 128;         // NHWC: chunks per thread
constexpr int kUnits = kCI / 4 * (kPix / 8);            // NCHW: units of 8 pixels x 4 channels
static_assert(kPix % 8 == 0, "NCHW units of 8 pixels");
constexpr int kUnitsPerWarp = (kUnits + 3) / 4;
__device__ __forceinline__ void issue_row(Params const &p, int n, int h, int strip, float *dst, int tid) {
  int const wa = col_start(p, strip);
  bool const row_in = unsigned(h) < unsigned(p.H);
  uint32_t const base = smem_address(dst);
  if constexpr (kNhwc) {
#pragma unroll
    for (int i = 0; i < kNhwcPer; ++i) {
      int const u = tid + 128 * i, c4 = u % (kCI / 4), j = u / (kCI / 4), w = wa + j;
      bool const in = row_in && w >= 0 && w < p.W;
      if (u < kChunks)
        cp_async(base + (c4 * kPitch + j) * 16,
                 in ? p.x + (((long long)n * p.H + h) * p.W + w) * kCI + 4 * c4 : p.x, in,
                 std::integral_constant<int, 16>{});
    }
  } else {
    int const warp = tid / 32, lane = tid % 32, px = lane / 4, cc = lane % 4;
#pragma unroll 4
    for (int i = 0; i < kUnitsPerWarp; ++i) {
      int const u = warp + 4 * i, c4 = u % (kCI / 4), o = u / (kCI / 4);
      int const w = wa + 8 * o + px;
      bool const in = u < kUnits && row_in && w >= 0 && w < p.W;
      if (u < kUnits)
        cp_async(base + ((c4 * kPitch + 8 * o + px) * 4 + cc) * 4,
                 in ? p.x + ((long long)(n * kCI + 4 * c4 + cc) * p.H + h) * p.W + w : p.x, in,
                 std::integral_constant<int, 4>{});
    }
  }
}
__device__ __forceinline__ void round_row(float *dst, int tid) {
  float4 *d = reinterpret_cast<float4 *>(dst);
  auto rnd4 = [](float4 v) {
    return make_float4(__uint_as_float(tf32_nearest(v.x)), __uint_as_float(tf32_nearest(v.y)),
                       __uint_as_float(tf32_nearest(v.z)), __uint_as_float(tf32_nearest(v.w)));
  };
  if constexpr (kNhwc) {
#pragma unroll
    for (int i = 0; i < kNhwcPer; ++i) {
      int const u = tid + 128 * i, c4 = u % (kCI / 4), j = u / (kCI / 4);
      if (u < kChunks) d[c4 * kPitch + j] = rnd4(d[c4 * kPitch + j]);
    }
  } else {
    __syncwarp();
    int const warp = tid / 32, lane = tid % 32;
#pragma unroll
    for (int k = 0; k < (kUnitsPerWarp * 8 + 31) / 32; ++k) {
      int const c = lane + 32 * k, i = c / 8, e = c % 8, u = warp + 4 * i;
      int const c4 = u % (kCI / 4), o = u / (kCI / 4);
      if (i < kUnitsPerWarp && u < kUnits) d[c4 * kPitch + 8 * o + e] = rnd4(d[c4 * kPitch + 8 * o + e]);
    }
  }
}

template <std::size_t... I>
__device__ __forceinline__ void wgmma(uint64_t da, uint64_t db, float *d, bool acc, std::index_sequence<I...>) {
  Op<kN>::T::fma(da, db, d[I]..., acc ? cute::SM90::GMMA::ScaleOut::One : cute::SM90::GMMA::ScaleOut::Zero);
}

__device__ __forceinline__ uint64_t make_desc(void const *base, uint32_t lbo, uint32_t sbo) {
  cute::GmmaDescriptor d;
  d.bitfield.start_address_ = cute::cast_smem_ptr_to_uint(base) >> 4;
  d.bitfield.leading_byte_offset_ = lbo >> 4;
  d.bitfield.stride_byte_offset_ = sbo >> 4;
  d.bitfield.base_offset_ = 0;
  d.bitfield.layout_type_ = 0;
  return d.desc_;
}

extern "C" __global__ void __launch_bounds__(kThreads, 1) ss_kernel(Params const p) {
  extern __shared__ __align__(128) float smem[];
  float *a = smem;
  float *ring = smem + kAFloats;
  uint64_t *full = reinterpret_cast<uint64_t *>(ring + kRing * kRowFloats);
  uint64_t *empty = full + kRing;
  [[maybe_unused]] float *staging = reinterpret_cast<float *>(empty + kRing);  // STAGED rows
  stage_filter(p.w, a);
  if (threadIdx.x < kRing) {
    barrier_init(&full[threadIdx.x], 128);
    barrier_init(&empty[threadIdx.x], 2 * 128);  // each row serves two pairs
  }
  __syncthreads();
  int const wg = threadIdx.x / 128;
  Walk const wk = walk_of(p, blockIdx.x, gridDim.x);
  if (wg == 0) {  // producer warpgroup: rows in order, two at a time
    int const tid = threadIdx.x;
    uint32_t g = 0;
    for (int strip = wk.first; strip < p.strips; strip += wk.step) {
      for (long long t = wk.t0; t < wk.t1;) {
        int const n = int(t / p.pairs), k0 = int(t % p.pairs);
        int const k1 = int(std::min<long long>(p.pairs, k0 + (wk.t1 - t)));
        int const rows = 2 * (k1 - k0) + kR - 1, h0 = 2 * k0 + p.pad_h - (kR - 1);
#if ASYNC
        for (int j = 0; j < rows; ++j, ++g) {
          if (g >= DEPTH) {  // the oldest row in flight has landed: round it, hand it over
            uint32_t const old = g - DEPTH;
            asm volatile("cp.async.wait_group %0;\n" ::"n"(DEPTH - 1) : "memory");
            round_row(ring + (old % kRing) * kRowFloats, tid);
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
            barrier_arrive(&full[old % kRing]);
          }
          barrier_wait(&empty[g % kRing], (g / kRing + 1) & 1);
          issue_row(p, n, h0 + j, strip, ring + (g % kRing) * kRowFloats, tid);
          asm volatile("cp.async.commit_group;\n" ::: "memory");
        }
#else
#ifndef BATCH
#define BATCH 2
#endif
        for (int j = 0; j < rows;) {
          int const cnt = rows - j >= BATCH ? BATCH : 2;
          float *dst[BATCH];
          for (int rr = 0; rr < cnt; ++rr) {
            uint32_t const gg = g + rr;
            barrier_wait(&empty[gg % kRing], (gg / kRing + 1) & 1);
            dst[rr] = ring + (gg % kRing) * kRowFloats;
          }
          if (cnt == BATCH) load_rows<BATCH>(p, n, h0 + j, strip, dst, tid);
          else load_rows<2>(p, n, h0 + j, strip, dst, tid);
          asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
          for (int rr = 0; rr < cnt; ++rr) barrier_arrive(&full[(g + rr) % kRing]);
          g += cnt;
          j += cnt;
        }
#endif
        t += k1 - k0;
      }
    }
#if ASYNC
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    for (uint32_t old = g >= DEPTH ? g - DEPTH : 0; old < g; ++old) {
      round_row(ring + (old % kRing) * kRowFloats, tid);
      asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
      barrier_arrive(&full[old % kRing]);
    }
#endif
    return;
  }
  int const cons = wg - 1, tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  uint64_t const desc_a = make_desc(a, kBlocks * kCO * 16, 128);
  uint64_t const desc_b = make_desc(ring, kPitch * 16, 128);
  int const co0 = (16 * warp + lane / 4) % kCO, prow = (16 * warp) / kCO;
  float const b0 = p.bias ? p.bias[co0] : 0.f, b1 = p.bias ? p.bias[co0 + 8] : 0.f;
  uint32_t g = 0, pair_count = 0;  // ring rows and pairs of the CTA before this segment
  float acc[kAcc];
  for (int strip = wk.first; strip < p.strips; strip += wk.step) {
    int const off = strip * kN + p.pad_w - (kS - 1) - col_start(p, strip);
    for (long long t = wk.t0; t < wk.t1;) {
      int const n = int(t / p.pairs), k0 = int(t % p.pairs);
      int const npairs = int(std::min<long long>(p.pairs - k0, wk.t1 - t));
      for (int kk = (cons + kConsumers - pair_count % kConsumers) % kConsumers; kk < npairs; kk += kConsumers) {
        uint32_t const gp = g + 2 * kk;  // ring row of input row 0 of this pair
#pragma unroll
        for (int i = 0; i <= kR; ++i) barrier_wait(&full[(gp + i) % kRing], ((gp + i) / kRing) & 1);
#pragma unroll
        for (int e = 0; e < kAcc; ++e) cute::warpgroup_fence_operand(acc[e]);
        cute::warpgroup_arrive();
#pragma unroll
        for (int i = 0; i <= kR; ++i) {
          uint64_t const row_b = desc_b + ((((gp + i) % kRing) * kRowFloats * 4) >> 4);
#pragma unroll
          for (int s = 0; s < kS; ++s)
#pragma unroll
            for (int c8 = 0; c8 < kCI / 8; ++c8) {
              int const blk = (kQ - 1) + s * (kR + kQ - 1) + (kR - 1 - i);
              uint64_t const da = desc_a + ((blk * kCO * 16 + 2 * c8 * kBlocks * kCO * 16) >> 4);
              #ifdef ALIGNB
              uint64_t const db = row_b + (((2 * c8 * kPitch) * 16) >> 4);
#else
              uint64_t const db = row_b + (((2 * c8 * kPitch + off + kS - 1 - s) * 16) >> 4);
#endif
              wgmma(da, db, acc, i + s + c8 > 0, std::make_index_sequence<kAcc>{});
            }
        }
        cute::warpgroup_commit_batch();
        cute::warpgroup_wait<0>();
#pragma unroll
        for (int e = 0; e < kAcc; ++e) cute::warpgroup_fence_operand(acc[e]);
#pragma unroll
        for (int i = 0; i <= kR; ++i) {  // edge rows serve one pair: arrive for the other too
          bool const edge = (i < 2 && kk == 0) || (i >= 2 && kk == npairs - 1);
          barrier_arrive(&empty[(gp + i) % kRing]);
          if (edge) barrier_arrive(&empty[(gp + i) % kRing]);
        }
#if STAGED
        // one output row at a time through shared memory: its two warps write it, the
        // warpgroup stores it with 16-byte (NHWC) or 8-byte (NCHW, Q even) coalesced stores
        float *st = staging + cons * kStageFloats;
        for (int half = 0; half < 2; ++half) {
          int const pp = 2 * (k0 + kk) + half;
          if (prow == half) {
#pragma unroll
            for (int j = 0; j < kN / 8; ++j)
#pragma unroll
              for (int hh = 0; hh < 2; ++hh) {
                int const co = co0 + 8 * hh, px = 8 * j + 2 * (lane % 4);
                float const bb = hh ? b1 : b0;
                float const v0 = acc[4 * j + 2 * hh] + bb, v1 = acc[4 * j + 2 * hh + 1] + bb;
                if constexpr (kNhwc) {  // [px][co], 16-byte chunks swizzled by px % 8
                  st[px * kCO + ((co / 4) ^ (px % 8)) * 4 + co % 4] = v0;
                  st[(px + 1) * kCO + ((co / 4) ^ ((px + 1) % 8)) * 4 + co % 4] = v1;
                } else {  // [co][px], pitch kN (8 mod 32 words for kN = 104)
                  *reinterpret_cast<float2 *>(st + co * kN + px) = make_float2(v0, v1);
                }
              }
          }
          asm volatile("bar.sync %0, 128;\n" ::"r"(1 + cons) : "memory");
          if (pp < p.P) {
            if constexpr (kNhwc) {
              for (int k = tid; k < kN * (kCO / 4); k += 128) {
                int const px = k / (kCO / 4), c = k % (kCO / 4), q = strip * kN + px;
                if (q < p.Q)
                  *reinterpret_cast<float4 *>(p.y + (((long long)n * p.P + pp) * p.Q + q) * kCO + 4 * c) =
                      *reinterpret_cast<float4 const *>(st + px * kCO + (c ^ (px % 8)) * 4);
              }
            } else if (p.Q % 2 == 0) {
              for (int k = tid; k < kCO * (kN / 2); k += 128) {
                int const co = k / (kN / 2), i = k % (kN / 2), q = strip * kN + 2 * i;
                if (q < p.Q)
                  *reinterpret_cast<float2 *>(p.y + ((long long)(n * kCO + co) * p.P + pp) * p.Q + q) =
                      *reinterpret_cast<float2 const *>(st + co * kN + 2 * i);
              }
            } else {
              for (int k = tid; k < kCO * kN; k += 128) {
                int const co = k / kN, i = k % kN, q = strip * kN + i;
                if (q < p.Q) p.y[((long long)(n * kCO + co) * p.P + pp) * p.Q + q] = st[co * kN + i];
              }
            }
          }
          asm volatile("bar.sync %0, 128;\n" ::"r"(1 + cons) : "memory");
        }
#else
        int const pp = 2 * (k0 + kk) + prow;
#ifdef NOSTORE
        if (pp < 0) {
#else
        if (pp < p.P) {
#endif
#pragma unroll
          for (int j = 0; j < kN / 8; ++j) {
            int const q = strip * kN + 8 * j + 2 * (lane % 4);
#pragma unroll
            for (int half = 0; half < 2; ++half) {
              int const co = co0 + 8 * half;
              float const bb = half ? b1 : b0;
              float const v0 = acc[4 * j + 2 * half] + bb, v1 = acc[4 * j + 2 * half + 1] + bb;
              if constexpr (kNhwc) {
                float *y = p.y + (((long long)n * p.P + pp) * p.Q + q) * kCO + co;
                if (q < p.Q) y[0] = v0;
                if (q + 1 < p.Q) y[kCO] = v1;
              } else {
                float *y = p.y + ((long long)(n * kCO + co) * p.P + pp) * p.Q + q;
                if (q + 1 < p.Q) *reinterpret_cast<float2 *>(y) = make_float2(v0, v1);
                else if (q < p.Q) y[0] = v0;
              }
            }
          }
        }
#endif
      }
      g += 2 * npairs + kR - 1;
      pair_count += npairs;
      t += npairs;
    }
  }
}

__global__ void reference(Params p, double *out) {  // float64, layout as p
  long long const total = (long long)p.N * kCO * p.P * p.Q;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x) {
    int q, pp, co, n;
    if (kNhwc) { co = i % kCO; q = i / kCO % p.Q; pp = i / kCO / p.Q % p.P; n = i / kCO / p.Q / p.P; }
    else { q = i % p.Q; pp = i / p.Q % p.P; co = i / p.Q / p.P % kCO; n = i / p.Q / p.P / kCO; }
    double s = p.bias ? p.bias[co] : 0.0;
    for (int r = 0; r < kR; ++r) for (int ss = 0; ss < kS; ++ss) {
      int const h = pp + p.pad_h - r, w = q + p.pad_w - ss;
      if (h < 0 || h >= p.H || w < 0 || w >= p.W) continue;
      for (int ci = 0; ci < kCI; ++ci) {
        double xv = kNhwc ? p.x[(((long long)n * p.H + h) * p.W + w) * kCI + ci]
                          : p.x[(((long long)n * kCI + ci) * p.H + h) * p.W + w];
        s += xv * (double)p.w[(ci * kCO + co) * kR * kS + r * kS + ss];
      }
    }
    out[i] = s;
  }
}

int main(int argc, char **argv) {
  int N = 8, H = 512, W = 1024, pad = 0;
  if (argc > 3) { N = atoi(argv[1]); H = atoi(argv[2]); W = atoi(argv[3]); }
  if (argc > 4) pad = atoi(argv[4]);
  int P = H + kR - 1 - 2 * pad, Q = W + kS - 1 - 2 * pad;
  size_t nx = (size_t)N * kCI * H * W, ny = (size_t)N * kCO * P * Q, nw = kCI * kCO * kR * kS;
  std::vector<float> hx(nx), hw(nw), hb(kCO);
  srand(1234);
  for (auto &v : hx) v = rand() / (float)RAND_MAX;
  for (auto &v : hw) v = (rand() / (float)RAND_MAX * 2 - 1) * 0.059f;
  for (auto &v : hb) v = (rand() / (float)RAND_MAX * 2 - 1) * 0.059f;
  float *x, *w, *b, *y, *scratch, *flush; double *ref;
  cudaMalloc(&x, nx * 4); cudaMalloc(&w, nw * 4); cudaMalloc(&b, kCO * 4); cudaMalloc(&y, ny * 4);
  cudaMalloc(&ref, ny * 8); cudaMalloc(&scratch, std::max(nx, ny) * 4); cudaMalloc(&flush, 256 << 20);
  cudaMemcpy(x, hx.data(), nx * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(w, hw.data(), nw * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(b, hb.data(), kCO * 4, cudaMemcpyHostToDevice);
  cudaMemset(y, 0xff, ny * 4);  // NaN poison
  Params prm{x, w, b, y, N, H, W, P, Q, pad, pad, (Q + kN - 1) / kN, (P + 1) / 2};
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  cudaFuncSetAttribute(ss_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  ss_kernel<<<sms, kThreads, kSmemBytes>>>(prm);
  cudaError_t e = cudaDeviceSynchronize();
  printf("%s N=%d smem %d B: launch %s\n", kNhwc ? "NHWC" : "NCHW", kN, kSmemBytes, cudaGetErrorString(e));
  if (e) return 1;
  reference<<<4096, 256>>>(prm, ref);
  cudaDeviceSynchronize();
  std::vector<float> hy(ny); std::vector<double> hr(ny);
  cudaMemcpy(hy.data(), y, ny * 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(hr.data(), ref, ny * 8, cudaMemcpyDeviceToHost);
  double num = 0, den = 0, mx = 0; size_t bad = 0;
  for (size_t i = 0; i < ny; ++i) {
    if (!std::isfinite(hy[i])) { ++bad; continue; }
    double d = hy[i] - hr[i]; num += d * d; den += hr[i] * hr[i]; mx = std::max(mx, std::fabs(d));
  }
  printf("  rel err %.3e max abs %.3e non-finite %zu\n", std::sqrt(num / den), mx, bad);
  // timing
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  std::vector<float> tk, tc;
  for (int it = 0; it < 60; ++it) {
    cudaMemsetAsync(flush, it, 256 << 20);
    cudaEventRecord(e0); ss_kernel<<<sms, kThreads, kSmemBytes>>>(prm); cudaEventRecord(e1);
    cudaEventSynchronize(e1); float ms; cudaEventElapsedTime(&ms, e0, e1); if (it >= 10) tk.push_back(ms);
    cudaMemsetAsync(flush, it, 256 << 20);
    cudaEventRecord(e0); cudaMemcpyAsync(scratch, x, nx * 4, cudaMemcpyDeviceToDevice); cudaEventRecord(e1);
    cudaEventSynchronize(e1); cudaEventElapsedTime(&ms, e0, e1); if (it >= 10) tc.push_back(ms);
  }
  std::sort(tk.begin(), tk.end()); std::sort(tc.begin(), tc.end());
  printf("  kernel %.4f ms (min %.4f)  copy of x %.4f ms  err %s\n", tk[tk.size() / 2], tk[0], tc[tc.size() / 2],
         cudaGetErrorString(cudaGetLastError()));
  return 0;
}
