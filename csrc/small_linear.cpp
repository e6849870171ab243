// y = x @ W^T for a few rows of x: the products of a tree verification step (1-128 tokens) on a CPU.
//
// nbs/api/3-forward/06a_small_linear.ipynb is the specification and F.linear the reference. Why a kernel of our own: for 2-16 rows MKL
// reads (and packs) each weight matrix as for a large product, so a step of 3 tokens costs about twice a step of 1. Here
// every weight row is read once from memory, in place (PyTorch's [out, in] layout, no copy), and multiplied with all n
// input rows while it sits in registers: the step stays bound by the weight bytes until n is large enough for the
// arithmetic to dominate, and then it is bound by how many multiply-adds each loaded vector feeds.
//
// Tiling: OB weight rows x RB input rows per register tile, 8 float lanes, OB * RB accumulators. With AVX-512VL the
// compiler has 32 vector registers for the same 8-lane code: OB = 6, RB = 4 (24 accumulators, 6 weight registers, each
// loaded input vector feeds 6 FMAs). With AVX2 alone, 16 registers: OB = 4, RB = 3. Without AVX2 + FMA, a scalar loop.
// Each output y[r, j] is one dot product summed the same way on every path and whatever n is: 8 lanes over k in steps
// of 8, the lanes added in a fixed tree, then the k tail in order. So a row's result does not depend on how many rows
// are in the call nor on which instruction set ran it, and the result is deterministic. Threads: OpenMP over blocks of
// 48 output columns (the same runtime as PyTorch's, libgomp).
//
// Fetching ahead: while a block's first tile of input rows runs, the same loop asks the memory system for the weight rows
// of the block `ahead` blocks further on (prefetch hints: no arithmetic changes, an address past the end is harmless).
// Without it, at a tree step's 4-16 rows each block waits for its weights and then computes, one after the other. At one
// row the CPU's own prefetchers keep up and the hints only cost instructions: none are issued.
#include <pybind11/pybind11.h>
#include <pybind11/numpy.h>
#include <pybind11/stl.h>
#include <immintrin.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace py = pybind11;
using i64 = std::int64_t;
using farr = py::array_t<float, py::array::c_style>;

constexpr i64 CHUNK = 48;   // output columns per OpenMP task (a multiple of every OB)
static int ahead = 4;        // fetch the weight rows of the block this many blocks on (0: no prefetch hints); set_ahead

// y[r * ldy + o] = dot(w[o * K: (o + 1) * K], x[r * K: (r + 1) * K]) for o < OB, r < RB, and prefetch hints for the rows at
// `next` (unless null); one body, compiled twice below
#define DYSPEC_TILE_BODY                                                                                                   \
    __m256 acc[OB][RB];                                                                                                    \
    for (int o = 0; o < OB; ++o) for (int r = 0; r < RB; ++r) acc[o][r] = _mm256_setzero_ps();                             \
    i64 k = 0;                                                                                                             \
    for (; k + 8 <= K; k += 8) {                                                                                           \
        __m256 wv[OB];                                                                                                     \
        for (int o = 0; o < OB; ++o) wv[o] = _mm256_loadu_ps(w + o * K + k);                                               \
        if (next) for (int o = 0; o < OB; ++o) _mm_prefetch(reinterpret_cast<const char*>(next + o * K + k), _MM_HINT_T0);   \
        for (int r = 0; r < RB; ++r) {                                                                                     \
            __m256 xv = _mm256_loadu_ps(x + r * K + k);                                                                    \
            for (int o = 0; o < OB; ++o) acc[o][r] = _mm256_fmadd_ps(wv[o], xv, acc[o][r]);                                \
        }                                                                                                                  \
    }                                                                                                                      \
    for (int o = 0; o < OB; ++o) for (int r = 0; r < RB; ++r) {                                                            \
        alignas(32) float l[8];                                                                                            \
        _mm256_store_ps(l, acc[o][r]);                                                                                     \
        float s = ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]));                                       \
        for (i64 kk = k; kk < K; ++kk) s += w[o * K + kk] * x[r * K + kk];                                                 \
        y[r * ldy + o] = s;                                                                                                \
    }

template <int OB, int RB>
__attribute__((target("avx2,fma"))) static inline void tile_avx2(const float* x, const float* w, i64 K, float* y, i64 ldy, const float* next) {
    DYSPEC_TILE_BODY
}

// the same instructions, EVEX-encoded: ymm16-31 hold the larger tile's accumulators
template <int OB, int RB>
__attribute__((target("avx2,fma,avx512f,avx512vl"))) static inline void tile_avx512vl(const float* x, const float* w, i64 K, float* y, i64 ldy, const float* next) {
    DYSPEC_TILE_BODY
}

// The same sums without vector instructions: lane l of the accumulator holds the terms k = l (mod 8) of the vector part.
template <int OB, int RB>
static inline void tile_scalar(const float* x, const float* w, i64 K, float* y, i64 ldy) {
    for (int o = 0; o < OB; ++o) for (int r = 0; r < RB; ++r) {
        float l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        i64 k = 0;
        for (; k + 8 <= K; k += 8) for (int j = 0; j < 8; ++j) l[j] += w[o * K + k + j] * x[r * K + k + j];
        float s = ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]));
        for (i64 kk = k; kk < K; ++kk) s += w[o * K + kk] * x[r * K + kk];
        y[r * ldy + o] = s;
    }
}

enum Path { SCALAR = 0, AVX2 = 1, AVX512VL = 2 };

// OB output columns for all n rows: tiles of RB rows, then of 2, then of 1; the first fetches the rows `ahead` blocks on
template <int OB, int RB, Path P>
static void columns(const float* x, i64 n, i64 K, const float* w, float* y, i64 N) {
    const float* later = ahead && n > 1 ? w + ahead * OB * K : nullptr;   // one row: the CPU's prefetchers keep up, hints only cost
    auto tile = [&](auto rb, i64 r) {
        constexpr int R = decltype(rb)::value;
        const float* next = r == 0 ? later : nullptr;
        if constexpr (P == AVX512VL) tile_avx512vl<OB, R>(x + r * K, w, K, y + r * N, N, next);
        else if constexpr (P == AVX2) tile_avx2<OB, R>(x + r * K, w, K, y + r * N, N, next);
        else tile_scalar<OB, R>(x + r * K, w, K, y + r * N, N);
    };
    i64 r = 0;
    for (; r + RB <= n; r += RB) tile(std::integral_constant<int, RB>{}, r);
    for (; r + 2 <= n; r += 2) tile(std::integral_constant<int, 2>{}, r);
    for (; r < n; ++r) tile(std::integral_constant<int, 1>{}, r);
}

// OpenMP over blocks of CHUNK output columns; block(j, ob) computes output columns j..j + ob - 1 of every row, ob = OB
// while a block has that many left, then 1
template <int OB, class Block>
static void over_columns(i64 N, Block block) {
    i64 tasks = (N + CHUNK - 1) / CHUNK;
    #pragma omp parallel for schedule(static)
    for (i64 t = 0; t < tasks; ++t) {
        i64 j = t * CHUNK, end = std::min(N, j + CHUNK);
        for (; j + OB <= end; j += OB) block(j, std::integral_constant<int, OB>{});
        for (; j < end; ++j) block(j, std::integral_constant<int, 1>{});
    }
}

template <int OB, int RB, Path P>
static void linear_impl(const float* x, i64 n, i64 K, const float* w, i64 N, float* y) {
    over_columns<OB>(N, [&](i64 j, auto ob) { columns<decltype(ob)::value, RB, P>(x, n, K, w + j * K, y + j, N); });
}

