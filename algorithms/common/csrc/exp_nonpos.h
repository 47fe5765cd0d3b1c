/* Shared by the native kernels (algorithms/common/native.py hashes this header with each source). */
#ifndef PLCQL_EXP_NONPOS_H
#define PLCQL_EXP_NONPOS_H
#include <stdint.h>
#include <string.h>

/* exp(x) for x in [-87, 0] (callers clamp below: the ELU part of cf_negative, σ of −|x|), vectorisable: 2^t with
 * t = x·log2(e) = k + f (k = round(t), |f| <= 1/2), 2^f by a degree-6 polynomial (relative error
 * ~2e-7, the order of the rounding of x·log2 e in the torch form's exp2), 2^k from the exponent bits. */
static inline float exp_nonpos(float x) {
    const float t = x * 1.4426950408889634f;
    const float k = __builtin_rintf(t); /* to nearest: |f| <= 1/2 */
    const float f = t - k;
    float p = 1.5403530393381606e-4f;
    p = p * f + 1.3333558146428443e-3f;
    p = p * f + 9.6181291076284772e-3f;
    p = p * f + 5.5504108664821580e-2f;
    p = p * f + 2.4022650695910071e-1f;
    p = p * f + 6.9314718055994531e-1f;
    p = p * f + 1.0f;
    int32_t bits;
    memcpy(&bits, &p, 4);
    bits += ((int32_t)k) * (1 << 23);
    float out;
    memcpy(&out, &bits, 4);
    return out;
}

#endif
