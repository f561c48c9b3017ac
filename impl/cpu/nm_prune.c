/* N:M pruning along one dimension on the CPU, in one pass per group: SDGP's pruning of output
 * data gradients (McDanel, Dinh and Magallanes 2022, Sec. III-A Algorithm 1 and III-B).
 *
 * The op is defined by impl/ops/nm.py's nm_prune_ref; this computes it on a contiguous
 * (O, C, I) view (dims before the grouping dim, the grouping dim, dims after) where the torch
 * reference runs dozens of whole-tensor operations. Same groups (m consecutive elements of C,
 * a partial last group ranked among its own elements), same scores (|x|, or the caller's
 * float64 random keys), same ties (the lowest index wins), so the same kept positions and, for
 * "magnitude" and "random", the same values bit for bit. "rescaled" sums each plane (or
 * channel) in double and rounds the sums to the input's type, where the reference sums in the
 * input's type in torch's order: the rescaled values may differ in the last bits.
 *
 * Built by impl/ops/nm_cpu.py with the system C compiler (no fast-math: NaN, infinities and
 * signed zeros behave as in torch); no torch headers.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define PDT_OK 0
#define PDT_NAN 1    /* a NaN magnitude: the caller ranks with the reference (torch.sort order) */
#define PDT_NOMEM 2  /* scratch allocation failed */
#define PDT_ARGS 3   /* bad arguments */
#define PDT_RANGE 4  /* a rescale sum finite in double but not in the input's type: the caller
                      * runs the reference, whose sums saturate in that type's own order */

enum { RESCALE_NONE = 0, RESCALE_PLANE = 1, RESCALE_CHANNEL = 2 };

/* On x86-64 each entry point is built twice, for AVX2 and for the baseline, and the loader
 * picks the one the CPU runs (the helpers are inlined into both): the loops are twice as fast
 * on AVX2 (8 float lanes, not 4). The same operations in the same order either way. */
#if defined(__x86_64__) && defined(__GNUC__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define PDT_CLONES __attribute__((target_clones("avx2", "default")))
#endif
#endif
#ifndef PDT_CLONES
#define PDT_CLONES
#endif
#if defined(__GNUC__)
#define PDT_INLINE static inline __attribute__((always_inline))
#else
#define PDT_INLINE static inline
#endif

/* Sum of |v[0:len]| in double, in eight interleaved partial sums (a fixed order, which the
 * compiler may hold in vector registers: each lane is one partial sum). */
#define PDT_L1(T, ABS)                                                                  \
    PDT_INLINE double l1_##T(const T *restrict v, int64_t len) {                        \
        double a[8] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};                         \
        int64_t t = 0;                                                                  \
        for (; t + 8 <= len; t += 8)                                                    \
            for (int q = 0; q < 8; ++q) a[q] += ABS(v[t + q]);                          \
        for (; t < len; ++t) a[0] += ABS(v[t]);                                         \
        return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));       \
    }

/* rank[j * ni + t] ends as (position of element j in a stable descending sort of its group of
 * k) - n, for every t: it starts at j - n, and each pair j < l moves one rank from l to j when
 * l scores strictly higher (a tie keeps the lower index first). Kept: rank below zero. */
#define PDT_RANK(KEY_T)                                                                 \
    PDT_INLINE void rank_##KEY_T(const KEY_T *restrict key, int32_t *restrict rank, int k,  \
                             int n, int64_t ni) {                                       \
        for (int j = 0; j < k; ++j) {                                                   \
            int32_t *restrict r = rank + (int64_t)j * ni;                               \
            for (int64_t t = 0; t < ni; ++t) r[t] = j - n;                              \
        }                                                                               \
        for (int j = 0; j < k; ++j) {                                                   \
            for (int l = j + 1; l < k; ++l) {                                           \
                const KEY_T *restrict kj = key + (int64_t)j * ni;                       \
                const KEY_T *restrict kl = key + (int64_t)l * ni;                       \
                int32_t *restrict rj = rank + (int64_t)j * ni;                          \
                int32_t *restrict rl = rank + (int64_t)l * ni;                          \
                for (int64_t t = 0; t < ni; ++t) {                                      \
                    int32_t w = kj[t] < kl[t];                                          \
                    rj[t] += w;                                                         \
                    rl[t] -= w;                                                         \
                }                                                                       \
            }                                                                           \
        }                                                                               \
    }

