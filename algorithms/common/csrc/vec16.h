/* Shared by the native kernels (algorithms/common/native.py hashes this header with each source). */
#ifndef PLCQL_VEC16_H
#define PLCQL_VEC16_H
#include <stdint.h>
#include <string.h>

/* 16 floats as one GCC/Clang vector (one AVX-512 register, two AVX2 registers, four NEON registers): the
 * cql_block_* kernels' column tiles, written explicitly so that their accumulators stay in registers. */
typedef float v16 __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));
#define V16 16

static inline v16 v16_load(const float *p) {
    v16 v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void v16_store(float *p, v16 v) { memcpy(p, &v, sizeof v); }

static inline v16 v16_zero(void) { return (v16){0.0f}; }

static inline v16 v16_set1(float x) { return v16_zero() + x; }

/* y where x > 0, else 0 (a ReLU's derivative applied to y; v16_pos(x, x) is the ReLU) */
static inline v16 v16_pos(v16 x, v16 y) { return (v16)((v16i)y & (x > v16_zero())); }

typedef float v8 __attribute__((vector_size(32)));
typedef float v4 __attribute__((vector_size(16)));

/* the sum of the 16 lanes by halving: two vector adds, then three scalar ones (the halves are taken by memcpy,
 * which compilers turn into register extracts: portable C, unlike __builtin_shufflevector before GCC 12) */
static inline float v16_sum(v16 v) {
    v8 lo, hi;
    memcpy(&lo, &v, sizeof lo);
    memcpy(&hi, (const char *)&v + sizeof lo, sizeof hi);
    const v8 a = lo + hi;
    v4 c, d;
    memcpy(&c, &a, sizeof c);
    memcpy(&d, (const char *)&a + sizeof c, sizeof d);
    const v4 b = c + d;
    return (b[0] + b[2]) + (b[1] + b[3]);
}

#endif
