// The engine's GEMM (kernels/cpu/gemm.h): packing, blocking and the choice of path.
// Only the micro-kernels (gemm_microkernels.h) are compiled for an instruction set, by
// function attributes, never by per-file flags: a file built with -mavx512f would also
// emit inline library templates (std::fill, ...) the linker may then hand to code that
// runs on any CPU.
//
// BLIS's loop order: C is cut into NC-wide column panels and KC-deep k blocks; a k block
// of op(B) is packed into NR-wide slivers, a MC x KC block of op(A) into MR-high
// slivers; the micro-kernel runs an MR x NR tile of C over the KC block, loading the
// tile (the chain so far), fusing KC multiply-adds into each element in k order, and
// storing it back (kernels/cpu/gemm.h).
#include "kernels/cpu/gemm.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/gemm_microkernels.h"
#include "kernels/cpu/scratch.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace engine::kernels::cpu {

namespace {

constexpr int kKc = 256;   // k block: an A sliver and a B sliver stay in L1
constexpr int kMc = 96;    // rows of op(A) per packed block (L2) at a full k block,
constexpr int kMcKc = kMc * 256;  // and as many more as a shorter block leaves room for
constexpr int kNc = 2048;  // columns of op(B) per packed panel (L2/L3)

// Packing. A k block of an operand becomes W-wide slivers:
//   dst[(s * kc + kk) * W + w] = X[first + s*W + w, k0 + kk], 0 beyond `count`,
// where X is op(A) (W = MR, its rows) or op(B) transposed (W = NR, its columns). In
// terms of the stored (or never stored) matrix M behind the operand, the sliver index w
// runs along M's rows (pack_rows: X[w, kk] = M[w, kk]) or along its columns
// (pack_cols: X[w, kk] = M[kk, w]).

// Rows of floats, each contiguous along j, written across a sliver: d[j * W + w] =
// rows[w][j] for w < n, j < len. The transposing half of packing (an operand whose
// sliver runs along its stored rows: the activations and weights of a linear layer, the
// taps and dy of a weight gradient); a plain copy, so any order of the copies gives the
// same packed panel. 4 x 4 blocks go through SSE registers (every x86-64 CPU has them):
// a scalar loop here, one store per float, took as long as the multiply-adds of the
// narrow products.
template <int W>
inline void rows_to_sliver_sse(const float* const* rows, int n, int len, float* d) {
  int w = 0;
#if defined(__SSE2__)
  for (; w + 4 <= n; w += 4) {
    const float *r0 = rows[w], *r1 = rows[w + 1], *r2 = rows[w + 2], *r3 = rows[w + 3];
    int j = 0;
    for (; j + 4 <= len; j += 4) {
      __m128 a = _mm_loadu_ps(r0 + j), b = _mm_loadu_ps(r1 + j), c = _mm_loadu_ps(r2 + j), e = _mm_loadu_ps(r3 + j);
      _MM_TRANSPOSE4_PS(a, b, c, e);
      _mm_storeu_ps(d + static_cast<int64_t>(j) * W + w, a);
      _mm_storeu_ps(d + static_cast<int64_t>(j + 1) * W + w, b);
      _mm_storeu_ps(d + static_cast<int64_t>(j + 2) * W + w, c);
      _mm_storeu_ps(d + static_cast<int64_t>(j + 3) * W + w, e);
    }
    for (; j < len; ++j) {
      float* to = d + static_cast<int64_t>(j) * W + w;
      to[0] = r0[j], to[1] = r1[j], to[2] = r2[j], to[3] = r3[j];
    }
  }
  // Two rows left (AVX2's 6-row slivers): 4 columns at a time as pairs.
  if (w + 2 <= n) {
    const float *r0 = rows[w], *r1 = rows[w + 1];
    int j = 0;
    for (; j + 4 <= len; j += 4) {
      const __m128 a = _mm_loadu_ps(r0 + j), b = _mm_loadu_ps(r1 + j);
      const __m128 lo = _mm_unpacklo_ps(a, b), hi = _mm_unpackhi_ps(a, b);  // a0 b0 a1 b1, a2 b2 a3 b3
      float* to = d + static_cast<int64_t>(j) * W + w;
      _mm_storel_pi(reinterpret_cast<__m64*>(to), lo);
      _mm_storeh_pi(reinterpret_cast<__m64*>(to + W), lo);
      _mm_storel_pi(reinterpret_cast<__m64*>(to + 2 * W), hi);
      _mm_storeh_pi(reinterpret_cast<__m64*>(to + 3 * W), hi);
    }
    for (; j < len; ++j) {
      float* to = d + static_cast<int64_t>(j) * W + w;
      to[0] = r0[j], to[1] = r1[j];
    }
    w += 2;
  }
#endif
  for (; w < n; ++w)
    for (int j = 0; j < len; ++j) d[static_cast<int64_t>(j) * W + w] = rows[w][j];
}

#if defined(__x86_64__)
// The same copy, 8 rows by 8 floats at a time through AVX registers, for the paths whose
// CPU has AVX: rows 0-3 go into the low halves and rows 4-7 into the high ones as they
// are loaded (the inserts from memory run on the load ports), then 16 in-lane shuffles
// turn 8 x 8 floats around: a quarter of a shuffle per float, against half a shuffle
// and twice the loads and stores for SSE's 4 x 4 (fc1's forward product: packing a
// third of its time with SSE, a quarter with this; perf, 2026-12-03).
// Columns j..j+7 of the first n8 rows (a multiple of 8), every group of 8 rows, so each
// packed row is written whole before the next (rows of groups by turn left each line
// to be fetched again).
template <int W>
__attribute__((always_inline)) ENGINE_X86_TARGET("avx") inline void eight_columns_avx(const float* const* rows, int n8,
                                                                                       int j, float* d) {
  for (int w = 0; w < n8; w += 8) {
    const float* const* r = rows + w;
    for (int h = 0; h < 8; h += 4) {  // columns j+h .. j+h+3
      // t_i: row i's four floats in the low half, row i + 4's in the high half.
      __m256 t[4];
      for (int i = 0; i < 4; ++i)
        t[i] = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(r[i] + j + h)), _mm_loadu_ps(r[i + 4] + j + h), 1);
      const __m256 u0 = _mm256_unpacklo_ps(t[0], t[1]), u1 = _mm256_unpackhi_ps(t[0], t[1]);
      const __m256 u2 = _mm256_unpacklo_ps(t[2], t[3]), u3 = _mm256_unpackhi_ps(t[2], t[3]);
      float* to = d + static_cast<int64_t>(j + h) * W + w;
      _mm256_storeu_ps(to, _mm256_shuffle_ps(u0, u2, 0x44));
      _mm256_storeu_ps(to + W, _mm256_shuffle_ps(u0, u2, 0xEE));
      _mm256_storeu_ps(to + 2 * W, _mm256_shuffle_ps(u1, u3, 0x44));
      _mm256_storeu_ps(to + 3 * W, _mm256_shuffle_ps(u1, u3, 0xEE));
    }
  }
}