static bool has_avx2() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }
static bool has_avx512vl() { return has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl"); }

// the widest path this CPU runs, at most `limit`
static Path path_for(int limit) {
    if (limit >= AVX512VL && has_avx512vl()) return AVX512VL;
    if (limit >= AVX2 && has_avx2()) return AVX2;
    return SCALAR;
}

// y[n, N] = x[n, K] @ w[N, K]^T, written into y (float32, C-contiguous, all three); limit: 2 the widest path the CPU has,
// 1 AVX2 at most, 0 the scalar path
static void linear(farr x, farr w, farr y, int limit) {
    if (x.ndim() != 2 || w.ndim() != 2 || y.ndim() != 2) throw std::invalid_argument("small_linear: x, w and y must be 2-D");
    i64 n = x.shape(0), K = x.shape(1), N = w.shape(0);
    if (w.shape(1) != K) throw std::invalid_argument("small_linear: x has " + std::to_string(K) + " columns, w has " + std::to_string(w.shape(1)));
    if (y.shape(0) != n || y.shape(1) != N)
        throw std::invalid_argument("small_linear: y must have shape [" + std::to_string(n) + ", " + std::to_string(N) + "]");
    const float* xp = x.data(); const float* wp = w.data(); float* yp = y.mutable_data();
    Path p = path_for(limit);
    py::gil_scoped_release nogil;
    if (p == AVX512VL) linear_impl<6, 4, AVX512VL>(xp, n, K, wp, N, yp);
    else if (p == AVX2) linear_impl<4, 3, AVX2>(xp, n, K, wp, N, yp);
    else linear_impl<2, 4, SCALAR>(xp, n, K, wp, N, yp);
}

// ---- bfloat16 operands: y[n, N] = bf16(x[n, K]) @ w[N, K]^T, x rounded to bfloat16 here, w bfloat16 (raw uint16 bits), sums in float32 ----
// For a draft, whose weights need not be exact: half the weight bytes of float32, and with AVX-512 BF16 one vdpbf16ps
// multiplies 32 pairs and adds them into 16 float32 lanes (lane l sums k = 2l, 2l + 1 of each 32), twice the arithmetic
// of a 16-lane float32 FMA. Tiling as above, in 16-lane registers: OB = 6 weight rows x RB = 4 input rows. Each output
// is summed the same way whatever n is: the 16 lanes over k in steps of 32, added in a fixed tree, then the
// k tail in order; the pair products are exact in float32, the sums round to nearest even (and, as the instruction
// does, flush denormals). There is no other path: without AVX-512 BF16 the caller uses F.linear on the same values.
using barr = py::array_t<std::uint16_t, py::array::c_style>;

static inline float bf16_to_float(std::uint16_t b) { std::uint32_t u = std::uint32_t(b) << 16; float f; std::memcpy(&f, &u, 4); return f; }

template <int OB, int RB>
__attribute__((target("avx512f,avx512bf16"))) static inline void tile_bf16(const std::uint16_t* x, const std::uint16_t* w, i64 K, float* y, i64 ldy,
                                                                          const std::uint16_t* next) {
    __m512 acc[OB][RB];
    for (int o = 0; o < OB; ++o) for (int r = 0; r < RB; ++r) acc[o][r] = _mm512_setzero_ps();
    i64 k = 0;
    for (; k + 32 <= K; k += 32) {
        __m512bh wv[OB];
        for (int o = 0; o < OB; ++o) wv[o] = (__m512bh)_mm512_loadu_si512(w + o * K + k);
        if (next) for (int o = 0; o < OB; ++o) _mm_prefetch(reinterpret_cast<const char*>(next + o * K + k), _MM_HINT_T0);
        for (int r = 0; r < RB; ++r) {
            __m512bh xv = (__m512bh)_mm512_loadu_si512(x + r * K + k);
            for (int o = 0; o < OB; ++o) acc[o][r] = _mm512_dpbf16_ps(acc[o][r], wv[o], xv);
        }
    }
    for (int o = 0; o < OB; ++o) for (int r = 0; r < RB; ++r) {
        alignas(64) float l[16];
        _mm512_store_ps(l, acc[o][r]);
        float s = (((l[0] + l[8]) + (l[4] + l[12])) + ((l[2] + l[10]) + (l[6] + l[14])))
                + (((l[1] + l[9]) + (l[5] + l[13])) + ((l[3] + l[11]) + (l[7] + l[15])));
        for (i64 kk = k; kk < K; ++kk) s += bf16_to_float(w[o * K + kk]) * bf16_to_float(x[r * K + kk]);
        y[r * ldy + o] = s;
    }
}

template <int OB, int RB>
static void columns_bf16(const std::uint16_t* x, i64 n, i64 K, const std::uint16_t* w, float* y, i64 N) {
    const std::uint16_t* later = ahead && n > 1 ? w + ahead * OB * K : nullptr;   // as `columns`
    i64 r = 0;
    for (; r + RB <= n; r += RB) tile_bf16<OB, RB>(x + r * K, w, K, y + r * N, N, r == 0 ? later : nullptr);
    for (; r + 2 <= n; r += 2) tile_bf16<OB, 2>(x + r * K, w, K, y + r * N, N, r == 0 ? later : nullptr);
    for (; r < n; ++r) tile_bf16<OB, 1>(x + r * K, w, K, y + r * N, N, r == 0 ? later : nullptr);
}

static bool has_bf16() { return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16"); }

// bf16(f) rounded to nearest even, as PyTorch's float -> bfloat16 conversion (NaN -> 0x7FC0)
static inline std::uint16_t float_to_bf16(float f) {
    std::uint32_t u; std::memcpy(&u, &f, 4);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0;
    return std::uint16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// y[n, N] = bf16(x[n, K]) @ w[N, K]^T: x float32 (rounded here), w bfloat16 bits (uint16), y float32; all C-contiguous
static void linear_bf16(farr x, barr w, farr y) {
    if (!has_bf16()) throw std::runtime_error("small_linear: this CPU has no AVX-512 BF16 (check bf16_available() first)");
    if (x.ndim() != 2 || w.ndim() != 2 || y.ndim() != 2) throw std::invalid_argument("small_linear: x, w and y must be 2-D");
    i64 n = x.shape(0), K = x.shape(1), N = w.shape(0);
    if (w.shape(1) != K) throw std::invalid_argument("small_linear: x has " + std::to_string(K) + " columns, w has " + std::to_string(w.shape(1)));
    if (y.shape(0) != n || y.shape(1) != N)
        throw std::invalid_argument("small_linear: y must have shape [" + std::to_string(n) + ", " + std::to_string(N) + "]");
    const float* xf = x.data(); const std::uint16_t* wp = w.data(); float* yp = y.mutable_data();
    py::gil_scoped_release nogil;
    std::vector<std::uint16_t> xb(std::size_t(n * K));                   // x's rows in bfloat16: read by every block
    for (i64 i = 0; i < n * K; ++i) xb[i] = float_to_bf16(xf[i]);
    const std::uint16_t* xp = xb.data();
    over_columns<6>(N, [&](i64 j, auto ob) { columns_bf16<decltype(ob)::value, 4>(xp, n, K, wp + j * K, yp + j, N); });
}

// ---- GGUF blocks (Q4_1, Q8_0) read in place: y[n, N] = x[n, K] @ W[N, K]^T, W's rows as a GGUF file packs them ----
// A row of W is K / 32 blocks of 32 weights. Q4_1: 20 bytes, d and m (float16), then 16 bytes whose low nibbles are
// q_0..q_15 and whose high nibbles are q_16..q_31, weight j = d * q_j + m. Q8_0: 34 bytes, d (float16), then 32 int8
// q_j, weight j = d * q_j. Each block is unpacked in registers into float32 weights: Q4_1's 16 possible values
// fma(q, d, m), q = 0..15, in one register, looked up by each nibble (vpermps reads an index's low 4 bits); Q8_0's
// q_j * d. Both are exact in float32 (d * q has 11 by 4 or 8 significant bits), so the weights are those of the file
// dequantised in float32 (gguf's `d * q + m`, `d * q`), bit for bit, and the products are then float32 products as
// above. Tiling: OB weight rows x RB input rows in 16-lane registers, each block unpacked once per tile: 4 x 4 up to 4
// rows, 2 x 8 above. Each output is summed the same way whatever n is: lane l adds block by block the products at
// k = 32 b + l, then at 32 b + 16 + l (one FMA each), and the 16 lanes are added in a fixed tree; the scalar path (a
// CPU without AVX-512) makes the same FMAs in the same order.
constexpr i64 QK = 32;
enum Format { Q4_1 = 0, Q8_0 = 1 };
constexpr i64 block_bytes(Format f) { return f == Q4_1 ? 20 : 34; }

static inline float half_to_float(std::uint16_t h) {
    std::uint32_t s = std::uint32_t(h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu, u;
    if (e == 31) u = s | 0x7F800000u | (m << 13);                              // inf, NaN
    else if (e) u = s | ((e + 112) << 23) | (m << 13);                        // normal
    else { float f = float(m) * 5.9604644775390625e-08f; std::memcpy(&u, &f, 4); u |= s; }   // subnormal, zero: m * 2^-24, exact
    float f; std::memcpy(&f, &u, 4); return f;
}

static inline float lanes16(const float* l) {
    return (((l[0] + l[8]) + (l[4] + l[12])) + ((l[2] + l[10]) + (l[6] + l[14])))
         + (((l[1] + l[9]) + (l[5] + l[13])) + ((l[3] + l[11]) + (l[7] + l[15])));
}

// a block's 32 weights in float32: lo = weights 0..15, hi = 16..31
template <Format F>
__attribute__((target("avx512f,avx512vl,fma,f16c"))) static inline void unpack(const std::uint8_t* blk, __m512& lo, __m512& hi) {
    if constexpr (F == Q4_1) {
        std::int32_t dm; std::memcpy(&dm, blk, 4);
        const __m128 dmf = _mm_cvtph_ps(_mm_cvtsi32_si128(dm));                    // [d, m, 0, 0] in float32 (F16C)
        const __m512 table = _mm512_fmadd_ps(_mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                             _mm512_broadcastss_ps(dmf), _mm512_broadcastss_ps(_mm_movehdup_ps(dmf)));   // d * q + m, q = 0..15
        const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 4)));   // byte j in lane j
        lo = _mm512_permutexvar_ps(bytes, table);                                   // by the low 4 bits of each lane: q_j
        hi = _mm512_permutexvar_ps(_mm512_srli_epi32(bytes, 4), table);             // by the high nibble: q_{16 + j}
    } else {
        std::uint16_t dh; std::memcpy(&dh, blk, 2);
        const __m512 d = _mm512_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(dh)));
        lo = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2)))), d);
        hi = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 18)))), d);
    }
}

