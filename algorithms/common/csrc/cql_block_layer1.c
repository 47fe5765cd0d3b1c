/* The first layer of one block of the CF-CQL penalty's rows, the native form of the two torch ops that
 * start each block in kernels._BlockedLSE.forward (the first-layer GEMM with K = nA action columns, and the
 * add of the state part with its ReLU; that class states the math, algorithms/common/native.py builds this
 * file and calls it, tests/test_native.py and tests/test_speed_equivalence.py check it against the torch form).
 *
 * For member e, state b of the block and candidate r (row b·R + r):
 *   h1[e, row, j] = max(0, h_s[e, b, j] + Σ_k a[row, k]·w1a[e, k, j])   for j < H,   h1[e, row, H] = 1
 * (the constant-1 column carries the second layer's bias through its GEMM). One pass writes each h1 row
 * once, with a 16-column tile of w1a in registers; the torch form writes the block three times (GEMM, add,
 * ReLU) and reads it twice.
 *
 * Pointers are at the block's first state/row; s_hs is h_s's member stride (its rows of H are contiguous),
 * h1 is contiguous [E, nb·R, H + 1], a [nb·R, nA], w1a [E, nA, H]; H is a multiple of 16, nA <= 64.
 * (member, state) pairs are split over torch's OpenMP threads. */
#include <stdint.h>

#include "vec16.h"

/* one state's R rows; inlined with nA a constant for the common sizes (the k loops unroll) */
static inline __attribute__((always_inline)) void state_rows(const float *a0, const float *w, const float *hs,
                                                             float *out0, int64_t R, int64_t nA, int64_t H) {
    for (int64_t j0 = 0; j0 < H; j0 += V16) {
        v16 wk[64];
        for (int64_t k = 0; k < nA; k++) wk[k] = v16_load(w + k * H + j0);
        const v16 h = v16_load(hs + j0);
        for (int64_t r = 0; r < R; r++) {
            v16 acc = h;
            for (int64_t k = 0; k < nA; k++) acc += a0[r * nA + k] * wk[k];
            v16_store(out0 + r * (H + 1) + j0, v16_pos(acc, acc));
        }
    }
    for (int64_t r = 0; r < R; r++) out0[r * (H + 1) + H] = 1.0f;
}

int cql_block_layer1(const float *a, const float *w1a, const float *h_s, float *h1, int64_t E, int64_t nb,
                     int64_t R, int64_t nA, int64_t H, int64_t s_hs, int threads) {
    if (E <= 0 || nb <= 0 || R <= 0 || nA <= 0 || H <= 0 || nA > 64 || H % V16 != 0) return 1;
    const int64_t total = E * nb;
    if (threads < 1 || total < 2) threads = 1;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t q = 0; q < total; q++) {
        const int64_t e = q / nb, b = q % nb;
        const float *w = w1a + e * nA * H, *hs = h_s + e * s_hs + b * H, *a0 = a + b * R * nA;
        float *out0 = h1 + (e * nb * R + b * R) * (H + 1);
        switch (nA) {
        case 2: state_rows(a0, w, hs, out0, R, 2, H); break;
        case 4: state_rows(a0, w, hs, out0, R, 4, H); break;
        case 6: state_rows(a0, w, hs, out0, R, 6, H); break;
        case 8: state_rows(a0, w, hs, out0, R, 8, H); break;
        default: state_rows(a0, w, hs, out0, R, nA, H);
        }
    }
    return 0;
}
