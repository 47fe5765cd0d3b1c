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

static inline float v16_sum(v16 v) {
    float s = 0.0f;
    for (int i = 0; i < V16; i++) s += v[i];
    return s;
}

#endif