template <Format F>
static inline void unpack_scalar(const std::uint8_t* blk, float* w) {      // w[32]
    std::uint16_t dh; std::memcpy(&dh, blk, 2);
    const float d = half_to_float(dh);
    if constexpr (F == Q4_1) {
        std::uint16_t mh; std::memcpy(&mh, blk + 2, 2);
        const float m = half_to_float(mh);
        for (int j = 0; j < 16; ++j) { w[j] = std::fma(float(blk[4 + j] & 0x0F), d, m); w[16 + j] = std::fma(float(blk[4 + j] >> 4), d, m); }
    } else {
        for (int j = 0; j < 32; ++j) w[j] = float(std::int8_t(blk[2 + j])) * d;
    }
}

template <Format F, int OB, int RB>
__attribute__((target("avx512f,avx512vl,fma,f16c"))) static inline void tile_packed(const float* x, const std::uint8_t* w, i64 K, float* y, i64 ldy) {
    const i64 B = K / QK, ldw = B * block_bytes(F);
    __m512 acc[OB][RB];
    for (int o = 0; o < OB; ++o) for (int r = 0; r < RB; ++r) acc[o][r] = _mm512_setzero_ps();
    for (i64 b = 0; b < B; ++b) {
        __m512 wlo[OB], whi[OB];
        for (int o = 0; o < OB; ++o) unpack<F>(w + o * ldw + b * block_bytes(F), wlo[o], whi[o]);
        for (int r = 0; r < RB; ++r) {
            const __m512 xlo = _mm512_loadu_ps(x + r * K + b * QK), xhi = _mm512_loadu_ps(x + r * K + b * QK + 16);
            for (int o = 0; o < OB; ++o) acc[o][r] = _mm512_fmadd_ps(whi[o], xhi, _mm512_fmadd_ps(wlo[o], xlo, acc[o][r]));
        }
    }
    for (int o = 0; o < OB; ++o) for (int r = 0; r < RB; ++r) {
        alignas(64) float l[16];
        _mm512_store_ps(l, acc[o][r]);
        y[r * ldy + o] = lanes16(l);
    }
}

template <Format F, int OB, int RB>
static inline void tile_packed_scalar(const float* x, const std::uint8_t* w, i64 K, float* y, i64 ldy) {
    const i64 B = K / QK, ldw = B * block_bytes(F);
    for (int o = 0; o < OB; ++o) for (int r = 0; r < RB; ++r) {
        float l[16] = {};
        for (i64 b = 0; b < B; ++b) {
            float wb[32];
            unpack_scalar<F>(w + o * ldw + b * block_bytes(F), wb);
            const float* xb = x + r * K + b * QK;
            for (int j = 0; j < 16; ++j) l[j] = std::fma(wb[16 + j], xb[16 + j], std::fma(wb[j], xb[j], l[j]));
        }
        y[r * ldy + o] = lanes16(l);
    }
}

template <Format F, int OB, int RB, bool VEC>
static void columns_packed(const float* x, i64 n, i64 K, const std::uint8_t* w, float* y, i64 N) {
    auto tile = [&](auto rb, i64 r) {
        constexpr int R = decltype(rb)::value;
        if constexpr (VEC) tile_packed<F, OB, R>(x + r * K, w, K, y + r * N, N);
        else tile_packed_scalar<F, OB, R>(x + r * K, w, K, y + r * N, N);
    };
    i64 r = 0;                                                                  // tiles of RB rows, then one of the rest
    for (; r + RB <= n; r += RB) tile(std::integral_constant<int, RB>{}, r);
    if constexpr (RB > 7) if (n - r == 7) return tile(std::integral_constant<int, 7>{}, r);
    if constexpr (RB > 6) if (n - r == 6) return tile(std::integral_constant<int, 6>{}, r);
    if constexpr (RB > 5) if (n - r == 5) return tile(std::integral_constant<int, 5>{}, r);
    if constexpr (RB > 4) if (n - r == 4) return tile(std::integral_constant<int, 4>{}, r);
    if (n - r == 3) tile(std::integral_constant<int, 3>{}, r);
    else if (n - r == 2) tile(std::integral_constant<int, 2>{}, r);
    else if (n - r == 1) tile(std::integral_constant<int, 1>{}, r);
}

static bool has_avx512() { return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"); }

template <Format F>
static void packed_impl(const float* x, i64 n, i64 K, const std::uint8_t* w, i64 N, float* y, bool vec) {
    const i64 ldw = K / QK * block_bytes(F);
    if (vec && n > 4) over_columns<2>(N, [&](i64 j, auto ob) { columns_packed<F, decltype(ob)::value, 8, true>(x, n, K, w + j * ldw, y + j, N); });
    else if (vec) over_columns<4>(N, [&](i64 j, auto ob) { columns_packed<F, decltype(ob)::value, 4, true>(x, n, K, w + j * ldw, y + j, N); });
    else over_columns<4>(N, [&](i64 j, auto ob) { columns_packed<F, decltype(ob)::value, 4, false>(x, n, K, w + j * ldw, y + j, N); });
}

// y[n, N] = x[n, K] @ W^T on raw addresses (data pointers): W's rows in blocks of `format` (0: Q4_1, 1: Q8_0),
// w[N, K / 32 * bytes] (uint8); x, y float32; all C-contiguous; vectorise false: the scalar path. No arrays cross the
// boundary, which keeps the call a few microseconds shorter than one through numpy views (it runs per product): the
// caller (`packed_linear`, 06f) checks the dtypes, shapes and contiguity that arrays would carry.
static void linear_packed_at(std::uintptr_t x, i64 n, i64 K, std::uintptr_t w, i64 N, std::uintptr_t y, int format, bool vectorise) {
    if (format != Q4_1 && format != Q8_0) throw std::invalid_argument("linear_packed_at: format must be 0 (Q4_1) or 1 (Q8_0), got " + std::to_string(format));
    if (n < 0 || N < 0 || K <= 0 || K % QK) throw std::invalid_argument("linear_packed_at: bad shape n=" + std::to_string(n) + ", K=" + std::to_string(K) + ", N=" + std::to_string(N));
    const float* xp = reinterpret_cast<const float*>(x); const std::uint8_t* wp = reinterpret_cast<const std::uint8_t*>(w); float* yp = reinterpret_cast<float*>(y);
    const bool vec = vectorise && has_avx512();
    py::gil_scoped_release nogil;
    if (format == Q4_1) packed_impl<Q4_1>(xp, n, K, wp, N, yp, vec);
    else packed_impl<Q8_0>(xp, n, K, wp, N, yp, vec);
}

// ---- Q4_1 blocks times int8 activations (AVX-512 VNNI), as llama.cpp multiplies them ----
// Each row of x is quantised per block of 32: dx = max|x| / 127, qx = nearest-even(x * 127 / max|x|) in [-127, 127], and
// sx = dx * sum(qx). Then y = sum over blocks of d dx sum_j(q_j qx_j) + m sx, the integer sums exact. The vector
// quantisation (AVX-512) and the scalar one compute the same values.
static bool has_vnni() { return has_avx512() && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni"); }

static inline void quantize_block(const float* xb, std::int8_t* q, float* dx, float* sx, float* sl, float* sh) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(xb[j]));
    const float d = amax / 127.0f, id = amax > 0 ? 127.0f / amax : 0.0f;
    int lo = 0, hi = 0;
    for (int j = 0; j < 32; ++j) {
        const int v = std::max(-127, std::min(127, int(std::nearbyint(xb[j] * id))));
        q[j] = std::int8_t(v); (j < 16 ? lo : hi) += v;
    }
    *dx = d; *sx = d * float(lo + hi); *sl = d * float(lo); *sh = d * float(hi);
}

