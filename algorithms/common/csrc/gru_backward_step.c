/* One step of the GRU's backward pass, its elementwise part: the native form of the ~10 torch ops per
 * step in kernels_discrete._GRU.backward (same inputs, outputs and formulas; that method states the
 * math, algorithms/common/native.py builds this file and calls it, tests/test_native.py checks it
 * against the torch form). The step's two GEMMs (the gradient reaching h_{t-1} through W_hh) stay in
 * torch.
 *
 * Why native: the torch ops each read and write whole [E, k, H] operands (~1.6 MB each on smax-2s3z),
 * ~30 passes a step; here each element is read once and its five results written once.
 *
 * Per element (member e, row i, unit j), with the gates saved by the forward pass (r, z, the hidden
 * projection's n part ghn = W_hn·h + b_hn, and n):
 *   dh = dhs + rec                      the output's gradient plus what reached h_t from step t+1
 *   dz = (h_prev − n)·dh,  rec' = dh·z,  dn = dh − rec'
 *   dn_pre = dn·(1 − n²)                tanh's backward
 *   dr_pre = (dn_pre·ghn)·(1 − r)·r,  dz_pre = dz·(1 − z)·z      sigmoid's backward
 *   dghn = dn_pre·r
 * written to dgi = [dr_pre, dz_pre, dn_pre] (3H), dghn (H) and rec ← rec' (H). */
#include <stdint.h>

/* Returns 0, or 1 on bad sizes. rec must not alias any input (it is read and written per element). The
 * rows are split over `threads` OpenMP threads: built with -fopenmp against the libgomp torch has loaded,
 * they are torch's own intra-op threads (a pthread of our own would compete with them while they spin
 * after torch's last parallel region: no faster than the torch ops at 2 threads, measured). */
int gru_backward_step(const float *dhs, const float *hprev, const float *gates, float *rec, float *dgi, float *dghn,
                      int64_t E, int64_t k, int64_t H, int64_t s_dhs, int64_t s_hprev, int64_t s_gates,
                      int64_t s_rec, int64_t s_dgi, int64_t s_dghn, int threads) {
    if (E < 0 || k < 0 || H <= 0) return 1;
    const int64_t total = E * k;
    if (threads < 1 || total < 256) threads = 1; /* small steps: not worth waking the threads */
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t q = 0; q < total; q++) {
        const int64_t e = q / k, i = q % k;
        const float *restrict dh_out = dhs + e * s_dhs + i * H;
        const float *restrict hp = hprev + e * s_hprev + i * H;
        const float *g = gates + e * s_gates + i * 4 * H;
        const float *restrict r = g, *restrict z = g + H, *restrict ghn = g + 2 * H, *restrict n = g + 3 * H;
        float *restrict rc = rec + e * s_rec + i * H;
        float *restrict di = dgi + e * s_dgi + i * 3 * H;
        float *restrict dg = dghn + e * s_dghn + i * H;
        float *restrict di_r = di, *restrict di_z = di + H, *restrict di_n = di + 2 * H;
#pragma omp simd
        for (int64_t j = 0; j < H; j++) {
            const float dh = dh_out[j] + rc[j];
            const float dz = (hp[j] - n[j]) * dh;
            const float rr = dh * z[j];
            const float dn_pre = (dh - rr) * (1.0f - n[j] * n[j]);
            di_r[j] = (dn_pre * ghn[j]) * (1.0f - r[j]) * r[j];
            di_z[j] = dz * (1.0f - z[j]) * z[j];
            di_n[j] = dn_pre;
            dg[j] = dn_pre * r[j];
            rc[j] = rr;
        }
    }
    return 0;
}
