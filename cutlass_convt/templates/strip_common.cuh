// cutlass_convt: what the strip family's two kernels share (templates/strip.cu, wgmma with both
// operands in shared memory; templates/strip_rs.cu, x as wgmma's A operand from registers): the
// kernel argument, the walks of a CTA over strips and runs of pairs of output rows, the TMA
// loads of input rows. Included after config.h
// (kS kTileN kStripStep kNhwc kHalf kBf16).
#pragma once
#include <cstdint>

#include "common.cuh"  // mbarrier helpers, smem_address
#include "cute/arch/copy_sm90_tma.hpp"
#include "element.cuh"  // Element, kSixteen

namespace {

constexpr int kCI = 32, kCO = 32, kR = 3;
// Staged columns of an input row: the kTileN + kS - 1 the wgmmas read, and in NCHW more: a TMA
// box's start must be 16-byte aligned in its innermost dimension (otherwise the TMA load faults
// with an illegal instruction), so an NCHW row is loaded from a multiple of kAlign columns and
// shifted where it is read (strip.cu loads from a multiple of 8 floats, a 32-byte sector, where
// the rounding up to 8 leaves room for that shift); 16-bit NCHW reads words of two columns, one
// column beyond. Rounded up to 8 columns, and for 16-bit NCHW to 8 or 24 mod 32 (a warp's A
// loads, channel pairs kPix words apart, then hit distinct banks). families/strip.py:
// StripConfig.pixels.
constexpr int kAlign = 16 / int(sizeof(Element));  // elements of 16 bytes
constexpr int kPixNeeded = kTileN + kS - 1 + (kNhwc ? 0 : kAlign - 1 + (kSixteen ? 1 : 0));
constexpr int kPixRounded = (kPixNeeded + 7) / 8 * 8;
constexpr int kPix = kPixRounded + (kSixteen && !kNhwc && kPixRounded % 16 == 0 ? 8 : 0);
constexpr int kRowElems = kPix * kCI;  // 512-byte multiple (16-bit) or 1024-byte (float32)
using CacheHint = cute::TMA::CacheHintSm90;

// Kernel argument, passed by value before the two tensor maps. families/strip.py packs it
// (STRIP_PARAMS).
struct StripParams {
  Element const *w;     // (32, 32, 3, kS), PyTorch's layout
  Element const *bias;  // (32,) or null
  Element *y;           // for the stores by the threads (NCHW; NHWC: strip_rs.cu's edge kernel)
  int N, H, W, P, Q, pad_h, pad_w;
  int strips, pairs;  // 1 + max(0, ceil((Q - kTileN) / kStripStep)) (floor(Q / kTileN) with
                      // strip_rs.cu's edge kernel), ceil(P / 2)
  int body;           // strip.cu NCHW: columns per TMA store (the y map's box), 0 for none
};
static_assert(sizeof(StripParams) == 64, "families/strip.py packs 3 pointers and 10 ints");

// First output column of a strip: strips are kStripStep apart (kTileN; strip.cu on NCHW: its
// TMA store bodies' width, so that those of neighbouring strips abut), and the last one ends
// at Q (it overlaps the one before it, whose columns it computes and may store again,
// identically), so every strip has kTileN columns when Q >= kTileN. With strip_rs.cu's edge
// kernel p.strips ends before the edge's columns, and no strip overlaps another.
__device__ __forceinline__ int strip_q0(StripParams const &p, int strip) {
  return max(0, min(strip * kStripStep, p.Q - kTileN));
}

// Element offset of y[n, co, row, col] in NCHW.
__device__ __forceinline__ long long nchw_offset(StripParams const &p, int n, int co, int row,
                                                int col) {
  return ((static_cast<long long>(n) * kCO + co) * p.P + row) * p.Q + col;
}

// Arrive, and expect `bytes` more of TMA transactions in this phase.
__device__ __forceinline__ void barrier_expect_bytes(uint64_t *bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_address(bar)),
               "r"(bytes)
               : "memory");
}

