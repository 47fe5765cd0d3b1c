/* The output layer and the logsumexp's gradient of one block of the CF-CQL penalty's rows: the native form of
 * the torch ops between the second-layer GEMM and the dW2 GEMM in kernels._BlockedLSE.forward (that class
 * states the math, algorithms/common/native.py builds this file and calls it, tests/test_native.py and
 * tests/test_speed_equivalence.py check it against the torch form).
 *
 * h2 holds the second layer before its ReLU, [E, nb·G·M, H] (row (b·G + g)·M + m: state b, group g,
 * candidate m). For each member e and each group of M rows:
 *   z[e, b, g, m] = b3[e] + Σ_j relu(h2[row, j])·w3[e, j] − off[b, g, m]            (written to z)
 * and with `grad` (the caller's backward will come), p = softmax_m(z / T), gq = wB[b, g]·p (d pol / d z):
 *   dw3[e, j] += Σ_rows gq·relu(h2[row, j])                 (accumulated over the caller's blocks)
 *   h2[row, j] := gq if h2[row, j] > 0 else 0               (in place: the ReLU's derivative times gq)
 * The group's M rows (M·H floats) stay in L1 between the two passes; the torch form makes ~10 passes over
 * the block (ReLU, GEMV, offset, max, exp, sum, divide, weight, dW3 GEMV, ReLU derivative).
 *
 * off may be NULL (no offset), per state (s_off_e = 0) or per member (s_off_e = its member stride); z's
 * member stride is s_z; pointers are at the block's first state. exp is exp_nonpos.h's (z − max <= 0).
 * H is a multiple of 16, M <= 4096. Members are split over torch's OpenMP threads (each thread
 * accumulates only its members' dw3). */
#include <stdint.h>

#include "exp_nonpos.h"
#include "vec16.h"

int cql_block_head(float *h2, const float *w3, const float *b3, const float *off, const float *wB, float *z,
                   float *dw3, float T, int64_t E, int64_t nb, int64_t G, int64_t M, int64_t H, int64_t s_off_e,
                   int64_t s_z, int grad, int threads) {
    if (E <= 0 || nb <= 0 || G <= 0 || M <= 0 || H <= 0 || M > 4096 || H % V16 != 0 || !(T > 0.0f)) return 1;
    if (threads < 1 || E < 2) threads = 1;
    const float invT = 1.0f / T;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t e = 0; e < E; e++) {
        const float *w = w3 + e * H;
        float *dw = grad ? dw3 + e * H : NULL; /* dw3 is NULL without grad */
        float zz[4096];
        for (int64_t bg = 0; bg < nb * G; bg++) {
            float *h = h2 + (e * nb * G + bg) * M * H;
            float *zo = z + e * s_z + bg * M;
            const float *of = off == NULL ? NULL : off + e * s_off_e + bg * M;
            float zmax = -3.402823466e38f;
            for (int64_t m = 0; m < M; m++) {
                v16 acc = v16_zero();
                for (int64_t j0 = 0; j0 < H; j0 += V16) {
                    const v16 x = v16_load(h + m * H + j0);
                    acc += v16_pos(x, x) * v16_load(w + j0);
                }
                float v = v16_sum(acc) + b3[e];
                if (of != NULL) v -= of[m];
                zo[m] = v;
                zz[m] = v * invT;
                zmax = zz[m] > zmax ? zz[m] : zmax;
            }
            if (!grad) continue;
            float se = 0.0f;
            for (int64_t m = 0; m < M; m++) {
                const float d = zz[m] - zmax;
                zz[m] = exp_nonpos(d < -87.0f ? -87.0f : d);
                se += zz[m];
            }
            const float scale = wB[bg] / se;
            for (int64_t j0 = 0; j0 < H; j0 += V16) { /* dW3's tile accumulates in a register over the group */
                v16 acc = v16_load(dw + j0);
                for (int64_t m = 0; m < M; m++) {
                    const v16 x = v16_load(h + m * H + j0), g = v16_set1(zz[m] * scale);
                    acc += v16_pos(x, x) * g;
                    v16_store(h + m * H + j0, v16_pos(x, g));
                }
                v16_store(dw + j0, acc);
            }
        }
    }
    return 0;
}