__attribute__((target("avx512f,avx512vl,avx512bw,fma"))) static inline void quantize_block16(const float* xb, std::int8_t* q, float* dx, float* sx, float* sl, float* sh) {
    const __m512 a = _mm512_loadu_ps(xb), b = _mm512_loadu_ps(xb + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));   // max is exact in any order
    const float d = amax / 127.0f, id = amax > 0 ? 127.0f / amax : 0.0f;
    const __m512 idv = _mm512_set1_ps(id);
    const __m512i lim = _mm512_set1_epi32(127), nlim = _mm512_set1_epi32(-127);
    const __m512i qa = _mm512_max_epi32(nlim, _mm512_min_epi32(lim, _mm512_cvtps_epi32(_mm512_mul_ps(a, idv))));   // nearest even, as nearbyint
    const __m512i qb = _mm512_max_epi32(nlim, _mm512_min_epi32(lim, _mm512_cvtps_epi32(_mm512_mul_ps(b, idv))));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtepi32_epi8(qa));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16), _mm512_cvtepi32_epi8(qb));
    const int lo = _mm512_reduce_add_epi32(qa), hi = _mm512_reduce_add_epi32(qb);   // integers: exact
    *dx = d; *sx = d * float(lo + hi); *sl = d * float(lo); *sh = d * float(hi);
}

// ---- int8 activations on Q4_1 weights tiled by 16 output rows: the int8 products ----
// `repack_q4_1` (06f, PyTorch) lays a matrix's Q4_1 blocks out by tiles of 16 output rows, block by block: 256 bytes of nibbles (for
// each k-quad j = 0..3 of the block's first half, the 16 rows' 4 bytes 4j..4j+3: low nibbles are weights 4j..4j+3, high
// nibbles 16+4j..16+4j+3), then the 16 rows' d and m (float16): 320 bytes, the file's bytes for 16 blocks, the same
// scales, minimums and nibbles. Rows past N are zeros. One 16-lane register then holds one k-quad of 16 output rows, and
// vpdpbusd multiplies it by the row of x's 4 int8 activations broadcast: eight instructions a block give 16 outputs'
// integer sums, and the block's scales are applied per lane, no horizontal sums. Each output adds, block by block,
// float(isum) (d dx) and then m sx (two FMAs); the scalar path does the same, so results are bit for bit the same on both
// and do not depend on the number of rows.
constexpr i64 TILE = 16;
constexpr i64 TILE_BLOCK = 320;   // bytes of one block of a tile
// A tile's loop asks for the weights of the block `tile_ahead` blocks on (8: 2.5-6 KB ahead) while it computes this one
// (prefetch hints, no arithmetic changes; past a thread's last tile they fetch what the next thread reads, and an
// address past the matrix is harmless). Without them the CPU's own prefetchers left these kernels waiting on memory at
// every row count, one row included (results/tile_prefetch.json).
static int tile_ahead = 8;        // 0: no hints; set_tile_ahead
static inline void fetch_ahead(const std::uint8_t* p, i64 bytes) {   // a tile's block of `bytes` at p: ask for the one tile_ahead blocks on
    if (tile_ahead) for (i64 o = 0; o < bytes; o += 64) _mm_prefetch(reinterpret_cast<const char*>(p + tile_ahead * bytes + o), _MM_HINT_T0);
}

struct Q8Natural {                        // x quantised per block of 32, in x's own order
    std::vector<std::int8_t> q;           // [n, K]
    std::vector<float> dx, sx;            // [n, B]: each block's dx, and dx * sum(q)
    std::vector<float> sl, sh;            // [n, B]: dx * the sum of q over the block's first 16, and over its last 16 (the code tiles' minimums)
};

static void quantize_natural(const float* x, i64 n, i64 K, Q8Natural& r, bool vec) {
    const i64 B = K / QK;
    r.q.resize(std::size_t(n * K)); r.dx.resize(std::size_t(n * B)); r.sx.resize(std::size_t(n * B)); r.sl.resize(std::size_t(n * B)); r.sh.resize(std::size_t(n * B));
    for (i64 i = 0; i < n; ++i) for (i64 b = 0; b < B; ++b) {
        const std::size_t at = std::size_t(i * B + b);
        if (vec) quantize_block16(x + i * K + b * QK, r.q.data() + i * K + b * QK, &r.dx[at], &r.sx[at], &r.sl[at], &r.sh[at]);
        else quantize_block(x + i * K + b * QK, r.q.data() + i * K + b * QK, &r.dx[at], &r.sx[at], &r.sl[at], &r.sh[at]);
    }
}

template <int RB>
__attribute__((target("avx512f,avx512vl,avx512bw,avx512vnni,fma,f16c"))) static inline void tile16(const std::uint8_t* wt, i64 B, const Q8Natural& x, i64 K, i64 r0, float* y, i64 ldy, i64 valid) {
    __m512 acc[RB];
    for (int r = 0; r < RB; ++r) acc[r] = _mm512_setzero_ps();
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    for (i64 b = 0; b < B; ++b) {
        const std::uint8_t* p = wt + b * TILE_BLOCK;
        fetch_ahead(p, TILE_BLOCK);
        __m512i lo[4], hi[4];
        for (int j = 0; j < 4; ++j) {
            const __m512i v = _mm512_loadu_si512(p + 64 * j);
            lo[j] = _mm512_and_si512(v, low4); hi[j] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
        }
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 256)));
        const __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 288)));
        for (int r = 0; r < RB; ++r) {
            const std::int8_t* xr = x.q.data() + (r0 + r) * K + b * QK;
            std::int32_t a[8]; std::memcpy(a, xr, 32);
            __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
            for (int j = 0; j < 4; ++j) {
                s0 = _mm512_dpbusd_epi32(s0, lo[j], _mm512_set1_epi32(a[j]));
                s1 = _mm512_dpbusd_epi32(s1, hi[j], _mm512_set1_epi32(a[4 + j]));
            }
            const i64 at = (r0 + r) * B + b;
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1)), _mm512_mul_ps(d, _mm512_set1_ps(x.dx[std::size_t(at)])), acc[r]);
            acc[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(x.sx[std::size_t(at)]), acc[r]);
        }
    }
    const __mmask16 k = valid >= TILE ? __mmask16(0xFFFF) : __mmask16((1u << valid) - 1);
    for (int r = 0; r < RB; ++r) _mm512_mask_storeu_ps(y + (r0 + r) * ldy, k, acc[r]);
}

static void tile16_scalar(const std::uint8_t* wt, i64 B, const Q8Natural& x, i64 K, i64 r, float* y, i64 valid) {
    for (i64 o = 0; o < valid; ++o) {
        float acc = 0;
        for (i64 b = 0; b < B; ++b) {
            const std::uint8_t* p = wt + b * TILE_BLOCK;
            const std::int8_t* xr = x.q.data() + r * K + b * QK;
            std::int32_t s = 0;
            for (int j = 0; j < 4; ++j) for (int t = 0; t < 4; ++t) {
                const std::uint8_t v = p[64 * j + 4 * o + t];
                s += std::int32_t(v & 0x0F) * xr[4 * j + t] + std::int32_t(v >> 4) * xr[16 + 4 * j + t];
            }
            std::uint16_t h; std::memcpy(&h, p + 256 + 2 * o, 2); const float d = half_to_float(h);
            std::memcpy(&h, p + 288 + 2 * o, 2); const float m = half_to_float(h);
            const i64 at = r * B + b;
            acc = std::fma(float(s), d * x.dx[std::size_t(at)], acc);
            acc = std::fma(m, x.sx[std::size_t(at)], acc);
        }
        y[o] = acc;
    }
}

// f(RB, r0) over n rows in blocks of RB = 8, then the rest in one block of its own size (RB a std::integral_constant, for
// the kernels' templates): each block unpacks a tile's weights once, so 3 rows unpack them once, not twice (2 + 1)
template <class F> static inline void by_rows(i64 n, F f) {
    i64 r = 0;
    for (; r + 8 <= n; r += 8) f(std::integral_constant<int, 8>{}, r);
    switch (n - r) {
        case 7: f(std::integral_constant<int, 7>{}, r); break;
        case 6: f(std::integral_constant<int, 6>{}, r); break;
        case 5: f(std::integral_constant<int, 5>{}, r); break;
        case 4: f(std::integral_constant<int, 4>{}, r); break;
        case 3: f(std::integral_constant<int, 3>{}, r); break;
        case 2: f(std::integral_constant<int, 2>{}, r); break;
        case 1: f(std::integral_constant<int, 1>{}, r); break;
        default: break;
    }
}

