/* The first layer's backward for one block of the CF-CQL penalty's rows: the native form of the torch ops
 * after the dh1 GEMM in kernels._BlockedLSE.forward (ReLU derivative, the dW1a GEMM with K = the block's rows
 * and nA outputs, the sum over each state's rows; that class states the math, algorithms/common/native.py
 * builds this file and calls it, tests/test_native.py and tests/test_speed_equivalence.py check it against
 * the torch form).
 *
 * dh1 [E, nb·R, H] (contiguous) is the gradient at the first layer's output before its ReLU's derivative,
 * h1 [E, nb·R, H + 1] the first layer's output (after its ReLU). With d = dh1 · (h1 > 0):
 *   dw1a[e, k, j] += Σ_rows a[row, k]·d[row, j]            (accumulated over the caller's blocks)
 *   dh_s[e, b, j]  = Σ_r d[b·R + r, j]                      (written; s_dhs is its member stride)
 * in one pass over dh1 (read only), a 16-column tile at a time with dW1a's tile in registers. H is a
 * multiple of 16, nA <= 64. Members are split over torch's OpenMP threads. */
#include <stdint.h>

#include "vec16.h"

/* one member's rows, T tiles (T·16 columns) at a time: dW1a's nA·T tiles stay in registers over the rows;
 * inlined with nA and T constants for the common sizes (the k and t loops unroll) */
static inline __attribute__((always_inline)) void member_rows(const float *g0, const float *h0, const float *a,
                                                              float *dw, float *ds0, int64_t nb, int64_t R,
                                                              int64_t nA, int64_t H, int64_t T) {
    for (int64_t j0 = 0; j0 < H; j0 += T * V16) {
        v16 acc[64][4];
        for (int64_t k = 0; k < nA; k++)
            for (int64_t t = 0; t < T; t++) acc[k][t] = v16_zero();
        for (int64_t b = 0; b < nb; b++) {
            v16 ds[4];
            for (int64_t t = 0; t < T; t++) ds[t] = v16_zero();
            for (int64_t r = 0; r < R; r++) {
                const int64_t row = b * R + r;
                v16 d[4];
                for (int64_t t = 0; t < T; t++) {
                    const int64_t j = j0 + t * V16;
                    d[t] = v16_pos(v16_load(h0 + row * (H + 1) + j), v16_load(g0 + row * H + j));
                    ds[t] += d[t];
                }
                for (int64_t k = 0; k < nA; k++) {
                    const float ak = a[row * nA + k];
                    for (int64_t t = 0; t < T; t++) acc[k][t] += ak * d[t];
                }
            }
            for (int64_t t = 0; t < T; t++) v16_store(ds0 + b * H + j0 + t * V16, ds[t]);
        }
        for (int64_t k = 0; k < nA; k++)
            for (int64_t t = 0; t < T; t++) {
                float *p = dw + k * H + j0 + t * V16;
                v16_store(p, v16_load(p) + acc[k][t]);
            }
    }
}

int cql_block_tail(const float *dh1, const float *h1, const float *a, float *dw1a, float *dh_s, int64_t E,
                   int64_t nb, int64_t R, int64_t nA, int64_t H, int64_t s_dhs, int threads) {
    if (E <= 0 || nb <= 0 || R <= 0 || nA <= 0 || H <= 0 || nA > 64 || H % V16 != 0) return 1;
    if (threads < 1 || E < 2) threads = 1;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t e = 0; e < E; e++) {
        const float *g0 = dh1 + e * nb * R * H, *h0 = h1 + e * nb * R * (H + 1);
        float *dw = dw1a + e * nA * H, *ds0 = dh_s + e * s_dhs;
        const int full = H % (4 * V16) == 0, half = H % (2 * V16) == 0;
#define ROWS(NA, T) member_rows(g0, h0, a, dw, ds0, nb, R, NA, H, T)
        switch (nA) { /* nA·T <= 24 accumulator registers */
        case 2: full ? ROWS(2, 4) : ROWS(2, 1); break;
        case 4: full ? ROWS(4, 4) : ROWS(4, 1); break;
        case 6: full ? ROWS(6, 4) : ROWS(6, 1); break;
        case 8: half ? ROWS(8, 2) : ROWS(8, 1); break;
        default: ROWS(nA, 1);
        }
#undef ROWS
    }
    return 0;
}