template <int W>
ENGINE_X86_TARGET("avx") void rows_to_sliver_avx(const float* const* rows, int n, int len, float* d) {
  const int n8 = n / 8 * 8;
  int j = 0;
  for (; j + 8 <= len; j += 8) eight_columns_avx<W>(rows, n8, j, d);
  // A ragged end of a run of at least 8 (an output row of 14 or 28 pixels in a weight
  // gradient's patches): its last 8 columns again, overlapping, instead of a float at a
  // time; the overlap writes the same floats twice.
  if (j < len && len >= 8) eight_columns_avx<W>(rows, n8, len - 8, d), j = len;
  for (; j < len; ++j)
    for (int w = 0; w < n8; ++w) d[static_cast<int64_t>(j) * W + w] = rows[w][j];
  if (n8 < n) rows_to_sliver_sse<W>(rows + n8, n - n8, len, d + n8);
}
#endif

// The packing's transposing copy, the fastest the path's instruction set allows (every
// variant writes the same floats).
template <int W, bool Avx>
inline void rows_to_sliver(const float* const* rows, int n, int len, float* d) {
#if defined(__x86_64__)
  if (Avx) return rows_to_sliver_avx<W>(rows, n, len, d);
#endif
  rows_to_sliver_sse<W>(rows, n, len, d);
}

// A stored row-major matrix.
template <int W, bool Avx>
void dense_pack(bool w_along_rows, const float* src, int ld, int first, int count, int k0, int kc, float* dst_all) {
  for (int s = 0; s * W < count; ++s) {
    float* dst = dst_all + static_cast<int64_t>(s) * kc * W;
    const int width = std::min(W, count - s * W);
    const int base = first + s * W;
    if (!w_along_rows) {  // M's row kk holds the sliver contiguously
      for (int kk = 0; kk < kc; ++kk) {
        const float* from = src + static_cast<int64_t>(k0 + kk) * ld + base;
        float* d = dst + kk * W;
        if (width == W) {
          std::memcpy(d, from, sizeof(float) * W);
          continue;
        }
        int w = 0;
        for (; w < width; ++w) d[w] = from[w];
        for (; w < W; ++w) d[w] = 0.0f;
      }
    } else {
      const float* rows[W];
      for (int w = 0; w < width; ++w) rows[w] = src + static_cast<int64_t>(base + w) * ld + k0;
      rows_to_sliver<W, Avx>(rows, width, kc, dst);
      for (int w = width; w < W; ++w)
        for (int kk = 0; kk < kc; ++kk) dst[kk * W + w] = 0.0f;
    }
  }
}

// A stretch of consecutive pixel columns [begin, begin + len) of an image matrix that
// lies in one image j (pixel p of it), and for patches in one output row too.
struct PixelRun {
  int offset;  // the first column's position in the sliver or k block
  int len;
  int64_t image;
  int64_t pixel;
  int oh, ow;  // for patches: the first column's output row and column
};

// Cuts columns [first, first + count) into runs, at image ends and, when `row` > 0,
// at ends of output rows of `row` pixels.
int pixel_runs(int64_t first, int count, int64_t pixels, int row, PixelRun* runs) {
  int n = 0;
  for (int done = 0; done < count;) {
    const int64_t col = first + done;
    const int64_t image = col / pixels, pixel = col % pixels;
    int64_t len = std::min<int64_t>(count - done, pixels - pixel);
    int oh = 0, ow = 0;
    if (row > 0) {
      oh = static_cast<int>(pixel / row), ow = static_cast<int>(pixel % row);
      len = std::min<int64_t>(len, row - ow);
    }
    runs[n++] = PixelRun{done, static_cast<int>(len), image, pixel, oh, ow};
    done += static_cast<int>(len);
  }
  return n;
}

