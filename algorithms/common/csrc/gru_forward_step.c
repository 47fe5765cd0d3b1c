/* One step of the GRU's forward recurrence, its elementwise part: the native form of the torch ops per
 * step in kernels_discrete._gru_steps (same inputs, outputs and formulas; that function states the math,
 * algorithms/common/native.py builds this file and calls it, tests/test_native.py checks it against the
 * torch form). The step's two GEMMs (the input and hidden projections) stay in torch.
 *
 * Per element (member e, row i, unit j), with gi = W_ih·x + b_ih and the gate row g holding
 * gh = W_hh·h + b_hh in its first 3H entries (gate order r, z, n):
 *   r = σ(gi_r + gh_r),  z = σ(gi_z + gh_z),  n = tanh(gi_n + r·gh_n),  h' = n + z·(h − n)
 * written to g = [r, z, gh_n (kept), n] and to h'. tanh is 2σ(2x) − 1, as the torch form computes it.
 *
 * σ comes from one exp of a non-positive argument, e = exp(−|x|): σ(x) = 1/(1 + e) for x >= 0, e/(1 + e)
 * below; exp is the polynomial of exp_nonpos.h (relative error ~2e-7), so the gates equal torch's up to
 * float rounding. The rows are split over torch's OpenMP threads (see gru_backward_step.c). */
#include <stdint.h>

#include "exp_nonpos.h"

static inline float sigmoid(float x) {
    float a = x < 0.0f ? x : -x; /* −|x|, taken as −87 below that: exp = 1.6e-38, out of the slow subnormals */
    const float e = exp_nonpos(a < -87.0f ? -87.0f : a);
    return (x >= 0.0f ? 1.0f : e) / (1.0f + e);
}

/* Returns 0, or 1 on bad sizes. h may be the previous step's rows of the output (it is only read). */
int gru_forward_step(const float *gi, float *gates, const float *h, float *hout, int64_t E, int64_t k, int64_t H,
                     int64_t s_gi, int64_t s_gates, int64_t s_h, int64_t s_hout, int threads) {
    if (E < 0 || k < 0 || H <= 0) return 1;
    const int64_t total = E * k;
    if (threads < 1 || total < 256) threads = 1; /* small steps: not worth waking the threads */
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t q = 0; q < total; q++) {
        const int64_t e = q / k, i = q % k;
        const float *restrict a = gi + e * s_gi + i * 3 * H;
        float *restrict g = gates + e * s_gates + i * 4 * H;
        const float *restrict hp = h + e * s_h + i * H;
        float *restrict ho = hout + e * s_hout + i * H;
        const float *restrict a_r = a, *restrict a_z = a + H, *restrict a_n = a + 2 * H;
        float *restrict g_r = g, *restrict g_z = g + H, *restrict g_n = g + 3 * H;
        const float *restrict gh_n = g + 2 * H;
#pragma omp simd
        for (int64_t j = 0; j < H; j++) {
            const float r = sigmoid(a_r[j] + g_r[j]);
            const float z = sigmoid(a_z[j] + g_z[j]);
            const float n = 2.0f * sigmoid(2.0f * (a_n[j] + r * gh_n[j])) - 1.0f;
            g_r[j] = r;
            g_z[j] = z;
            g_n[j] = n;
            ho[j] = n + z * (hp[j] - n);
        }
    }
    return 0;
}