// y[n, N] = q8(x)[n, K] @ W^T, W tiled by `repack_q4_1` (wt), x already quantised
static void tiled_q8_impl(const Q8Natural& x, i64 n, i64 K, const std::uint8_t* wt, i64 N, float* y, bool vec) {
    const i64 B = K / QK, T = (N + TILE - 1) / TILE;
    #pragma omp parallel for schedule(static)
    for (i64 t = 0; t < T; ++t) {
        const std::uint8_t* w = wt + t * B * TILE_BLOCK;
        const i64 valid = std::min(TILE, N - t * TILE);
        float* yt = y + t * TILE;
        if (!vec) { for (i64 r = 0; r < n; ++r) tile16_scalar(w, B, x, K, r, yt + r * N, valid); continue; }
        by_rows(n, [&](auto rb, i64 r) { tile16<decltype(rb)::value>(w, B, x, K, r, yt, N, valid); });
    }
}

static void linear_tiled_q8_at(std::uintptr_t x_, i64 n, i64 K, std::uintptr_t wt, i64 N, std::uintptr_t y_, bool vectorise) {
    if (n < 0 || N <= 0 || K <= 0 || K % QK) throw std::invalid_argument("linear_tiled_q8_at: bad shape");
    const bool vec = vectorise && has_vnni();
    py::gil_scoped_release nogil;
    Q8Natural x; quantize_natural(reinterpret_cast<const float*>(x_), n, K, x, vec);
    tiled_q8_impl(x, n, K, reinterpret_cast<const std::uint8_t*>(wt), N, reinterpret_cast<float*>(y_), vec);
}

// ---- int8 activations on any GGUF format's codes, tiled by 16 output rows ----
// `tile_codes` (06f, PyTorch) writes a matrix whose weights are w = s q + m, q an unsigned code (the file's integers: Q4_0,
// Q5_0, Q8_0 (q + 128), Q4_K, Q5_K, Q6_K, ...) and s, m float32 per block of 32 weights, or per half block of 16 (Q6_K),
// the file's scales and minimums multiplied out as gguf does, by tiles of 16 output rows, block by block, in one of four
// layouts (`Layout`), the narrowest that holds the format:
//   C4:  256 bytes of nibbles (for each k-quad j = 0..3, the 16 rows' bytes 4j..4j+3: codes 4j..4j+3 in the low nibbles,
//        16+4j..16+4j+3 in the high ones, as repack_q4_1's), then the 16 rows' s and m: 384 bytes;
//   C5:  C4's nibbles, then each row's 32 fifth bits (a uint32, bit i for code i), then s and m: 448 bytes;
//   C8:  512 bytes of codes (for each k-quad j = 0..7, the 16 rows' codes 4j..4j+3), then s and m: 640 bytes;
//   C8H: C8's codes, then s of each half and m of each half: 768 bytes.
// Eight vpdpbusd a block give each half's integer sums for 16 outputs; per block, each output adds float(sum) (s dx) and
// m sx (two FMAs; per half, four: s0, s1 with the halves' sums and m0 sl, m1 sh); the scalar path does the same, so both
// give the same bits, whatever the rows.
enum Layout { C4 = 0, C5 = 1, C8 = 2, C8H = 3 };
static constexpr i64 layout_bytes(int L) { return L == C4 ? 384 : L == C5 ? 448 : L == C8 ? 640 : 768; }
static constexpr i64 layout_scales(int L) { return L == C4 || L == C5 ? (L == C4 ? 256 : 320) : 512; }   // where s begins

template <int RB, int L>
__attribute__((target("avx512f,avx512vl,avx512bw,avx512vnni,fma"))) static inline void code_tile16(const std::uint8_t* wt, i64 B, const Q8Natural& x, i64 K, i64 r0, float* y, i64 ldy, i64 valid) {
    constexpr i64 BYTES = layout_bytes(L), S = layout_scales(L);
    __m512 acc[RB];
    for (int r = 0; r < RB; ++r) acc[r] = _mm512_setzero_ps();
    const __m512i low4 = _mm512_set1_epi8(0x0F), sixteen = _mm512_set1_epi8(16), bit = _mm512_set1_epi32(0x08040201);
    const __m512i byte0 = _mm512_set_epi8(12, 12, 12, 12, 8, 8, 8, 8, 4, 4, 4, 4, 0, 0, 0, 0, 12, 12, 12, 12, 8, 8, 8, 8, 4, 4, 4, 4, 0, 0, 0, 0,
                                          12, 12, 12, 12, 8, 8, 8, 8, 4, 4, 4, 4, 0, 0, 0, 0, 12, 12, 12, 12, 8, 8, 8, 8, 4, 4, 4, 4, 0, 0, 0, 0);
    for (i64 b = 0; b < B; ++b) {
        const std::uint8_t* p = wt + b * BYTES;
        fetch_ahead(p, BYTES);
        __m512i c[8];
        if constexpr (L == C8 || L == C8H) { for (int j = 0; j < 8; ++j) c[j] = _mm512_loadu_si512(p + 64 * j); }
        else {
            for (int j = 0; j < 4; ++j) {
                const __m512i v = _mm512_loadu_si512(p + 64 * j);
                c[j] = _mm512_and_si512(v, low4); c[4 + j] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
            }
            if constexpr (L == C5) {                                   // code i's fifth bit: bit i of its row's uint32
                const __m512i qh = _mm512_loadu_si512(p + 256);
                for (int j = 0; j < 8; ++j) {                          // k-quad j holds codes 4j..4j+3 (j < 4) or 16+4(j-4).. (j >= 4)
                    const int first = j < 4 ? 4 * j : 16 + 4 * (j - 4);
                    const __m512i bits = _mm512_shuffle_epi8(_mm512_srli_epi32(qh, first), byte0);   // each byte: its row's bits first..first+7
                    c[j] = _mm512_or_si512(c[j], _mm512_maskz_mov_epi8(_mm512_test_epi8_mask(bits, bit), sixteen));
                }
            }
        }
        const float* f = reinterpret_cast<const float*>(p + S);
        for (int r = 0; r < RB; ++r) {
            const std::int8_t* xr = x.q.data() + (r0 + r) * K + b * QK;
            std::int32_t a[8]; std::memcpy(a, xr, 32);
            __m512i lo = _mm512_setzero_si512(), hi = _mm512_setzero_si512();
            for (int j = 0; j < 4; ++j) {
                lo = _mm512_dpbusd_epi32(lo, c[j], _mm512_set1_epi32(a[j]));
                hi = _mm512_dpbusd_epi32(hi, c[4 + j], _mm512_set1_epi32(a[4 + j]));
            }
            const std::size_t at = std::size_t((r0 + r) * B + b);
            const __m512 dx = _mm512_set1_ps(x.dx[at]);
            if constexpr (L == C8H) {
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(lo), _mm512_mul_ps(_mm512_loadu_ps(f), dx), acc[r]);
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(hi), _mm512_mul_ps(_mm512_loadu_ps(f + 16), dx), acc[r]);
                acc[r] = _mm512_fmadd_ps(_mm512_loadu_ps(f + 32), _mm512_set1_ps(x.sl[at]), acc[r]);
                acc[r] = _mm512_fmadd_ps(_mm512_loadu_ps(f + 48), _mm512_set1_ps(x.sh[at]), acc[r]);
            } else {
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(lo, hi)), _mm512_mul_ps(_mm512_loadu_ps(f), dx), acc[r]);
                acc[r] = _mm512_fmadd_ps(_mm512_loadu_ps(f + 16), _mm512_set1_ps(x.sx[at]), acc[r]);
            }
        }
    }
    const __mmask16 k = valid >= TILE ? __mmask16(0xFFFF) : __mmask16((1u << valid) - 1);
    for (int r = 0; r < RB; ++r) _mm512_mask_storeu_ps(y + (r0 + r) * ldy, k, acc[r]);
}

static inline int code_at(const std::uint8_t* p, int L, i64 o, int e) {   // row o's code e (0..31) in one block of a tile
    if (L == C8 || L == C8H) return p[64 * (e / 4) + 4 * o + e % 4];
    const std::uint8_t v = p[64 * ((e % 16) / 4) + 4 * o + e % 4];
    int c = e < 16 ? (v & 0x0F) : (v >> 4);
    if (L == C5) { std::uint32_t h; std::memcpy(&h, p + 256 + 4 * o, 4); c |= int((h >> e) & 1u) << 4; }
    return c;
}

