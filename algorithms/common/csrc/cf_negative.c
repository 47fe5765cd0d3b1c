/* CF-CQL's negative term and its per-row gradient: the native form of kernels_discrete._CFNegative's
 * forward (same inputs, outputs and formulas; that class states the math, algorithms/common/native.py
 * builds this file and calls it, tests/test_native.py checks it against the torch form).
 *
 * Why native: the torch form makes ~12 passes (one per op) over each cache block of the
 * [rows, n, A, embed] intermediate; here each (row, agent, action) computes its embed-long vectors once,
 * and the gradient pass reads them back from a per-thread scratch of 2·n·A·embed floats (in L1/L2).
 *
 * Rows r = e·M + m (member e, state m; avail and β belong to the state) are independent: each thread
 * takes a contiguous range of rows. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "exp_nonpos.h"

typedef struct {
    const float *pre, *delta, *w1, *w2, *b2, *avail, *logbeta; /* logbeta NULL: uniform λ */
    float temp;
    int64_t rows, members, n, A, Em;
    float *neg, *lam, *dpre, *ddelta, *dw1, *dw2, *db2;
    int64_t r0, r1; /* this job's rows */
    int failed;
} Job;

typedef struct {
    float *m, *u;       /* [n, A, Em]: elu'(x) and elu(x) + 1 */
    float *cf, *p;      /* [n, A] */
    float *lse, *lamb;  /* [n] */
} Scratch;

/* λ over agents from the masked softmax p (CFCQL's cf_weights): softmax_i(temp · KL(μ_i || β_i)),
 * μ = p + 1e-5, KL summed over the available actions; temp >= 100: one-hot at the first maximum. */
static void lambda_row(const Job *J, const float *avail, const float *logbeta, const Scratch *S) {
    const int64_t n = J->n, A = J->A;
    if (logbeta == NULL || J->temp == 0.0f) {
        for (int64_t i = 0; i < n; i++) S->lamb[i] = 1.0f / (float)n;
        return;
    }
    float kmax = -INFINITY;
    int64_t arg = 0;
    for (int64_t i = 0; i < n; i++) {
        float kl = 0.0f;
        for (int64_t j = 0; j < A; j++) {
            const float mu = S->p[i * A + j] + 1e-5f;
            kl += mu * (logf(mu) - logbeta[i * A + j]) * avail[i * A + j];
        }
        S->lamb[i] = kl;
        if (kl > kmax) { /* the first maximum, as torch's argmax */
            kmax = kl;
            arg = i;
        }
    }
    if (J->temp >= 100.0f) {
        for (int64_t i = 0; i < n; i++) S->lamb[i] = i == arg ? 1.0f : 0.0f;
        return;
    }
    float zmax = -INFINITY, se = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        S->lamb[i] *= J->temp;
        zmax = S->lamb[i] > zmax ? S->lamb[i] : zmax;
    }
    for (int64_t i = 0; i < n; i++) {
        S->lamb[i] = expf(S->lamb[i] - zmax);
        se += S->lamb[i];
    }
    for (int64_t i = 0; i < n; i++) S->lamb[i] /= se;
}