/* y = x where kept (bits unchanged: -0.0, infinities), +0.0 elsewhere. */
#define PDT_SELECT(T, BITS)                                                             \
    PDT_INLINE void select_##T(const T *restrict x, const int32_t *restrict rank,          \
                           T *restrict y, int64_t len) {                                \
        const BITS *restrict xb = (const BITS *)x;                                      \
        BITS *restrict yb = (BITS *)y;                                                  \
        for (int64_t e = 0; e < len; ++e) yb[e] = xb[e] & (BITS)(-(BITS)(rank[e] < 0)); \
    }

/* |x| as its bits (sign cleared): for non-NaN floats the integers order as the magnitudes,
 * whatever the CPU's denormal mode (the reference's fast path ranks the same integers). */
#define PDT_ABS_BITS(T, BITS)                                                            \
    PDT_INLINE void abs_bits_##T(const T *restrict x, BITS *restrict a, int64_t len) {      \
        const BITS *restrict xb = (const BITS *)x;                                      \
        const BITS mag = (BITS)~((BITS)1 << (8 * sizeof(BITS) - 1));                      \
        for (int64_t e = 0; e < len; ++e) a[e] = xb[e] & mag;                           \
    }

#define PDT_SCALE(T)                                                                    \
    PDT_INLINE void scale_##T(T *restrict y, T s, int64_t len) {                            \
        for (int64_t t = 0; t < len; ++t) y[t] *= s;                                    \
    }

/* 0 where no element is NaN. */
#define PDT_HAS_NAN(T)                                                                  \
    PDT_INLINE int has_nan_##T(const T *restrict x, int64_t len) {                          \
        int bad = 0;                                                                    \
        for (int64_t e = 0; e < len; ++e) bad |= x[e] != x[e];                          \
        return bad;                                                                     \
    }

/* One entry point per value type T (BITS: the unsigned integer of its width). x, out:
 * contiguous (no, nc, ni) of T; rkeys: NULL, or the float64 random keys, contiguous
 * (no, ni, nc) (the order the reference draws them in); stats: NULL, or double[2] receiving
 * sum|x| and sum|out|. eps is the rescale constant, converted to T as torch converts a
 * Python scalar. Returns PDT_OK, or PDT_NAN / PDT_RANGE (out is not usable: the caller runs
 * the reference), PDT_NOMEM or PDT_ARGS. */