static void code_tile16_scalar(int L, const std::uint8_t* wt, i64 B, const Q8Natural& x, i64 K, i64 r, float* y, i64 valid) {
    const i64 BYTES = layout_bytes(L), S = layout_scales(L);
    for (i64 o = 0; o < valid; ++o) {
        float acc = 0;
        for (i64 b = 0; b < B; ++b) {
            const std::uint8_t* p = wt + b * BYTES;
            const std::int8_t* xr = x.q.data() + r * K + b * QK;
            std::int32_t lo = 0, hi = 0;
            for (int e = 0; e < 32; ++e) (e < 16 ? lo : hi) += std::int32_t(code_at(p, L, o, e)) * xr[e];
            float f[4]; for (int i = 0; i < 4; ++i) if (L == C8H || i < 2) std::memcpy(&f[i], p + S + 64 * i + 4 * o, 4);
            const std::size_t at = std::size_t(r * B + b);
            if (L == C8H) {
                acc = std::fma(float(lo), f[0] * x.dx[at], acc);
                acc = std::fma(float(hi), f[1] * x.dx[at], acc);
                acc = std::fma(f[2], x.sl[at], acc);
                acc = std::fma(f[3], x.sh[at], acc);
            } else {
                acc = std::fma(float(lo + hi), f[0] * x.dx[at], acc);
                acc = std::fma(f[1], x.sx[at], acc);
            }
        }
        y[o] = acc;
    }
}

// y[n, N] = q8(x)[n, K] @ W^T, W's codes tiled by `tile_codes` in `layout` (wt), x already quantised
static void codes_q8_impl(int layout, const Q8Natural& x, i64 n, i64 K, const std::uint8_t* wt, i64 N, float* y, bool vec) {
    const i64 B = K / QK, T = (N + TILE - 1) / TILE, BYTES = layout_bytes(layout);
    #pragma omp parallel for schedule(static)
    for (i64 t = 0; t < T; ++t) {
        const std::uint8_t* w = wt + t * B * BYTES;
        const i64 valid = std::min(TILE, N - t * TILE);
        float* yt = y + t * TILE;
        if (!vec) { for (i64 r = 0; r < n; ++r) code_tile16_scalar(layout, w, B, x, K, r, yt + r * N, valid); continue; }
        auto rows = [&](auto L) { by_rows(n, [&](auto rb, i64 r) { code_tile16<decltype(rb)::value, decltype(L)::value>(w, B, x, K, r, yt, N, valid); }); };
        switch (layout) {
            case C4: rows(std::integral_constant<int, C4>{}); break;
            case C5: rows(std::integral_constant<int, C5>{}); break;
            case C8: rows(std::integral_constant<int, C8>{}); break;
            default: rows(std::integral_constant<int, C8H>{});
        }
    }
}

static void linear_codes_q8_at(std::uintptr_t x_, i64 n, i64 K, std::uintptr_t wt, i64 N, std::uintptr_t y_, int layout, bool vectorise) {
    if (n < 0 || N <= 0 || K <= 0 || K % QK) throw std::invalid_argument("linear_codes_q8_at: bad shape");
    if (layout < C4 || layout > C8H) throw std::invalid_argument("linear_codes_q8_at: layout is 0 (C4), 1 (C5), 2 (C8) or 3 (C8H), not " + std::to_string(layout));
    const bool vec = vectorise && has_vnni();
    py::gil_scoped_release nogil;
    Q8Natural x; quantize_natural(reinterpret_cast<const float*>(x_), n, K, x, vec);
    codes_q8_impl(layout, x, n, K, reinterpret_cast<const std::uint8_t*>(wt), N, reinterpret_cast<float*>(y_), vec);
}

// ---- one decoder layer on packed weights: the engine's forward of a packed Llama, Qwen2 or Mistral target ----
// nbs/api/3-forward/06f_packed.ipynb is the specification and `lean_layers` (06b) on the same packed weights the
// reference. Per layer, in place on the residual stream x[q, H]:
//   h = rmsnorm(x) * ln1; qkv = h @ Wqkv^T (+ b); q, k turned (rotate_half, the model's cos and sin per row); k, v into the
//   cache at the rows' slots; a = attention of each query head over the slots its row may see; x += a @ Wo^T;
//   h = rmsnorm(x) * ln2; [g, u] = h @ Wgu^T; x += (silu(g) u) @ Wdown^T.
// What a step costs outside the products (PyTorch's per-op dispatch, about 15 ops a layer, and SDPA's setup) becomes one
// call a layer. Exactness: every row is computed from its own inputs and from the keys it may see, in the same order
// whatever else is in the call. The norms sum each row in 16 lanes added in a fixed tree; attention first lists the
// slots a row sees (mask > -1e30 among the first S, or without a mask those up to its own), in slot order, and then scores, exponentiates, sums
// and averages over that list: a tree node's ancestors are in topological order, so a row sees the same keys in the same
// order as the same token decoded as a chain, and gets the same bits. The products are `linear_packed_at`'s on float32
// activations and `linear_tiled_q8_at`'s on int8 ones, whose outputs do not depend on the number of rows either. exp is a Cephes polynomial (relative error about 1e-7), computed
// in 16-lane registers on every element (a masked tail, no scalar remainder) on the AVX-512 path; the scalar path
// (no AVX-512, or vectorise false) uses std::exp: each path agrees with itself, not bit for bit with the other.
__attribute__((target("avx512f,avx512vl,fma"))) static inline __m512 exp16(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.33654f)), _mm512_set1_ps(88.72283f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);                                              // p * 2^n
}

__attribute__((target("avx512f,avx512vl,fma"))) static inline float sum_squares16(const float* x, i64 H) {   // H % 16 == 0
    __m512 acc = _mm512_setzero_ps();
    for (i64 k = 0; k < H; k += 16) { const __m512 v = _mm512_loadu_ps(x + k); acc = _mm512_fmadd_ps(v, v, acc); }
    alignas(64) float l[16]; _mm512_store_ps(l, acc); return lanes16(l);
}

static inline float sum_squares(const float* x, i64 H) {
    float l[16] = {};
    for (i64 k = 0; k < H; k += 16) for (int j = 0; j < 16; ++j) l[j] = std::fma(x[k + j], x[k + j], l[j]);
    return lanes16(l);
}

// h[i] = w * (x[i] / sqrt(mean(x[i]^2) + eps)) for q rows of H
static void rmsnorm(const float* x, const float* w, float eps, i64 q, i64 H, float* h, bool vec) {
    for (i64 i = 0; i < q; ++i) {
        const float* xi = x + i * H;
        const float r = 1.0f / std::sqrt((vec ? sum_squares16(xi, H) : sum_squares(xi, H)) / float(H) + eps);
        for (i64 k = 0; k < H; ++k) h[i * H + k] = w[k] * (xi[k] * r);
    }
}

// x[j] (cos[j]) + rotate_half(x)[j] (sin[j]) over one head of d, rotate_half(x) = [-x[d/2:], x[:d/2]]
static inline void rope_head(float* x, const float* cos, const float* sin, i64 d) {
    const i64 h = d / 2;
    for (i64 j = 0; j < h; ++j) {
        const float a = x[j], b = x[j + h];
        x[j] = a * cos[j] + (-b) * sin[j];
        x[j + h] = b * cos[j + h] + a * sin[j + h];
    }
}

static inline float dot_scalar(const float* a, const float* b, i64 d) {
    float l[16] = {};
    for (i64 k = 0; k < d; k += 16) for (int j = 0; j < 16; ++j) l[j] = std::fma(a[k + j], b[k + j], l[j]);
    return lanes16(l);
}

// s[c] = dot(q, keys[slot[c]]) over d (d % 16 == 0) for c < n, sixteen slots at a time: each slot's products are
// added into 16 lanes (lane j the products j, j + 16, ..., in order, one FMA each, as `dot_scalar`'s lanes), and the
// sixteen slots' lanes are then summed together by shuffles in the tree of `lanes16` (halves, then quarters, eighths and
// pairs), so that every score is the same bits whatever its place in a block, and dot_scalar's. The reduction's output
// lane k holds accumulator AT[k]: slot k goes there. (Scored one slot at a time, each with its own horizontal sum, a
// one-row forward of the embedded target took 3% longer on this project's Xeon.)
__attribute__((target("avx512f,avx512vl,fma"))) static void dots16(const float* q, const float* keys, const std::int32_t* slot, i64 n, i64 d, float* s) {
    static constexpr int AT[16] = {0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15};
    constexpr int LO = 0 | (1 << 2) | (0 << 4) | (1 << 6), HI = 2 | (3 << 2) | (2 << 4) | (3 << 6);   // chunks 0, 1 (2, 3) of each
    constexpr int EVEN = 0 | (2 << 2) | (0 << 4) | (2 << 6), ODD = 1 | (3 << 2) | (1 << 4) | (3 << 6);   // elements (chunks) 0, 2 (1, 3) of each
    for (i64 c0 = 0; c0 < n; c0 += 16) {
        const i64 m = std::min<i64>(16, n - c0);
        __m512 A[16];
        #pragma GCC unroll 16
        for (int k = 0; k < 16; ++k) {
            __m512 acc = _mm512_setzero_ps();
            if (k < m) { const float* kv = keys + i64(slot[c0 + k]) * d; for (i64 j = 0; j < d; j += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + j), _mm512_loadu_ps(kv + j), acc); }
            A[AT[k]] = acc;
        }
        __m512 X[8], Z[4], P[2];
        for (int i = 0; i < 8; ++i) X[i] = _mm512_add_ps(_mm512_shuffle_f32x4(A[2 * i], A[2 * i + 1], LO), _mm512_shuffle_f32x4(A[2 * i], A[2 * i + 1], HI));   // lanes j + j+8
        for (int i = 0; i < 4; ++i) Z[i] = _mm512_add_ps(_mm512_shuffle_f32x4(X[2 * i], X[2 * i + 1], EVEN), _mm512_shuffle_f32x4(X[2 * i], X[2 * i + 1], ODD));   // then j + j+4
        for (int i = 0; i < 2; ++i) P[i] = _mm512_add_ps(_mm512_shuffle_ps(Z[2 * i], Z[2 * i + 1], LO), _mm512_shuffle_ps(Z[2 * i], Z[2 * i + 1], HI));   // then j + j+2
        const __m512 R = _mm512_add_ps(_mm512_shuffle_ps(P[0], P[1], EVEN), _mm512_shuffle_ps(P[0], P[1], ODD));   // then the pair
        _mm512_mask_storeu_ps(s + c0, m >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << m) - 1), R);
    }
}