// The offsets of taps first..first+count-1 within a padded image: c*Hp*Wp + r*Wp + q.
void tap_offsets(const PaddedImages& im, int first, int count, int64_t* offsets) {
  const int rs = im.r * im.s;
  int c = first / rs, r = first % rs / im.s, q = first % im.s;
  for (int i = 0; i < count; ++i) {
    offsets[i] = (static_cast<int64_t>(c) * im.hp + r) * im.wp + q;
    if (++q == im.s) {
      q = 0;
      if (++r == im.r) r = 0, ++c;
    }
  }
}

template <int W, bool Avx>
void patches_pack(bool w_along_rows, const PaddedImages& im, PatchColumns columns, int first, int count, int k0,
                  int kc, float* dst_all) {
  // A run of columns: in one image, and for Pixels in one output row (a contiguous
  // stretch of a padded row); for PaddedRows an image's columns are one stretch.
  const bool pixels = columns == PatchColumns::Pixels;
  const int64_t per_image = static_cast<int64_t>(im.out_h) * (pixels ? im.out_w : im.wp);
  const int row = pixels ? im.out_w : 0;
  const int64_t image_floats = im.image_floats();
  // Where column run.pixel of image run.image starts, for tap offset 0.
  auto start = [&](const PixelRun& run) {
    return im.data + run.image * image_floats + (pixels ? static_cast<int64_t>(run.oh) * im.wp + run.ow : run.pixel);
  };
  PixelRun runs[kKc];  // each run has a column, and a stretch has at most kKc
  int64_t taps[kKc];
  if (w_along_rows) {  // w: taps, kk: the pixel columns k0.. (the weight gradient's P in P * dy^T)
    const int n_runs = pixel_runs(k0, kc, per_image, row, runs);
    for (int sl = 0; sl * W < count; ++sl) {
      float* dst = dst_all + static_cast<int64_t>(sl) * kc * W;
      const int width = std::min(W, count - sl * W);
      tap_offsets(im, first + sl * W, width, taps);
      const float* rows[W];
      for (int i = 0; i < n_runs; ++i) {
        const float* from = start(runs[i]);
        for (int w = 0; w < width; ++w) rows[w] = from + taps[w];
        rows_to_sliver<W, Avx>(rows, width, runs[i].len, dst + runs[i].offset * W);
      }
      for (int w = width; w < W; ++w)
        for (int kk = 0; kk < kc; ++kk) dst[kk * W + w] = 0.0f;
    }
    return;
  }
  // w: pixel columns, kk: the taps k0.. (the forward's op(B))
  tap_offsets(im, k0, kc, taps);
  for (int sl = 0; sl * W < count; ++sl) {
    float* dst = dst_all + static_cast<int64_t>(sl) * kc * W;
    const int width = std::min(W, count - sl * W);
    const int n_runs = pixel_runs(first + sl * W, width, per_image, row, runs);
    if (n_runs == 1 && width == W) {  // one stretch: W floats per tap
      const float* from = start(runs[0]);
      for (int kk = 0; kk < kc; ++kk) std::memcpy(dst + kk * W, from + taps[kk], sizeof(float) * W);
      continue;
    }
    for (int kk = 0; kk < kc; ++kk) {
      float* d = dst + kk * W;
      for (int i = 0; i < n_runs; ++i) {
        const float* from = start(runs[i]) + taps[kk];
        float* to = d + runs[i].offset;
        for (int j = 0; j < runs[i].len; ++j) to[j] = from[j];  // short runs: a loop, not a memcpy call
      }
      for (int w = width; w < W; ++w) d[w] = 0.0f;
    }
  }
}

}  // namespace

std::size_t padded_images_floats(const ConvShape& s, int images) {
  return static_cast<std::size_t>(images) * s.c * (s.h + 2 * s.pad) * (s.w + 2 * s.pad) + s.s;
}

PaddedImages pad_images(const ConvShape& s, const float* x, int images, float* dst) {
  PaddedImages im;
  im.data = dst, im.c = s.c, im.hp = s.h + 2 * s.pad, im.wp = s.w + 2 * s.pad;
  im.r = s.r, im.s = s.s, im.out_h = s.out_h(), im.out_w = s.out_w();
  const std::size_t total = padded_images_floats(s, images);
  float* d = dst;
  for (int64_t plane = 0; plane < static_cast<int64_t>(images) * s.c; ++plane) {
    const float* from = x + plane * s.h * s.w;
    std::fill(d, d + static_cast<int64_t>(s.pad) * im.wp, 0.0f);
    d += static_cast<int64_t>(s.pad) * im.wp;
    for (int h = 0; h < s.h; ++h) {  // loops, not a memcpy call per row of 28 or 14 floats
      const float* row = from + static_cast<int64_t>(h) * s.w;
      for (int i = 0; i < s.pad; ++i) d[i] = 0.0f;
      for (int i = 0; i < s.w; ++i) d[s.pad + i] = row[i];
      for (int i = s.pad + s.w; i < im.wp; ++i) d[i] = 0.0f;
      d += im.wp;
    }
    std::fill(d, d + static_cast<int64_t>(s.pad) * im.wp, 0.0f);
    d += static_cast<int64_t>(s.pad) * im.wp;
  }
  std::fill(d, dst + total, 0.0f);  // the slack
  return im;
}