static void one_row(const Job *J, int64_t r, const Scratch *S) {
    const int64_t n = J->n, A = J->A, Em = J->Em, M = J->rows / J->members, s = r % M;
    const float *pre = J->pre + r * Em, *w2 = J->w2 + r * Em, *w1 = J->w1 + r * n * Em;
    const float *delta = J->delta + r * n * A, *avail = J->avail + s * n * A;
    const float *logbeta = J->logbeta == NULL ? NULL : J->logbeta + s * n * A;
    float w2sum = 0.0f;
    for (int64_t e = 0; e < Em; e++) w2sum += w2[e];
    const float bias = J->b2[r] - w2sum; /* cf = Σ_e w2·(elu + 1) + b2 − Σ_e w2 */

    /* cf[i, j] = Σ_e w2_e·u_e + bias: x = pre + δ_ij·w1_i, m = exp(min(x, 0)) = elu'(x), u = max(x, 0) + m;
     * min(x, 0) is clamped at −87 (exp stays out of float32's subnormals, as the torch form) */
    for (int64_t ij = 0; ij < n * A; ij++) {
        const float d = delta[ij];
        const float *w1i = w1 + (ij / A) * Em;
        float *mb = S->m + ij * Em, *ub = S->u + ij * Em;
        float acc = 0.0f;
        for (int64_t e = 0; e < Em; e++) {
            const float x = pre[e] + d * w1i[e];
            float xm = x < 0.0f ? x : 0.0f;
            xm = xm < -87.0f ? -87.0f : xm;
            const float me = exp_nonpos(xm);
            const float ue = (x > 0.0f ? x : 0.0f) + me;
            mb[e] = me;
            ub[e] = ue;
            acc += ue * w2[e];
        }
        S->cf[ij] = acc + bias;
    }
    /* per agent: softmax and logsumexp over its available actions (over all of them when none is
     * available; such an agent has keep = 0 and drops out) */
    float keep[64];
    for (int64_t i = 0; i < n; i++) {
        const float *cf = S->cf + i * A, *av = avail + i * A;
        float *p = S->p + i * A;
        int any = 0;
        for (int64_t j = 0; j < A; j++) any |= av[j] > 0.0f;
        float mx = -INFINITY, se = 0.0f;
        for (int64_t j = 0; j < A; j++)
            if (!any || av[j] > 0.0f) mx = cf[j] > mx ? cf[j] : mx;
        for (int64_t j = 0; j < A; j++) {
            p[j] = (!any || av[j] > 0.0f) ? expf(cf[j] - mx) : 0.0f;
            se += p[j];
        }
        for (int64_t j = 0; j < A; j++) p[j] /= se;
        S->lse[i] = logf(se) + mx;
        keep[i] = any ? 1.0f : 0.0f;
    }
    lambda_row(J, avail, logbeta, S);
    float negv = 0.0f, gsum = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        J->lam[r * n + i] = S->lamb[i];
        const float lk = S->lamb[i] * keep[i];
        negv += lk * S->lse[i];
        for (int64_t j = 0; j < A; j++) {
            S->p[i * A + j] *= lk; /* now go = d neg / d cf */
            gsum += S->p[i * A + j];
        }
    }
    J->neg[r] = negv;
    J->db2[r] = gsum;
    /* gradients: dw2 = Σ go·u − Σ go, dpre = w2 ⊙ Σ go·m, dw1_i = w2 ⊙ Σ_j go·δ·m, dδ = go·Σ_e m·w1_i·w2 */
    float *dw2 = J->dw2 + r * Em, *dpre = J->dpre + r * Em, *dw1 = J->dw1 + r * n * Em;
    float *ddelta = J->ddelta + r * n * A;
    for (int64_t e = 0; e < Em; e++) dw2[e] = dpre[e] = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        float *dw1i = dw1 + i * Em;
        const float *w1i = w1 + i * Em;
        for (int64_t e = 0; e < Em; e++) dw1i[e] = 0.0f;
        for (int64_t j = 0; j < A; j++) {
            const int64_t ij = i * A + j;
            const float go = S->p[ij], gd = go * delta[ij];
            const float *mb = S->m + ij * Em, *ub = S->u + ij * Em;
            float acc = 0.0f;
            for (int64_t e = 0; e < Em; e++) {
                dw2[e] += go * ub[e];
                dpre[e] += go * mb[e];
                dw1i[e] += gd * mb[e];
                acc += mb[e] * (w1i[e] * w2[e]);
            }
            ddelta[ij] = go * acc;
        }
        for (int64_t e = 0; e < Em; e++) dw1i[e] *= w2[e];
    }
    for (int64_t e = 0; e < Em; e++) {
        dw2[e] -= gsum;
        dpre[e] *= w2[e];
    }
}

static void run_job(Job *J) {
    const int64_t nA = J->n * J->A;
    float *mem = (float *)malloc(sizeof(float) * (size_t)(2 * nA * J->Em + 2 * nA + 2 * J->n));
    if (mem == NULL) {
        J->failed = 1;
        return;
    }
    Scratch S = {mem, mem + nA * J->Em, mem + 2 * nA * J->Em, mem + 2 * nA * J->Em + nA,
                 mem + 2 * nA * J->Em + 2 * nA, mem + 2 * nA * J->Em + 2 * nA + J->n};
    for (int64_t r = J->r0; r < J->r1; r++) one_row(J, r, &S);
    free(mem);
}

/* Returns 0 on success; 1: bad sizes (n > 64, rows not a multiple of members); 2: out of memory. */
int cf_negative(const float *pre, const float *delta, const float *w1, const float *w2, const float *b2,
                const float *avail, const float *logbeta, float temp, int64_t rows, int64_t members, int64_t n,
                int64_t A, int64_t Em, float *neg, float *lam, float *dpre, float *ddelta, float *dw1, float *dw2,
                float *db2, int threads) {
    if (n > 64 || n < 1 || members < 1 || rows % members != 0) return 1;
    if (threads < 1) threads = 1;
    if (threads > 256) threads = 256;
    if (threads > rows) threads = rows > 0 ? (int)rows : 1;
    Job jobs[256];
    for (int t = 0; t < threads; t++) {
        Job J = {pre, delta, w1, w2, b2, avail, logbeta, temp, rows, members, n, A, Em,
                 neg, lam, dpre, ddelta, dw1, dw2, db2, rows * t / threads, rows * (t + 1) / threads, 0};
        jobs[t] = J;
    }
    /* One job per thread of torch's OpenMP pool (gru_backward_step.c says why not pthreads of our own). */
#pragma omp parallel for schedule(static, 1) num_threads(threads)
    for (int t = 0; t < threads; t++) run_job(&jobs[t]);
    int status = 0;
    for (int t = 0; t < threads; t++)
        if (jobs[t].failed) status = 2;
    return status;
}