// e[c] = exp(s[c] - m) for c < n, and their sum (16 lanes over c, added in a fixed tree)
__attribute__((target("avx512f,avx512vl,fma"))) static float exp_sum16(float* s, i64 n, float m) {
    __m512 acc = _mm512_setzero_ps();
    const __m512 mv = _mm512_set1_ps(m);
    for (i64 c = 0; c < n; c += 16) {
        const __mmask16 k = n - c >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - c)) - 1);
        const __m512 e = _mm512_maskz_mov_ps(k, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + c), mv)));
        _mm512_mask_storeu_ps(s + c, k, e);
        acc = _mm512_add_ps(acc, e);
    }
    alignas(64) float l[16]; _mm512_store_ps(l, acc); return lanes16(l);
}

static float exp_sum(float* s, i64 n, float m) {
    float l[16] = {};
    for (i64 c = 0; c < n; ++c) { s[c] = std::exp(s[c] - m); l[c % 16] += s[c]; }
    return lanes16(l);
}

// out[:d] = sum_c p[c] v[slot[c]] / total, over the listed slots in order
__attribute__((target("avx512f,avx512vl,fma"))) static void average16(const float* p, const std::int32_t* slot, i64 n, const float* v, i64 d, float total, float* out) {
    for (i64 k = 0; k < d; k += 16) {
        __m512 acc = _mm512_setzero_ps();
        for (i64 c = 0; c < n; ++c) acc = _mm512_fmadd_ps(_mm512_set1_ps(p[c]), _mm512_loadu_ps(v + slot[c] * d + k), acc);
        _mm512_storeu_ps(out + k, _mm512_div_ps(acc, _mm512_set1_ps(total)));
    }
}

static void average_scalar(const float* p, const std::int32_t* slot, i64 n, const float* v, i64 d, float total, float* out) {
    for (i64 k = 0; k < d; ++k) {
        float acc = 0;
        for (i64 c = 0; c < n; ++c) acc = std::fma(p[c], v[slot[c] * d + k], acc);
        out[k] = acc / total;
    }
}

// silu(g) u = g u / (1 + exp(-g)) for the I columns of each row of gu[q, 2I] (g then u), into a[q, I]
__attribute__((target("avx512f,avx512vl,fma"))) static void silu_mul16(const float* gu, i64 q, i64 I, float* a) {   // I % 16 == 0
    const __m512 one = _mm512_set1_ps(1.0f);
    for (i64 i = 0; i < q; ++i) for (i64 k = 0; k < I; k += 16) {
        const __m512 g = _mm512_loadu_ps(gu + i * 2 * I + k), u = _mm512_loadu_ps(gu + i * 2 * I + I + k);
        const __m512 s = _mm512_div_ps(g, _mm512_add_ps(one, exp16(_mm512_sub_ps(_mm512_setzero_ps(), g))));
        _mm512_storeu_ps(a + i * I + k, _mm512_mul_ps(s, u));
    }
}

static void packed_layer_at(std::uintptr_t x_, i64 q, i64 H, std::uintptr_t ln1_, std::uintptr_t ln2_, double eps,
                            std::uintptr_t wqkv, std::uintptr_t bqkv_, std::uintptr_t wo, std::uintptr_t wgu, std::uintptr_t wdown, i64 I,
                            i64 nh, i64 nkv, i64 d, std::uintptr_t cos_, std::uintptr_t sin_,
                            std::uintptr_t kc_, std::uintptr_t vc_, i64 cap, std::uintptr_t slots_, i64 S, std::uintptr_t mask_, double scale, std::vector<int> kinds, bool vectorise) {
    if (kinds.size() != 4) throw std::invalid_argument("packed_layer_at: kinds are the four products' (qkv, o, gate-up, down)");
    for (int k : kinds) if (k < 0 || k > 5) throw std::invalid_argument("packed_layer_at: a product's kind is 0 (Q4_1 blocks, float32 activations), 1 (Q4_1 tiles, int8) or 2 + a code layout (int8), not " + std::to_string(k));
    if (q <= 0 || H % QK || I % QK || d % 16 || d <= 0 || nh <= 0 || nkv <= 0 || nh % nkv || (nh * d) % QK || S < 1 || S > cap)
        throw std::invalid_argument("packed_layer_at: bad shape q=" + std::to_string(q) + ", H=" + std::to_string(H) + ", I=" + std::to_string(I) + ", heads "
                                    + std::to_string(nh) + "/" + std::to_string(nkv) + " of " + std::to_string(d) + ", S=" + std::to_string(S) + ", capacity " + std::to_string(cap));
    const i64* slots = reinterpret_cast<const i64*>(slots_);
    for (i64 i = 0; i < q; ++i) if (slots[i] < 0 || slots[i] >= cap || (!mask_ && slots[i] >= S))
        throw std::invalid_argument("packed_layer_at: slot " + std::to_string(slots[i]) + " of row " + std::to_string(i) + " lies outside the cache's " + std::to_string(mask_ ? cap : S) + " slots");
    float* x = reinterpret_cast<float*>(x_);
    const float *ln1 = reinterpret_cast<const float*>(ln1_), *ln2 = reinterpret_cast<const float*>(ln2_), *bqkv = reinterpret_cast<const float*>(bqkv_);
    const float *cos = reinterpret_cast<const float*>(cos_), *sin = reinterpret_cast<const float*>(sin_), *mask = reinterpret_cast<const float*>(mask_);
    float *kc = reinterpret_cast<float*>(kc_), *vc = reinterpret_cast<float*>(vc_);
    auto W = [](std::uintptr_t p) { return reinterpret_cast<const std::uint8_t*>(p); };
    const bool vec = vectorise && has_avx512(), vnni = vectorise && has_vnni();
    const i64 Nqkv = (nh + 2 * nkv) * d, groups = nh / nkv;
    py::gil_scoped_release nogil;
    Q8Natural xr;
    auto product = [&](int kind, const float* in, i64 K, std::uintptr_t w, i64 N, float* out) {   // in[q, K] @ W^T: float32 activations, or int8 on tiles
        if (kind == 0) { packed_impl<Q4_1>(in, q, K, W(w), N, out, vec); return; }
        quantize_natural(in, q, K, xr, vnni);
        if (kind == 1) tiled_q8_impl(xr, q, K, W(w), N, out, vnni); else codes_q8_impl(kind - 2, xr, q, K, W(w), N, out, vnni);
    };
    std::vector<float> h(std::size_t(q * H)), qkv(std::size_t(q * Nqkv)), a(std::size_t(q * nh * d)), gu(std::size_t(q * 2 * I)), y(std::size_t(q * H));
    rmsnorm(x, ln1, float(eps), q, H, h.data(), vec);
    product(kinds[0], h.data(), H, wqkv, Nqkv, qkv.data());
    for (i64 i = 0; i < q; ++i) {
        float* r = qkv.data() + i * Nqkv;
        if (bqkv) for (i64 j = 0; j < Nqkv; ++j) r[j] += bqkv[j];
        for (i64 j = 0; j < nh + nkv; ++j) rope_head(r + j * d, cos + i * d, sin + i * d, d);     // query heads, then key heads
        for (i64 j = 0; j < nkv; ++j) {
            std::memcpy(kc + (j * cap + slots[i]) * d, r + (nh + j) * d, sizeof(float) * d);
            std::memcpy(vc + (j * cap + slots[i]) * d, r + (nh + nkv + j) * d, sizeof(float) * d);
        }
    }
    std::vector<std::vector<std::int32_t>> seen(static_cast<std::size_t>(q));  // per row, the slots it sees, in order: once for all its heads
    for (i64 i = 0; i < q; ++i) {
        auto& l = seen[std::size_t(i)];
        if (mask) { for (i64 j = 0; j < S; ++j) if (mask[i * S + j] > -1e30f) l.push_back(std::int32_t(j)); }
        else for (i64 j = 0; j <= slots[i]; ++j) l.push_back(std::int32_t(j));
    }
    #pragma omp parallel
    {
        std::vector<float> s(static_cast<std::size_t>(S));
        #pragma omp for schedule(static)
        for (i64 t = 0; t < q * nh; ++t) {
            const i64 i = t / nh, hd = t % nh, g = hd / groups;
            const float* qv = qkv.data() + i * Nqkv + hd * d;
            const float *keys = kc + g * cap * d, *values = vc + g * cap * d;
            const std::int32_t* slot = seen[std::size_t(i)].data();
            const i64 n = i64(seen[std::size_t(i)].size());
            float m = -INFINITY;
            if (vec) dots16(qv, keys, slot, n, d, s.data());                      // sixteen slots at a time
            else for (i64 c = 0; c < n; ++c) s[c] = dot_scalar(qv, keys + i64(slot[c]) * d, d);
            for (i64 c = 0; c < n; ++c) {
                const i64 j = slot[c];
                s[c] = s[c] * float(scale) + (mask ? mask[i * S + j] : 0.0f);
                m = std::max(m, s[c]);
            }
            const float total = vec ? exp_sum16(s.data(), n, m) : exp_sum(s.data(), n, m);
            float* out = a.data() + i * nh * d + hd * d;
            if (vec) average16(s.data(), slot, n, values, d, total, out); else average_scalar(s.data(), slot, n, values, d, total, out);
        }
    }
    product(kinds[1], a.data(), nh * d, wo, H, y.data());
    for (i64 j = 0; j < q * H; ++j) x[j] += y[j];
    rmsnorm(x, ln2, float(eps), q, H, h.data(), vec);
    product(kinds[2], h.data(), H, wgu, 2 * I, gu.data());
    std::vector<float> act(std::size_t(q * I));
    if (vec) silu_mul16(gu.data(), q, I, act.data());
    else for (i64 i = 0; i < q; ++i) for (i64 k = 0; k < I; ++k) { const float g = gu[i * 2 * I + k]; act[i * I + k] = g / (1.0f + std::exp(-g)) * gu[i * 2 * I + I + k]; }
    product(kinds[3], act.data(), I, wdown, H, y.data());
    for (i64 j = 0; j < q * H; ++j) x[j] += y[j];
}