namespace {

template <int W, bool Avx>
void image_rows_pack(bool w_along_rows, const float* src, int rows, int64_t pixels, int first, int count, int k0,
                     int kc, float* dst_all) {
  PixelRun runs[kKc];
  auto at = [&](int row, const PixelRun& run) { return src + (run.image * rows + row) * pixels + run.pixel; };
  if (w_along_rows) {  // w: rows, kk: the pixel columns k0.. (the weight gradient's dy^T in P * dy^T)
    const int n_runs = pixel_runs(k0, kc, pixels, 0, runs);
    for (int sl = 0; sl * W < count; ++sl) {
      float* dst = dst_all + static_cast<int64_t>(sl) * kc * W;
      const int width = std::min(W, count - sl * W);
      const float* row_ptrs[W];
      for (int i = 0; i < n_runs; ++i) {
        for (int w = 0; w < width; ++w) row_ptrs[w] = at(first + sl * W + w, runs[i]);
        rows_to_sliver<W, Avx>(row_ptrs, width, runs[i].len, dst + runs[i].offset * W);
      }
      for (int w = width; w < W; ++w)
        for (int kk = 0; kk < kc; ++kk) dst[kk * W + w] = 0.0f;
    }
    return;
  }
  // w: pixel columns, kk: the rows k0.. (the data gradient's op(B))
  for (int sl = 0; sl * W < count; ++sl) {
    float* dst = dst_all + static_cast<int64_t>(sl) * kc * W;
    const int width = std::min(W, count - sl * W);
    const int n_runs = pixel_runs(first + sl * W, width, pixels, 0, runs);
    for (int kk = 0; kk < kc; ++kk) {
      float* d = dst + kk * W;
      for (int i = 0; i < n_runs; ++i) std::memcpy(d + runs[i].offset, at(k0 + kk, runs[i]), sizeof(float) * runs[i].len);
      for (int w = width; w < W; ++w) d[w] = 0.0f;
    }
  }
}

// op(B) read in place (TileSource): when each of its rows kk runs along the columns in
// the stored data, a full NR-wide sliver is NR contiguous floats per row, at
// in_place_sliver(first column) + rows[kk]. in_place_rows fills rows[0..kc) for the k
// block at k0 and says whether the operand is of that kind; in_place_sliver gives
// nullptr for a sliver that does not lie in one stretch (one crossing images), which is
// packed instead, and where `run` is given, how many columns from `first` on lie in the
// stretch (the rest of an image's, or all of a stored matrix's).
bool in_place_rows(const Operand& o, int k0, int kc, int64_t* rows) {
  if (o.trans != Trans::No) return false;  // op(B)'s rows run across the stored rows
  switch (o.source) {
    case Operand::Source::Dense:
      for (int kk = 0; kk < kc; ++kk) rows[kk] = static_cast<int64_t>(k0 + kk) * o.ld;
      return true;
    case Operand::Source::Patches:  // a tap's row: a stretch of each padded image
      if (o.columns != PatchColumns::PaddedRows) return false;
      tap_offsets(o.images, k0, kc, rows);
      return true;
    case Operand::Source::ImageRows:  // a channel's row: its pixels in each image
      for (int kk = 0; kk < kc; ++kk) rows[kk] = static_cast<int64_t>(k0 + kk) * o.pixels;
      return true;
  }
  return false;
}

const float* in_place_sliver(const Operand& o, int64_t first, int width, int64_t* run = nullptr) {
  int64_t per_image = INT32_MAX, image = 0, pixel = first;  // a stored matrix: one stretch
  const float* base = o.data;
  switch (o.source) {
    case Operand::Source::Dense:
      break;
    case Operand::Source::Patches:
      per_image = static_cast<int64_t>(o.images.out_h) * o.images.wp;
      image = first / per_image, pixel = first % per_image;
      base = o.images.data + image * o.images.image_floats();
      break;
    case Operand::Source::ImageRows:
      per_image = o.pixels;
      image = first / per_image, pixel = first % per_image;
      base = o.data + image * o.rows * o.pixels;
      break;
  }
  if (run) *run = per_image - pixel;
  return pixel + width <= per_image ? base + pixel : nullptr;
}

// op(A) = the patches matrix read in place (AForm::Gathered): the offset of each column
// k0..k0+kc-1 in the padded images, for a tap at offset 0 (a tap's row adds its own,
// tap_offsets). False for any other operand.
bool gathered_columns(const Operand& o, int k0, int kc, int64_t* cols) {
  if (o.source != Operand::Source::Patches || o.trans != Trans::No) return false;
  const PaddedImages& im = o.images;
  const bool pixels = o.columns == PatchColumns::Pixels;
  const int64_t per_image = static_cast<int64_t>(im.out_h) * (pixels ? im.out_w : im.wp);
  PixelRun runs[kKc];
  const int n_runs = pixel_runs(k0, kc, per_image, pixels ? im.out_w : 0, runs);
  for (int i = 0; i < n_runs; ++i) {
    const int64_t base =
        runs[i].image * im.image_floats() + (pixels ? static_cast<int64_t>(runs[i].oh) * im.wp + runs[i].ow : runs[i].pixel);
    for (int j = 0; j < runs[i].len; ++j) cols[runs[i].offset + j] = base + j;
  }
  return true;
}

// Whether a sliver read in place at these row offsets stays in L1 while the row block's
// tiles read it again: a stored matrix whose row length is a multiple of a few KiB puts
// every row in the same few of L1's 64 sets (conv2's forward as a dense 288 x 1792
// product ran at 61 % of peak in place, 66 % packed). Counts the distinct 64-byte lines
// the rows can touch in each set and allows a third of a set's ways (12 on this VM's
// CPU, 8 on Haswell's), leaving room for A's rows and C.
bool rows_spread_over_l1(const int64_t* rows, int kc, int row_floats) {
  constexpr int kSets = 64, kLinesPerSet = 4;
  const int64_t lines_per_row = (row_floats * 4 + 63) / 64 + 1;  // any alignment
  int per_set[kSets] = {};
  // The offsets are >= 0 and never decrease (rows, taps, channels in order), so the
  // lines counted so far that a row's lines can meet end at `counted`: a line is new
  // past it.
  int64_t counted = -1;
  for (int kk = 0; kk < kc; ++kk) {
    const int64_t first = rows[kk] * 4 / 64, last = first + lines_per_row - 1;
    for (int64_t line = std::max(first, counted + 1); line <= last; ++line)
      if (++per_set[line % kSets] > kLinesPerSet) return false;
    counted = std::max(counted, last);
  }
  return true;
}

enum class Role { A, B };

// Packs X (see above) of operand `o` in its role.
template <int W, bool Avx>
void pack(const Operand& o, Role role, int first, int count, int k0, int kc, float* dst) {
  // X = op(A) for A, op(B)^T for B: w runs along the stored matrix's rows when A is not
  // transposed or B is.
  const bool w_along_rows = (role == Role::A) == (o.trans == Trans::No);
  switch (o.source) {
    case Operand::Source::Dense:
      dense_pack<W, Avx>(w_along_rows, o.data, o.ld, first, count, k0, kc, dst);
      return;
    case Operand::Source::Patches:
      patches_pack<W, Avx>(w_along_rows, o.images, o.columns, first, count, k0, kc, dst);
      return;
    case Operand::Source::ImageRows:
      image_rows_pack<W, Avx>(w_along_rows, o.data, o.rows, o.pixels, first, count, k0, kc, dst);
      return;
  }
}

#if defined(__x86_64__)
// A product with a short K (at most Short::kMaxK: conv1's forward, K = 9) by the
// strip kernels (gemm_microkernels.h): op(A) copied once into rows kMaxK apart
// (M x kMaxK floats), op(B) read in place in runs of whole strips where it can be, a
// strip packed where it cannot (one crossing images, the last ragged one).
template <class Short, bool Avx>
void gemm_short_k(int m, int n, int k, const Operand& a, const Operand& b, ChainStart start, const float* values,
                  float* c, int ldc, const ColumnsDone& done) {
  constexpr int W = Short::W;
  ShortKStrips s;
  s.ldc = ldc, s.m = m, s.k = k, s.start = start;
  // op(A)'s rows kMaxK floats apart, so that the kernels' broadcasts are at fixed
  // offsets from a group's first row (with a run-time row length the 16 rows' addresses
  // took the integer registers, and the product ran at 57 % of peak).
  constexpr int a_stride = Short::kMaxK;
  float* rows = thread_scratch(Scratch::PackedA, static_cast<std::size_t>(m) * a_stride);
  pack<1, false>(a, Role::A, 0, m, 0, k, rows);  // 1-wide slivers: the rows one after another, k apart
  for (int r = m - 1; r > 0; --r)  // then spread, from the last row down
    std::memmove(rows + static_cast<int64_t>(r) * a_stride, rows + static_cast<int64_t>(r) * k, sizeof(float) * k);
  s.a = rows;
  int64_t b_rows[kKc], packed_rows[kKc];
  for (int kk = 0; kk < k; ++kk) packed_rows[kk] = static_cast<int64_t>(kk) * W;
  const bool in_place = in_place_rows(b, 0, k, b_rows);
  float* packed = thread_scratch(Scratch::PackedB, static_cast<std::size_t>(W) * k);
  for (int j = 0; j < n;) {
    const int cols = std::min(W, n - j);
    s.c = c + j;
    s.values = start == ChainStart::RowValues ? values : start == ChainStart::ColumnValues ? values + j : nullptr;
    int64_t run = 0;
    const float* first = in_place && cols == W ? in_place_sliver(b, j, W, &run) : nullptr;
    if (first) {
      s.b = first, s.b_off = b_rows, s.cols = W;
      s.strips = static_cast<int>(std::min<int64_t>(n - j, run) / W);
    } else {
      pack<W, Avx>(b, Role::B, j, cols, 0, k, packed);
      s.b = packed, s.b_off = packed_rows, s.cols = cols, s.strips = 1;
    }
    Short::strips(s);
    j += s.strips * W;
  }
  if (done.call) done.call(done.context, n);
}
#endif

// Kernel: MR, NR, kAvx, kInPlace, and
//   template <AForm kA, bool kRowsB>
//   static void tile(int kc, const TileSource& src, float* c, int ldc, ChainStart start, const float* init)
// which runs a full MR x NR tile of C (init: the tile's first row or column value),
// op(A) as kA says, op(B) in place (kRowsB) or packed (gemm_microkernels.h); and
// top_rows, the same for a tile's first rows.
template <class Kernel>
void gemm_blocked(int m, int n, int k, const Operand& a, const Operand& b, ChainStart start, const float* values,
                  float* c, int ldc, const ColumnsDone& done = {}) {
  constexpr int MR = Kernel::MR, NR = Kernel::NR;
  static_assert(MR <= kKc && NR <= kKc, "a sliver of patches fits the run buffers");
  if (m <= 0 || n <= 0) {
    if (n > 0 && done.call) done.call(done.context, n);  // no rows: every column is final
    return;
  }
  if (k <= 0) {  // no multiply-add: C stays, or becomes its start
    if (start != ChainStart::C)
      for (int i = 0; i < m; ++i)
        for (int j = 0; j < n; ++j)
          c[static_cast<int64_t>(i) * ldc + j] = start == ChainStart::RowValues      ? values[i]
                                                 : start == ChainStart::ColumnValues ? values[j]
                                                                                     : 0.0f;
    if (done.call) done.call(done.context, n);
    return;
  }
#if defined(__x86_64__)
  using Short = typename ShortKOf<Kernel>::type;
  if constexpr (!std::is_void_v<Short>)
    if (k <= Short::kMaxK) return gemm_short_k<Short, Kernel::kAvx>(m, n, k, a, b, start, values, c, ldc, done);
#endif
  // K in equal blocks of at most kKc (288 as 144 + 144, not 256 + 32): a short last
  // block would reload and store the whole of C for a few multiply-adds.
  const int k_blocks = (k + kKc - 1) / kKc, k_step = (k + k_blocks - 1) / k_blocks;
  // Row blocks of kMc rows; for a caller told of final columns, as many as a short k
  // block leaves room for in L2 (the A block the same size), so that more columns are
  // final sooner: conv2's data gradient (288 rows, K = 64) in one pass, its columns
  // final sliver by sliver. Only then: an A block larger than L1 runs slower (conv2's
  // data gradient alone: 80 % of peak in one pass, 88 % in three; in the step the
  // col2im it lets run on cached columns gains more).
  const int m_step = done.call ? std::max(kMc, kMcKc / k_step / MR * MR) : kMc;
  const int nc_max = std::min(n, kNc), mc_max = std::min(m, m_step);
  float* bp = thread_scratch(Scratch::PackedB, static_cast<std::size_t>((nc_max + NR - 1) / NR) * NR * k_step);
  float* ap = thread_scratch(Scratch::PackedA, static_cast<std::size_t>((mc_max + MR - 1) / MR) * MR * k_step);
  alignas(64) float edge[MR * NR];
  int64_t b_rows[kKc], a_cols[kKc];
  // op(A) stored with its rows along k (a plain matrix, not transposed): its full
  // slivers are broadcast in place (no transposing copy); only a ragged last sliver is
  // packed. Not for a short k block: there the in-place kernel's setup of MR row
  // addresses cost more than packing A once (conv1's K = 9). A transposed stored matrix
  // (dy^T, W^T) holds each sliver's k-th values side by side in its row k: read in place
  // too when few column slivers read it (fc1's weight gradient: 2), where its rows spread
  // over L1's sets; a block that many slivers read again runs faster packed (conv2's
  // data gradient, 49 slivers: 83 % of peak packed, 75 % in place). The patches of a
  // weight gradient (taps x pixels) are broadcast from the padded images, a tap's offset
  // plus a pixel's (AForm::Gathered): packing them was a transposing copy of every
  // float, a fifth of conv2's weight gradient.
  const bool dense_a = Kernel::kInPlace && a.source == Operand::Source::Dense;
  const bool a_rows_in_place = dense_a && a.trans == Trans::No && k_step >= 32;
  for (int j0 = 0; j0 < n; j0 += kNc) {
    const int nc = std::min(kNc, n - j0);
    for (int k0 = 0; k0 < k; k0 += k_step) {
      const int kc = std::min(k_step, k - k0);
      // After the first k block, the chain goes on from C.
      const ChainStart from = k0 > 0 ? ChainStart::C : start;
      const bool b_rows_in_place =
          Kernel::kInPlace && in_place_rows(b, k0, kc, b_rows) && rows_spread_over_l1(b_rows, kc, NR);
      bool a_cols_in_place = false;
      if (dense_a && a.trans == Trans::Yes && n <= 4 * NR) {
        int64_t a_rows_at[kKc];
        for (int kk = 0; kk < kc; ++kk) a_rows_at[kk] = static_cast<int64_t>(k0 + kk) * a.ld;
        a_cols_in_place = rows_spread_over_l1(a_rows_at, kc, MR);
      }
      const bool a_gathered =
          Kernel::kInPlace && !a_rows_in_place && !a_cols_in_place && gathered_columns(a, k0, kc, a_cols);
      for (int i0 = 0; i0 < m; i0 += m_step) {
        const int mc = std::min(m_step, m - i0);
        const bool last_pass = k0 + kc == k && i0 + mc == m;
        const int full = a_rows_in_place || a_cols_in_place || a_gathered ? mc / MR * MR : 0;
        if (full < mc) pack<MR, Kernel::kAvx>(a, Role::A, i0 + full, mc - full, k0, kc, ap);
        for (int js = 0; js * NR < nc; ++js) {
          const int cols = std::min(NR, nc - js * NR);
          // op(B)'s sliver: read in place where it is whole and one stretch, else packed
          // (on the first row block; the later ones find it there).
          const float* b_in_place = b_rows_in_place && cols == NR ? in_place_sliver(b, j0 + js * NR, NR) : nullptr;
          float* b_packed = bp + static_cast<int64_t>(js) * kc * NR;
          if (!b_in_place && i0 == 0) pack<NR, Kernel::kAvx>(b, Role::B, j0 + js * NR, cols, k0, kc, b_packed);
          for (int is = 0; is * MR < mc; ++is) {
            const int rows = std::min(MR, mc - is * MR);
            const bool a_in_place = is * MR < full;
            const AForm a_form = !a_in_place        ? AForm::Sliver
                                 : a_rows_in_place ? AForm::Rows
                                 : a_gathered      ? AForm::Gathered
                                                   : AForm::Sliver;
            TileSource src;
            int64_t a_rows[MR];
            if (!a_in_place) {
              src.a = ap + static_cast<int64_t>(is - full / MR) * kc * MR, src.a_step = MR;
            } else if (a_form == AForm::Rows) {
              src.a = a.data + static_cast<int64_t>(i0 + is * MR) * a.ld + k0, src.lda = a.ld;
            } else if (a_form == AForm::Gathered) {
              tap_offsets(a.images, i0 + is * MR, MR, a_rows);
              src.a = a.images.data, src.a_rows = a_rows, src.a_cols = a_cols;
            } else {
              src.a = a.data + static_cast<int64_t>(k0) * a.ld + i0 + is * MR, src.a_step = a.ld;
            }
            if (b_in_place)
              src.b = b_in_place, src.b_rows = b_rows;
            else
              src.b = b_packed;
            // `count` whole tiles down the sliver from this one, op(A) a_next floats further
            // for each (Kernel::tiles; the Gathered form has row offsets of its own per
            // tile, and runs one at a time).
            auto run_tiles = [&](int count, long a_next, float* to, int ld_to, ChainStart tile_from,
                                 const float* tile_init) {
              if constexpr (Kernel::kInPlace) {
                if (a_form == AForm::Gathered)
                  return b_in_place
                             ? Kernel::template tile<AForm::Gathered, true>(kc, src, to, ld_to, tile_from, tile_init)
                             : Kernel::template tile<AForm::Gathered, false>(kc, src, to, ld_to, tile_from, tile_init);
                if (a_form == AForm::Rows)
                  return b_in_place ? Kernel::template tiles<AForm::Rows, true>(count, kc, src, a_next, to, ld_to,
                                                                                tile_from, tile_init)
                                    : Kernel::template tiles<AForm::Rows, false>(count, kc, src, a_next, to, ld_to,
                                                                                 tile_from, tile_init);
                return b_in_place ? Kernel::template tiles<AForm::Sliver, true>(count, kc, src, a_next, to, ld_to,
                                                                                tile_from, tile_init)
                                  : Kernel::template tiles<AForm::Sliver, false>(count, kc, src, a_next, to, ld_to,
                                                                                 tile_from, tile_init);
              } else {
                (void)count, (void)a_next;
                Kernel::template tile<AForm::Sliver, false>(kc, src, to, ld_to, tile_from, tile_init);
              }
            };
            float* ct = c + static_cast<int64_t>(i0 + is * MR) * ldc + j0 + js * NR;
            const int row0 = i0 + is * MR, col0 = j0 + js * NR;
            const float* init = from == ChainStart::RowValues      ? values + row0
                                : from == ChainStart::ColumnValues ? values + col0
                                                                   : nullptr;
            if (rows == MR && cols == NR) {
              // The whole tiles from here that op(A) reaches by a fixed stride (packed, or
              // stored rows or columns in place), in one call: a call and its set-up per
              // tile cost a sixth of a short product's time (conv1's forward, K = 9: 144
              // multiply-adds a tile).
              int count = 1;
              long a_next = 0;
              if (Kernel::kInPlace && a_form != AForm::Gathered) {
                count = (a_in_place ? full : mc) / MR - is;
                a_next = !a_in_place                ? static_cast<long>(kc) * MR
                         : a_form == AForm::Rows ? static_cast<long>(MR) * a.ld
                                                 : MR;
              }
              run_tiles(count, a_next, ct, ldc, from, init);
              is += count - 1;
              continue;
            }
            if constexpr (Kernel::kInPlace) {
              if (cols == NR) {  // the last rows: a shorter tile, straight on C
                if (b_in_place)
                  Kernel::template top_rows<AForm::Sliver, true>(rows, kc, src, ct, ldc, from, init);
                else
                  Kernel::template top_rows<AForm::Sliver, false>(rows, kc, src, ct, ldc, from, init);
                continue;
              }
            }
            // A ragged tile: through a full-size copy of its starts (the padding lanes
            // are chains of their own, computed and dropped).
            for (int r = 0; r < MR; ++r)
              for (int q = 0; q < NR; ++q) {
                float v = 0.0f;
                if (r < rows && q < cols)
                  v = from == ChainStart::C              ? ct[static_cast<int64_t>(r) * ldc + q]
                      : from == ChainStart::RowValues    ? init[r]
                      : from == ChainStart::ColumnValues ? init[q]
                                                         : 0.0f;
                edge[r * NR + q] = v;
              }
            run_tiles(1, 0, edge, NR, ChainStart::C, nullptr);
            for (int r = 0; r < rows; ++r)
              std::memcpy(ct + static_cast<int64_t>(r) * ldc, edge + r * NR, sizeof(float) * cols);
          }
          if (last_pass && done.call) done.call(done.context, j0 + js * NR + cols);
        }
      }
    }
  }
}

#if defined(__x86_64__)
// Whether the product is conv1's weight gradient as TapsByChannels runs it
// (gemm_microkernels.h): op(A) the patches of one-channel images with a 3 x 3 kernel
// (9 rows), op(B) the N channels of dy as image rows, transposed; chains from +0 or C.
// If so, `s` says where everything is (N is for the caller to check).
bool taps_by_channels(int m, int n, int k, const Operand& a, const Operand& b, ChainStart start, float* c, int ldc,
                      TapsByChannels& s) {
  const PaddedImages& im = a.images;
  if (a.source != Operand::Source::Patches || a.trans != Trans::No || a.columns != PatchColumns::Pixels) return false;
  if (b.source != Operand::Source::ImageRows || b.trans != Trans::Yes || b.rows != n) return false;
  if (m != 9 || im.c != 1 || im.r != 3 || im.s != 3 || k <= 0) return false;
  if (b.pixels != static_cast<int64_t>(im.out_h) * im.out_w) return false;
  if (start != ChainStart::Zero && start != ChainStart::C) return false;
  s.images = im.data, s.image_floats = im.image_floats();
  s.wp = im.wp, s.out_w = im.out_w, s.ohw = static_cast<int>(b.pixels);
  s.dy = b.data, s.n = n, s.k = k, s.c = c, s.ldc = ldc, s.from_c = start == ChainStart::C;
  return true;
}
#endif

}  // namespace