#define PDT_PRUNE(T, BITS)                                                                \
    PDT_CLONES int pdt_nm_prune_##T(const T *x, const double *rkeys, T *out, int64_t no, int64_t nc,   \
                         int64_t ni, int n, int m, int rescale, double eps, double *stats) { \
        if (no < 0 || nc < 0 || ni < 0 || n < 1 || m < n || m > 32) return PDT_ARGS;       \
        if (rescale < RESCALE_NONE || rescale > RESCALE_CHANNEL) return PDT_ARGS;          \
        const int64_t total = no * nc * ni;                                                 \
        if (total == 0) { /* nothing to prune (empty tensors may come with NULL pointers) */ \
            if (stats != NULL) stats[0] = stats[1] = 0.0;                                   \
            return PDT_OK;                                                                  \
        }                                                                                   \
        if ((rkeys == NULL || rescale != RESCALE_NONE) && has_nan_##T(x, total))            \
            return PDT_NAN;                                                                 \
        const T teps = (T)eps;                                                              \
        const size_t span = (size_t)m * (size_t)(ni > 0 ? ni : 1);                          \
        int32_t *rank = malloc(sizeof(int32_t) * span);                                     \
        BITS *key = rkeys == NULL ? malloc(sizeof(BITS) * span) : NULL;                     \
        double *rkey = rkeys != NULL ? malloc(sizeof(double) * span) : NULL;                \
        double *csum = rescale == RESCALE_CHANNEL                                           \
                           ? calloc(2 * (size_t)(nc > 0 ? nc : 1), sizeof(double))          \
                           : NULL;                                                          \
        if (rank == NULL || (rkeys == NULL ? key == NULL : rkey == NULL) ||                 \
            (rescale == RESCALE_CHANNEL && csum == NULL)) {                                 \
            free(rank);                                                                     \
            free(key);                                                                      \
            free(rkey);                                                                     \
            free(csum);                                                                     \
            return PDT_NOMEM;                                                               \
        }                                                                                   \
        int code = PDT_OK;                                                                  \
        for (int64_t o = 0; o < no; ++o) {                                                  \
            for (int64_t c0 = 0; c0 < nc; c0 += m) {                                        \
                const int k = (int)(nc - c0 < m ? nc - c0 : m);                             \
                const int64_t base = (o * nc + c0) * ni, len = (int64_t)k * ni;             \
                const T *xg = x + base;                                                     \
                T *yg = out + base;                                                         \
                if (k <= n) { /* a group of no more than n elements keeps all */           \
                    memcpy(yg, xg, sizeof(T) * (size_t)len);                                \
                } else {                                                                    \
                    if (rkeys != NULL) {                                                    \
                        const double *rg = rkeys + o * ni * nc + c0;                        \
                        for (int j = 0; j < k; ++j)                                         \
                            for (int64_t t = 0; t < ni; ++t)                                \
                                rkey[(int64_t)j * ni + t] = rg[t * nc + j];                 \
                        rank_double(rkey, rank, k, n, ni);                                  \
                    } else {                                                                \
                        abs_bits_##T(xg, key, len);                                         \
                        rank_##BITS(key, rank, k, n, ni);                                   \
                    }                                                                       \
                    select_##T(xg, rank, yg, len);                                          \
                }                                                                           \
                if (rescale == RESCALE_NONE) continue;                                      \
                for (int j = 0; j < k; ++j) {                                               \
                    const T *xp = xg + (int64_t)j * ni;                                     \
                    T *yp = yg + (int64_t)j * ni;                                           \
                    const double sx = l1_##T(xp, ni), sy = l1_##T(yp, ni);                  \
                    if (rescale == RESCALE_CHANNEL) {                                       \
                        csum[2 * (c0 + j)] += sx;                                           \
                        csum[2 * (c0 + j) + 1] += sy;                                       \
                        continue;                                                           \
                    }                                                                       \
                    const T fx = (T)sx, fy = (T)sy;                                         \
                    if ((isinf(fx) && !isinf(sx)) || (isinf(fy) && !isinf(sy))) {          \
                        code = PDT_RANGE;                                                   \
                        goto done;                                                          \
                    }                                                                       \
                    scale_##T(yp, fy > 0 ? fx / (fy + teps) : (T)0, ni);                    \
                }                                                                           \
            }                                                                               \
        }                                                                                   \
        if (rescale == RESCALE_CHANNEL) {                                                   \
            for (int64_t c = 0; c < nc; ++c) {                                              \
                const T fx = (T)csum[2 * c], fy = (T)csum[2 * c + 1];                       \
                if ((isinf(fx) && !isinf(csum[2 * c])) ||                                   \
                    (isinf(fy) && !isinf(csum[2 * c + 1]))) {                               \
                    code = PDT_RANGE;                                                       \
                    goto done;                                                              \
                }                                                                           \
                const T s = fy > 0 ? fx / (fy + teps) : (T)0;                               \
                for (int64_t o = 0; o < no; ++o) scale_##T(out + (o * nc + c) * ni, s, ni); \
            }                                                                               \
        }                                                                                   \
        if (stats != NULL) {                                                                \
            stats[0] = l1_##T(x, total);                                                    \
            stats[1] = l1_##T(out, total);                                                  \
        }                                                                                   \
    done:                                                                                   \
        free(rank);                                                                         \
        free(key);                                                                          \
        free(rkey);                                                                         \
        free(csum);                                                                         \
        return code;                                                                        \
    }

PDT_L1(float, fabsf)
PDT_L1(double, fabs)
PDT_RANK(uint32_t)
PDT_RANK(uint64_t)
PDT_RANK(double)
PDT_SELECT(float, uint32_t)
PDT_SELECT(double, uint64_t)
PDT_ABS_BITS(float, uint32_t)
PDT_ABS_BITS(double, uint64_t)
PDT_SCALE(float)
PDT_SCALE(double)
PDT_HAS_NAN(float)
PDT_HAS_NAN(double)
PDT_PRUNE(float, uint32_t)
PDT_PRUNE(double, uint64_t)