// A CTA's work, over the sequence of units (strip, image n, pair k) of all strips:
// - kSplitAll = false (strip.cu): strips first, first + step, ...; of each, pairs [t0, t1) of
//   the sequence (n, k) = t / pairs, t % pairs. With more CTAs than strips:
//   - NHWC: each strip has ctas / strips CTAs, which split its pairs but the last `tail` evenly
//     (CTAs c with the same c / strips walk the same pairs), and the ctas % strips CTAs left
//     over take the strips' tails, CTA e of them those of strips e, e + ctas % strips, ...;
//     the tail's length gives them as many pairs as the others (problem 71 on 132 SMs: 13
//     CTAs a strip and 2 with 5 tails each, at most 156 pairs a CTA).
//   - NCHW: the CTAs of each strip split its pairs evenly; for strip.cu the host
//     (StripKernel.plan) gives every strip as many, a grid that is a multiple of the strips.
//     NCHW keeps this branch: at the power cap the SMs that the tails would add buy no time
//     (docs/design/strip.md, Defaults).
// - kSplitAll = true (strip_rs.cu's option): units [t0, t1) of the whole sequence,
//   strip by strip, split evenly among all CTAs, so that no SM idles when the CTAs do not
//   divide evenly among the strips, but the CTAs of neighbouring strips no longer walk the
//   same rows at the same time (docs/design/strip.md, Defaults).
struct Walk {
  int first, step;
  long long t0, t1;
};
template <bool kSplitAll>
__device__ __forceinline__ Walk walk_of(StripParams const &p) {
  long long const total = (long long)p.N * p.pairs;
  int const c = blockIdx.x, ctas = gridDim.x;
  if (kSplitAll) return {0, 1, total * p.strips * c / ctas, total * p.strips * (c + 1) / ctas};
  if (ctas >= p.strips && !kNhwc) {
    int const strip = c % p.strips, index = c / p.strips;
    int const count = (ctas - 1 - strip) / p.strips + 1;
    return {strip, p.strips, total * index / count, total * (index + 1) / count};
  }
  if (ctas >= p.strips) {
    int const count = ctas / p.strips, extra = ctas % p.strips, index = c / p.strips;
    long long const tail = extra ? total / (1 + count * ((p.strips + extra - 1) / extra)) : 0;
    long long const span = total - tail;
    if (index < count)
      return {c % p.strips, p.strips, span * index / count, span * (index + 1) / count};
    return {c % p.strips, extra, span, total};
  }
  return {c, ctas, 0, total};
}

// Calls f(strip, n, first pair, pairs) for each run of consecutive pairs of one image in the
// CTA's walk, strip by strip.
template <bool kSplitAll, class F>
__device__ __forceinline__ void for_each_run(StripParams const &p, F &&f) {
  Walk const walk = walk_of<kSplitAll>(p);
  if constexpr (kSplitAll) {
    long long const per_strip = (long long)p.N * p.pairs;
    for (long long t = walk.t0; t < walk.t1;) {
      int const strip = int(t / per_strip);
      long long const u = t % per_strip;
      int const n = int(u / p.pairs), k0 = int(u % p.pairs);
      int const pairs = int(min((long long)(p.pairs - k0), walk.t1 - t));
      f(strip, n, k0, pairs);
      t += pairs;
    }
  } else {
    for (int strip = walk.first; strip < p.strips; strip += walk.step) {
      for (long long t = walk.t0; t < walk.t1;) {
        int const n = int(t / p.pairs), k0 = int(t % p.pairs);
        int const pairs = int(min((long long)(p.pairs - k0), walk.t1 - t));
        f(strip, n, k0, pairs);
        t += pairs;
      }
    }
  }
}

// The TMA issuer's g-th row of the CTA, input row h of image n from column x0, into `row` (ring
// slot `slot` of kRingRows): waits until the slot is empty, then loads the
// box (NHWC: 32 channels x kPix pixels; NCHW: kPix pixels x 32 channels, x0 a multiple of
// kAlign, 16 bytes), zero outside the image.
template <int kRingRows>
__device__ __forceinline__ void load_row(cute::TmaDescriptor const *tmap_x, Element *row,
                                         uint64_t *landed, uint64_t *empty, uint32_t g,
                                         CacheHint hint, int x0, int h, int n) {
  int const slot = g % kRingRows;
  barrier_wait(&empty[slot], (g / kRingRows + 1) % 2);
  barrier_expect_bytes(&landed[slot], kRowElems * int(sizeof(Element)));
  if constexpr (kNhwc)
    cute::SM90_TMA_LOAD_4D::copy(tmap_x, &landed[slot], uint64_t(hint), row, 0, x0, h, n);
  else
    cute::SM90_TMA_LOAD_4D::copy(tmap_x, &landed[slot], uint64_t(hint), row, x0, h, 0, n);
}

}  // namespace