void gemm_with(CpuKernels path, int m, int n, int k, const Operand& a, const Operand& b, ChainStart start,
               const float* values, float* c, int ldc, const ColumnsDone& done) {
  switch (path) {
#if defined(__x86_64__)
    case CpuKernels::Avx512:
      if (TapsByChannels s; taps_by_channels(m, n, k, a, b, start, c, ldc, s) && (n == 16 || n == 32)) {
        if (n == 32 && s.wp == 30 && s.out_w == 28 && s.ohw == 784)  // the model's conv1
          Avx512TapsByChannels<2, 30, 28, 784>::run(s);
        else
          n == 16 ? Avx512TapsByChannels<1>::run(s) : Avx512TapsByChannels<2>::run(s);
        if (done.call) done.call(done.context, n);
        return;
      }
      switch (m) {  // 9 to 12 rows: one tile of that height (gemm_microkernels.h)
        case 9:
          return gemm_blocked<Avx512TileT<9>>(m, n, k, a, b, start, values, c, ldc, done);
        case 10:
          return gemm_blocked<Avx512TileT<10>>(m, n, k, a, b, start, values, c, ldc, done);
        case 11:
          return gemm_blocked<Avx512TileT<11>>(m, n, k, a, b, start, values, c, ldc, done);
        case 12:
          return gemm_blocked<Avx512TileT<12>>(m, n, k, a, b, start, values, c, ldc, done);
        default:
          return gemm_blocked<Avx512Tile>(m, n, k, a, b, start, values, c, ldc, done);
      }
    case CpuKernels::Avx2:
      if (TapsByChannels s; taps_by_channels(m, n, k, a, b, start, c, ldc, s) && n % 8 == 0 && n <= 32) {
        switch (n / 8) {
          case 1: Avx2TapsByChannels<1>::run(s); break;
          case 2: Avx2TapsByChannels<2>::run(s); break;
          case 3: Avx2TapsByChannels<3>::run(s); break;
          default:
            if (s.wp == 30 && s.out_w == 28 && s.ohw == 784)  // the model's conv1
              Avx2TapsByChannels<4, 30, 28, 784>::run(s);
            else
              Avx2TapsByChannels<4>::run(s);
            break;
        }
        if (done.call) done.call(done.context, n);
        return;
      }
      gemm_blocked<Avx2Tile>(m, n, k, a, b, start, values, c, ldc, done);
      return;
    case CpuKernels::Portable:
      if (cpu_has_hardware_fma())
        gemm_blocked<PortableFmaTile>(m, n, k, a, b, start, values, c, ldc, done);
      else
        gemm_blocked<PortableTile>(m, n, k, a, b, start, values, c, ldc, done);
      return;
#endif
    default:  // Portable off x86-64 (the x86 paths: cpu_supports says no to them there)
      gemm_blocked<PortableTile>(m, n, k, a, b, start, values, c, ldc, done);
      return;
  }
}