static const char* path_name(int limit) {
    switch (path_for(limit)) { case AVX512VL: return "avx512vl"; case AVX2: return "avx2"; default: return "scalar"; }
}

PYBIND11_MODULE(_linear, m) {
    m.doc() = "y = x @ W^T for a few rows of x (csrc/small_linear.cpp)";
    m.def("linear", &linear, "y[n, N] = x[n, K] @ w[N, K]^T into y (float32, C-contiguous); limit 2: widest path, 1: AVX2 at most, 0: scalar",
          py::arg("x"), py::arg("w"), py::arg("y"), py::arg("limit") = 2);
    m.def("linear_bf16", &linear_bf16, "y[n, N] = bf16(x[n, K]) @ w[N, K]^T into y: x float32 (rounded to nearest even), w bfloat16 bits (uint16), y float32; needs AVX-512 BF16",
          py::arg("x"), py::arg("w"), py::arg("y"));
    m.def("linear_packed_at", &linear_packed_at, "y[n, N] = x[n, K] @ W^T on raw addresses: x, y float32, W's rows in GGUF blocks of `format` (0: Q4_1, 1: Q8_0), w[N, K / 32 * bytes] uint8, all C-contiguous (the caller checks); vectorise false: the scalar path",
          py::arg("x"), py::arg("n"), py::arg("K"), py::arg("w"), py::arg("N"), py::arg("y"), py::arg("format"), py::arg("vectorise") = true);
    m.def("has_vnni", &has_vnni, "whether this CPU has AVX-512 VNNI");
    m.def("linear_tiled_q8_at", &linear_tiled_q8_at, "y[n, N] = q8(x[n, K]) @ W^T on raw addresses: x float32, quantised per block of 32 to int8 (as llama.cpp's Q8_1); W's Q4_1 rows tiled by repack_q4_1 (06f), wt[ceil(N / 16), K / 32, 320]; vectorise false (or no AVX-512 VNNI): the same sums in scalar code", py::arg("x"), py::arg("n"), py::arg("K"), py::arg("wt"), py::arg("N"), py::arg("y"), py::arg("vectorise") = true);
    m.def("packed_layer_at", &packed_layer_at, "one Llama/Qwen2/Mistral decoder layer on packed weights (kind 0: Q4_1 blocks), in place on x[q, H] (raw addresses, all float32 C-contiguous; the caller checks): ln1, ln2 [H]; wqkv [(nh + 2 nkv) d, H / 32 * 20], bqkv [(nh + 2 nkv) d] or 0, wo [H, nh d / 32 * 20], wgu [2 I, H / 32 * 20], wdown [H, I / 32 * 20]; cos, sin [q, d]; the layer's key and value cache [nkv, capacity, d], the rows' keys and values written at slots[q] (int64); attention over the first S slots under mask [q, S] (additive), or with mask 0 row i over slots 0..slots[i]; kinds: the four products' (qkv, o, gate-up, down), each 0 (Q4_1 blocks, float32 activations), 1 (Q4_1 tiled by repack_q4_1, int8 activations: linear_tiled_q8_at's) or 2 + a layout (codes tiled by tile_codes: linear_codes_q8_at's)",
          py::arg("x"), py::arg("q"), py::arg("H"), py::arg("ln1"), py::arg("ln2"), py::arg("eps"), py::arg("wqkv"), py::arg("bqkv"), py::arg("wo"), py::arg("wgu"), py::arg("wdown"), py::arg("I"),
          py::arg("nh"), py::arg("nkv"), py::arg("d"), py::arg("cos"), py::arg("sin"), py::arg("keys"), py::arg("values"), py::arg("capacity"), py::arg("slots"), py::arg("S"), py::arg("mask"), py::arg("scale"), py::arg("kinds") = std::vector<int>{0, 0, 0, 0}, py::arg("vectorise") = true);
    m.def("linear_codes_q8_at", &linear_codes_q8_at, "y[n, N] = q8(x[n, K]) @ W^T on raw addresses: x float32, quantised per block of 32 to int8; W's codes, scales and minimums tiled by tile_codes (06f) in `layout` (0: C4, 1: C5, 2: C8, 3: C8H), wt[ceil(N / 16), K / 32, 384, 448, 640 or 768]; vectorise false (or no AVX-512 VNNI): the same sums in scalar code", py::arg("x"), py::arg("n"), py::arg("K"), py::arg("wt"), py::arg("N"), py::arg("y"), py::arg("layout"), py::arg("vectorise") = true);
    m.def("has_avx512", &has_avx512, "whether linear_packed_at runs its AVX-512 path on this CPU");
    m.def("set_ahead", [](int blocks) {
        if (blocks < 0 || blocks > 64) throw std::invalid_argument("small_linear: ahead must be 0..64 blocks, got " + std::to_string(blocks));
        ahead = blocks; }, "fetch the weight rows this many blocks of output columns ahead (0: no prefetch hints)", py::arg("blocks"));
    m.def("get_ahead", [] { return ahead; }, "how many blocks ahead the kernel fetches weight rows");
    m.def("set_tile_ahead", [](int blocks) {
        if (blocks < 0 || blocks > 64) throw std::invalid_argument("small_linear: tile_ahead must be 0..64 blocks, got " + std::to_string(blocks));
        tile_ahead = blocks; }, "fetch a tile's weights this many blocks of 32 inputs ahead in the int8 kernels (0: no prefetch hints)", py::arg("blocks"));
    m.def("get_tile_ahead", [] { return tile_ahead; }, "how many blocks ahead the int8 kernels fetch a tile's weights");
    m.def("has_bf16", &has_bf16, "whether this CPU runs linear_bf16 (AVX-512 BF16)");
    m.def("path", &path_name, "the path `linear` runs at this `limit` on this CPU: 'avx512vl', 'avx2' or 'scalar'", py::arg("limit") = 2);
}
