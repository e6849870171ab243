// y = x @ W^T for a few rows of x: the products of a tree verification step (1-32 tokens) on a CPU.
//
// nbs/06a_small_linear.ipynb is the specification and F.linear the reference. Why a kernel of our own: for 2-16 rows MKL
// reads (and packs) each weight matrix as for a large product, so a step of 3 tokens costs about twice a step of 1. Here
// every weight row is read once from memory, in place (PyTorch's [out, in] layout, no copy), and multiplied with all n
// input rows while it sits in registers: the step stays bound by the weight bytes until n is large enough for the
// arithmetic to dominate.
//
// Tiling: OB = 2 weight rows x RB = 4 input rows per register tile, 8 float lanes (AVX2 + FMA); 8 accumulators, 2 weight
// and 1 input register. Each output y[r, j] is one dot product summed the same way whatever n is: 8 lanes over k in
// steps of 8, the lanes added in a fixed tree, then the k tail in order. So a row's result does not depend on how many
// rows are in the call, and the result is deterministic. Threads: OpenMP over blocks of 64 output columns (the same
// runtime as PyTorch's, libgomp). Without AVX2 + FMA at run time, a scalar loop with the same structure runs instead.
#include <pybind11/pybind11.h>
#include <pybind11/numpy.h>
#include <immintrin.h>
#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace py = pybind11;
using i64 = std::int64_t;
using farr = py::array_t<float, py::array::c_style>;

constexpr i64 CHUNK = 64;   // output columns per OpenMP task

// y[r * ldy + o] = dot(w[o * K: (o + 1) * K], x[r * K: (r + 1) * K]) for o < OB, r < RB
template <int OB, int RB>
__attribute__((target("avx2,fma"))) static inline void tile_avx2(const float* x, const float* w, i64 K, float* y, i64 ldy) {
    __m256 acc[OB][RB];
    for (int o = 0; o < OB; ++o) for (int r = 0; r < RB; ++r) acc[o][r] = _mm256_setzero_ps();
    i64 k = 0;
    for (; k + 8 <= K; k += 8) {
        __m256 wv[OB];
        for (int o = 0; o < OB; ++o) wv[o] = _mm256_loadu_ps(w + o * K + k);
        for (int r = 0; r < RB; ++r) {
            __m256 xv = _mm256_loadu_ps(x + r * K + k);
            for (int o = 0; o < OB; ++o) acc[o][r] = _mm256_fmadd_ps(wv[o], xv, acc[o][r]);
        }
    }
    for (int o = 0; o < OB; ++o) for (int r = 0; r < RB; ++r) {
        alignas(32) float l[8];
        _mm256_store_ps(l, acc[o][r]);
        float s = ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]));
        for (i64 kk = k; kk < K; ++kk) s += w[o * K + kk] * x[r * K + kk];
        y[r * ldy + o] = s;
    }
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

// OB output columns for all n rows: tiles of 4 rows, then the 1-3 left over
template <int OB, bool AVX>
static void columns(const float* x, i64 n, i64 K, const float* w, float* y, i64 N) {
    auto tile = [&](auto rb, i64 r) {
        constexpr int RB = decltype(rb)::value;
        if constexpr (AVX) tile_avx2<OB, RB>(x + r * K, w, K, y + r * N, N);
        else tile_scalar<OB, RB>(x + r * K, w, K, y + r * N, N);
    };
    i64 r = 0;
    for (; r + 4 <= n; r += 4) tile(std::integral_constant<int, 4>{}, r);
    switch (n - r) {
        case 3: tile(std::integral_constant<int, 3>{}, r); break;
        case 2: tile(std::integral_constant<int, 2>{}, r); break;
        case 1: tile(std::integral_constant<int, 1>{}, r); break;
    }
}

template <bool AVX>
static void linear_impl(const float* x, i64 n, i64 K, const float* w, i64 N, float* y) {
    i64 tasks = (N + CHUNK - 1) / CHUNK;
    #pragma omp parallel for schedule(static)
    for (i64 t = 0; t < tasks; ++t) {
        i64 j = t * CHUNK, end = std::min(N, j + CHUNK);
        for (; j + 2 <= end; j += 2) columns<2, AVX>(x, n, K, w + j * K, y + j, N);
        for (; j < end; ++j) columns<1, AVX>(x, n, K, w + j * K, y + j, N);
    }
}

static bool has_avx2() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }

// y[n, N] = x[n, K] @ w[N, K]^T, written into y (float32, C-contiguous, all three); vectorise=false forces the scalar path
static void linear(farr x, farr w, farr y, bool vectorise) {
    if (x.ndim() != 2 || w.ndim() != 2 || y.ndim() != 2) throw std::invalid_argument("small_linear: x, w and y must be 2-D");
    i64 n = x.shape(0), K = x.shape(1), N = w.shape(0);
    if (w.shape(1) != K) throw std::invalid_argument("small_linear: x has " + std::to_string(K) + " columns, w has " + std::to_string(w.shape(1)));
    if (y.shape(0) != n || y.shape(1) != N)
        throw std::invalid_argument("small_linear: y must have shape [" + std::to_string(n) + ", " + std::to_string(N) + "]");
    const float* xp = x.data(); const float* wp = w.data(); float* yp = y.mutable_data();
    py::gil_scoped_release nogil;
    if (vectorise && has_avx2()) linear_impl<true>(xp, n, K, wp, N, yp);
    else linear_impl<false>(xp, n, K, wp, N, yp);
}

PYBIND11_MODULE(_linear, m) {
    m.doc() = "y = x @ W^T for a few rows of x (csrc/small_linear.cpp)";
    m.def("linear", &linear, "y[n, N] = x[n, K] @ w[N, K]^T into y (float32, C-contiguous)", py::arg("x"), py::arg("w"), py::arg("y"),
          py::arg("vectorise") = true);
    m.def("vectorised", &has_avx2, "whether this CPU runs the AVX2 + FMA path (else the scalar one)");
}