void gemm(int m, int n, int k, const Operand& a, const Operand& b, ChainStart start, const float* values, float* c,
          int ldc, const ColumnsDone& done) {
  static const CpuKernels path = cpu_kernels();
  gemm_with(path, m, n, k, a, b, start, values, c, ldc, done);
}

void gemm_with(CpuKernels path, int m, int n, int k, const Operand& a, const Operand& b, float beta, float* c,
               int ldc) {
  gemm_with(path, m, n, k, a, b, beta == 0.0f ? ChainStart::Zero : ChainStart::C, nullptr, c, ldc);
}

void gemm(int m, int n, int k, const Operand& a, const Operand& b, float beta, float* c, int ldc) {
  gemm(m, n, k, a, b, beta == 0.0f ? ChainStart::Zero : ChainStart::C, nullptr, c, ldc);
}

void gemm_with(CpuKernels path, Trans trans_a, Trans trans_b, int m, int n, int k, const float* a, int lda,
               const float* b, int ldb, float beta, float* c, int ldc) {
  gemm_with(path, m, n, k, Operand::dense(trans_a, a, lda), Operand::dense(trans_b, b, ldb), beta, c, ldc);
}

void gemm_portable_software_fma(Trans trans_a, Trans trans_b, int m, int n, int k, const float* a, int lda,
                                const float* b, int ldb, float beta, float* c, int ldc) {
  gemm_blocked<PortableTile>(m, n, k, Operand::dense(trans_a, a, lda), Operand::dense(trans_b, b, ldb),
                             beta == 0.0f ? ChainStart::Zero : ChainStart::C, nullptr, c, ldc);
}

void gemm(Trans trans_a, Trans trans_b, int m, int n, int k, const float* a, int lda, const float* b, int ldb,
          float beta, float* c, int ldc) {
  gemm(m, n, k, Operand::dense(trans_a, a, lda), Operand::dense(trans_b, b, ldb), beta, c, ldc);
}

}  // namespace engine::kernels::cpu
