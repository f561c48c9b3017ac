/* Direct pattern-sparse convolution on the CPU (ClickTrain Sec. 5.2, stage 5): forward,
 * input gradient and weight gradient at the kept positions only, with the batch innermost.
 *
 * The im2col formulation of the paper (impl/ops/pattern.py) writes a C*R*S x B*P*Q matrix,
 * nine times the input for 3x3 kernels, and reads it back for every product; on a CPU those
 * copies cost more than the sparse products themselves. Here the input is transposed once
 * into a zero-padded [C, Hp, Wp, B] array (pdt_pconv_layout_*), so that for a fixed kept
 * weight (c, r, s) and output pixel (p, q) the B samples it touches are contiguous, and at
 * stride 1 so are the B samples of a whole run of output columns. Every output vector is a
 * sum, over the kept weights of its filter, of one scalar times one contiguous vector,
 * accumulated in registers, then stored into the NCHW output. Each output element is summed
 * in the order of its CSR row whatever the thread split, so results do not depend on the
 * thread count.
 *
 * Layouts (element offsets; "padded" arrays carry zero borders):
 *   x     [B, C, H, W]              the input, NCHW contiguous
 *   xt    [C, Hp, Wp, B]            pdt_pconv_layout of x, ph/pw rows/columns of zeros
 *   out   [B, F, P, Q]              the output, NCHW contiguous
 *   gp    [F, Pp, Qp, B]            the output gradient with `top` rows above and `left`
 *                                   columns before it ((R-1)*dh and (S-1)*dw), and zeros
 *                                   below and to the right as far as the gather reads
 *   gx    [B, C, H, W]              the input gradient
 * The weight is the dense [F, C, R, S] array; the kept positions are its filter matrix's CSR
 * structure over F rows of K = C*R*S columns (row_ptr, col_ind: column c*R*S + r*S + s)
 * and that of its transpose (t_row_ptr over K rows, t_col_ind the filter of each entry).
 *
 * Every function returns 0, 2 when a table cannot be allocated, or 3 when the CSR structure
 * is out of range (row pointers decreasing or beyond nnz, a column or filter out of range):
 * nothing is read outside the arrays whatever the index holds. Compiled with the vector
 * extensions of GCC and Clang; no intrinsics, no fast-math. The body below is compiled once
 * for float and once for double (this file includes itself).
 */
#ifndef PDT_PCONV_BODY
#define PDT_PCONV_BODY

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX__)
#define VBYTES 32
#else
#define VBYTES 16
#endif
/* Vectors of one register block, and elements staged before a transposed store into NCHW. */
#define NVEC 4
#define TILE 512

#define CAT2(a, b) a##_##b
#define CAT(a, b) CAT2(a, b)
#define NAME(x) CAT(x, SUF)
#define MIN(a, b) ((a) < (b) ? (a) : (b))

/* Whether row pointers [r0, r1] are non-decreasing within [0, nnz]. */
static int rows_ok(const int64_t *ptr, int64_t r0, int64_t r1, int64_t nnz)
{
    if (ptr[r0] < 0 || ptr[r1] > nnz) return 0;
    for (int64_t i = r0; i < r1; i++)
        if (ptr[i] > ptr[i + 1]) return 0;
    return 1;
}

#define T float
#define SUF float
#include "pattern_conv.c"
#undef T
#undef SUF
#define T double
#define SUF double
#include "pattern_conv.c"
#undef T
#undef SUF

#else /* the body, for one element type T */

typedef T NAME(vec) __attribute__((vector_size(VBYTES)));
#define VEC NAME(vec)
#define LANES ((int64_t)(VBYTES / sizeof(T)))
#define BLOCK (NVEC * LANES)

static inline VEC NAME(load)(const T *p)
{
    VEC v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void NAME(store)(T *p, VEC v) { memcpy(p, &v, sizeof v); }

/* tile[0..n) = sum over k in [k0, k1) of val[k] * src[off[k] + (0..n)]: one contiguous run
 * of n elements per kept weight, in blocks of NVEC vectors held in registers. */
static void NAME(gather_run)(const T *src, const T *val, const int64_t *off, int64_t k0,
                             int64_t k1, int64_t n, T *tile)
{
    int64_t i = 0;
    for (; i + BLOCK <= n; i += BLOCK) {
        VEC a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
        for (int64_t k = k0; k < k1; k++) {
            const T *s = src + off[k] + i;
            const T w = val[k];
            a0 += w * NAME(load)(s);
            a1 += w * NAME(load)(s + LANES);
            a2 += w * NAME(load)(s + 2 * LANES);
            a3 += w * NAME(load)(s + 3 * LANES);
        }
        NAME(store)(tile + i, a0);
        NAME(store)(tile + i + LANES, a1);
        NAME(store)(tile + i + 2 * LANES, a2);
        NAME(store)(tile + i + 3 * LANES, a3);
    }
    for (; i + LANES <= n; i += LANES) {
        VEC a = {0};
        for (int64_t k = k0; k < k1; k++) a += val[k] * NAME(load)(src + off[k] + i);
        NAME(store)(tile + i, a);
    }
    for (; i < n; i++) {
        T a = 0;
        for (int64_t k = k0; k < k1; k++) a += val[k] * src[off[k] + i];
        tile[i] = a;
    }
}

/* One output row segment: tile[j * ts + b] for columns j < nq (input column stride
 * `step`) and samples b < nb from `base`. At unit step the nq * nb elements are one
 * contiguous run (ts = nb = B); otherwise one run of nb samples per column (ts = BLOCK). */
static void NAME(gather_segment)(const T *src, const T *val, const int64_t *off, int64_t k0,
                                 int64_t k1, int64_t base, int64_t step, int64_t nq,
                                 int64_t nb, int64_t ts, T *tile)
{
    if (step == nb && ts == nb) {
        NAME(gather_run)(src + base, val, off, k0, k1, nq * nb, tile);
        return;
    }
    for (int64_t j = 0; j < nq; j++)
        NAME(gather_run)(src + base + j * step, val, off, k0, k1, nb, tile + j * ts);
}

/* dst[b * bstride + j] = tile[j * ts + b] for j < nq, b < nb: the staged segment into NCHW. */
static void NAME(store_tile)(const T *tile, T *dst, int64_t bstride, int64_t nq, int64_t nb,
                             int64_t ts)
{
    for (int64_t b = 0; b < nb; b++)
        for (int64_t j = 0; j < nq; j++) dst[b * bstride + j] = tile[j * ts + b];
}

/* Output rows of width Q from `src` for one output plane: for each row i < ni (input base
 * row_base(i)), columns in segments that fit the tile, samples in blocks where a column's
 * samples alone fill it. `unit`: consecutive output columns read consecutive input columns. */
static void NAME(gather_plane)(const T *src, const T *val, const int64_t *off, int64_t k0,
                               int64_t k1, int64_t ni, int64_t Q, int64_t B,
                               int64_t row_stride, int64_t row0, int64_t col0, int64_t cstep,
                               T *dst, int64_t dst_row, int64_t bstride)
{
    T tile[TILE];
    const int unit = cstep == 1 && B <= TILE;
    const int64_t qseg = unit ? TILE / B : TILE / BLOCK;
    for (int64_t i = 0; i < ni; i++)
        for (int64_t q0 = 0; q0 < Q; q0 += qseg) {
            const int64_t nq = MIN(Q - q0, qseg);
            const int64_t base = (i * row_stride + row0) + (q0 * cstep + col0) * B;
            if (unit) {
                NAME(gather_segment)(src, val, off, k0, k1, base, B, nq, B, B, tile);
                NAME(store_tile)(tile, dst + i * dst_row + q0, bstride, nq, B, B);
                continue;
            }
            for (int64_t b0 = 0; b0 < B; b0 += BLOCK) {
                const int64_t nb = MIN(B - b0, BLOCK);
                NAME(gather_segment)(src, val, off, k0, k1, base + b0, cstep * B, nq, nb, BLOCK,
                                     tile);
                NAME(store_tile)(tile, dst + b0 * bstride + i * dst_row + q0, bstride, nq, nb,
                                 BLOCK);
            }
        }
}

/* xt[c, pt + h, pl + w, b] = x[b, c, h, w] for c in [c0, c1), zeros elsewhere; xt is
 * [C, pt + H + pb, pl + W + pr, B]. */
int NAME(pdt_pconv_layout)(const T *x, T *xt, int64_t B, int64_t C, int64_t H, int64_t W,
                           int64_t pt, int64_t pb, int64_t pl, int64_t pr, int64_t c0,
                           int64_t c1)
{
    const int64_t hp = pt + H + pb, wp = pl + W + pr;
    for (int64_t c = c0; c < c1; c++) {
        T *plane = xt + c * hp * wp * B;
        memset(plane, 0, (size_t)(pt * wp * B) * sizeof(T));
        memset(plane + (pt + H) * wp * B, 0, (size_t)(pb * wp * B) * sizeof(T));
        for (int64_t h = 0; h < H; h++) {
            T *row = plane + (pt + h) * wp * B;
            memset(row, 0, (size_t)(pl * B) * sizeof(T));
            memset(row + (pl + W) * B, 0, (size_t)(pr * B) * sizeof(T));
            for (int64_t b = 0; b < B; b++) {
                const T *src = x + ((b * C + c) * H + h) * W;
                T *dst = row + pl * B + b;
                for (int64_t w = 0; w < W; w++) dst[w * B] = src[w];
            }
        }
    }
    return 0;
}

/* Forward: out[b, f, p, q] = sum over the kept (c, r, s) of row f of
 * weight[f, c, r, s] * xt[c, p*sh + r*dh, q*sw + s*dw, b], for filters f in [f0, f1). */
int NAME(pdt_pconv_forward)(const T *xt, const T *weight, const int64_t *row_ptr,
                            const int64_t *col_ind, T *out, int64_t nnz, int64_t B, int64_t C,
                            int64_t F, int64_t R, int64_t S, int64_t hp, int64_t wp, int64_t P,
                            int64_t Q, int64_t sh, int64_t sw, int64_t dh, int64_t dw,
                            int64_t f0, int64_t f1)
{
    const int64_t K = C * R * S;
    if (!rows_ok(row_ptr, f0, f1, nnz)) return 3;
    const int64_t k0 = row_ptr[f0], nk = row_ptr[f1] - k0;
    int64_t *off = malloc((size_t)(nk > 0 ? nk : 1) * sizeof *off);
    T *val = malloc((size_t)(nk > 0 ? nk : 1) * sizeof *val);
    int code = off && val ? 0 : 2;
    for (int64_t f = f0; f < f1 && !code; f++)
        for (int64_t k = row_ptr[f]; k < row_ptr[f + 1]; k++) {
            const int64_t col = col_ind[k], c = col / (R * S), r = col / S % R, s = col % S;
            if (col < 0 || col >= K) {
                code = 3;
                break;
            }
            off[k - k0] = ((c * hp + r * dh) * wp + s * dw) * B;
            val[k - k0] = weight[f * K + col];
        }
    /* output rows outermost: the filters of the slice reuse one row's input rows from cache */
    for (int64_t p = 0; p < P && !code; p++)
        for (int64_t f = f0; f < f1; f++)
            NAME(gather_plane)(xt, val, off, row_ptr[f] - k0, row_ptr[f + 1] - k0, 1, Q, B, 0,
                               p * sh * wp * B, 0, sw, out + (f * P + p) * Q, Q, F * P * Q);
    free(off);
    free(val);
    return code;
}

/* The entries of the transposed matrix for channels [c0, c1): their weights and, per entry,
 * pos = f * R*S + (r*S + s). 3: the row pointers or an entry's filter out of range. */
static int NAME(transposed_entries)(const T *weight, const int64_t *t_row_ptr,
                                    const int64_t *t_col_ind, int64_t nnz, int64_t F, int64_t C,
                                    int64_t RS, int64_t c0, int64_t c1, T **tval, int64_t **tpos)
{
    *tval = NULL;
    *tpos = NULL;
    if (!rows_ok(t_row_ptr, c0 * RS, c1 * RS, nnz)) return 3;
    const int64_t e0 = t_row_ptr[c0 * RS], ne = t_row_ptr[c1 * RS] - e0;
    *tval = malloc((size_t)(ne > 0 ? ne : 1) * sizeof **tval);
    *tpos = malloc((size_t)(ne > 0 ? ne : 1) * sizeof **tpos);
    if (!*tval || !*tpos) return 2;
    for (int64_t row = c0 * RS; row < c1 * RS; row++)
        for (int64_t e = t_row_ptr[row]; e < t_row_ptr[row + 1]; e++) {
            const int64_t f = t_col_ind[e];
            if (f < 0 || f >= F) return 3;
            (*tval)[e - e0] = weight[f * C * RS + row];
            (*tpos)[e - e0] = f * RS + row % RS;
        }
    return 0;
}

/* Input gradient, stride 1: gx[b, c, h, w] = sum over the kept (f, r, s) of channel c of
 * weight * gp[f, h + ph + (R-1-r)*dh, w + pw + (S-1-s)*dw, b] (gp padded by (R-1)*dh rows on
 * top, (S-1)*dw columns on the left), for c in [c0, c1): the forward's gather over the
 * transposed matrix. */
static void NAME(input_grad_gather)(const T *gp, const T *tval, int64_t *off,
                                    const int64_t *t_row_ptr, T *gx, int64_t B, int64_t C,
                                    int64_t H, int64_t W, int64_t R, int64_t S, int64_t pp,
                                    int64_t qp, int64_t ph, int64_t pw, int64_t dh, int64_t dw,
                                    int64_t c0, int64_t c1)
{
    const int64_t RS = R * S, e0 = t_row_ptr[c0 * RS];
    for (int64_t e = 0; e < t_row_ptr[c1 * RS] - e0; e++) {
        const int64_t f = off[e] / RS, r = off[e] % RS / S, s = off[e] % S;
        off[e] = ((f * pp + (R - 1 - r) * dh) * qp + (S - 1 - s) * dw) * B;
    }
    for (int64_t h = 0; h < H; h++)
        for (int64_t c = c0; c < c1; c++)
            NAME(gather_plane)(gp, tval, off, t_row_ptr[c * RS] - e0,
                               t_row_ptr[(c + 1) * RS] - e0, 1, W, B, 0, (h + ph) * qp * B, pw,
                               1, gx + (c * H + h) * W, W, C * H * W);
}

/* Input gradient, any stride: each kept (f, r, s) of channel c adds weight * gp[f, p, q, :]
 * at padded position (p*sh + r*dh, q*sw + s*dw) of a per-channel [Hp, Wp, B] buffer, whose
 * interior is then stored into gx. */
static int NAME(input_grad_scatter)(const T *gp, const T *tval, const int64_t *pos,
                                    const int64_t *t_row_ptr, T *gx, int64_t B, int64_t C,
                                    int64_t H, int64_t W, int64_t R, int64_t S, int64_t P,
                                    int64_t Q, int64_t pp, int64_t qp, int64_t top, int64_t left,
                                    int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh,
                                    int64_t dw, int64_t c0, int64_t c1)
{
    const int64_t RS = R * S, e0 = t_row_ptr[c0 * RS];
    const int64_t hp = H + 2 * ph, wp = W + 2 * pw;
    T *acc = malloc((size_t)(hp * wp * B) * sizeof *acc);
    if (!acc) return 2;
    for (int64_t c = c0; c < c1; c++) {
        memset(acc, 0, (size_t)(hp * wp * B) * sizeof *acc);
        for (int64_t e = t_row_ptr[c * RS] - e0; e < t_row_ptr[(c + 1) * RS] - e0; e++) {
            const int64_t f = pos[e] / RS, r = pos[e] % RS / S, s = pos[e] % S;
            const T wv = tval[e];
            for (int64_t p = 0; p < P; p++)
                for (int64_t q = 0; q < Q; q++) {
                    const T *g = gp + ((f * pp + top + p) * qp + left + q) * B;
                    T *d = acc + ((p * sh + r * dh) * wp + q * sw + s * dw) * B;
                    int64_t b = 0;
                    for (; b + LANES <= B; b += LANES)
                        NAME(store)(d + b, NAME(load)(d + b) + wv * NAME(load)(g + b));
                    for (; b < B; b++) d[b] += wv * g[b];
                }
        }
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < H; h++) {
                T *dst = gx + ((b * C + c) * H + h) * W;
                const T *src = acc + ((h + ph) * wp + pw) * B + b;
                for (int64_t w = 0; w < W; w++) dst[w] = src[w * B];
            }
    }
    free(acc);
    return 0;
}

/* Input gradient for channels [c0, c1): the gather at stride 1 (gp padded by top = (R-1)*dh
 * and left = (S-1)*dw), the scatter otherwise (gp's gradient at rows top.., columns left..). */
int NAME(pdt_pconv_input_grad)(const T *gp, const T *weight, const int64_t *t_row_ptr,
                               const int64_t *t_col_ind, T *gx, int64_t nnz, int64_t B,
                               int64_t C, int64_t F, int64_t H, int64_t W, int64_t R,
                               int64_t S, int64_t P, int64_t Q, int64_t pp, int64_t qp,
                               int64_t top, int64_t left, int64_t sh, int64_t sw, int64_t ph,
                               int64_t pw, int64_t dh, int64_t dw, int64_t c0, int64_t c1)
{
    T *tval;
    int64_t *pos;
    int code = NAME(transposed_entries)(weight, t_row_ptr, t_col_ind, nnz, F, C, R * S, c0, c1,
                                        &tval, &pos);
    if (!code) {
        if (sh == 1 && sw == 1 && top == (R - 1) * dh && left == (S - 1) * dw)
            NAME(input_grad_gather)(gp, tval, pos, t_row_ptr, gx, B, C, H, W, R, S, pp, qp, ph,
                                    pw, dh, dw, c0, c1);
        else
            code = NAME(input_grad_scatter)(gp, tval, pos, t_row_ptr, gx, B, C, H, W, R, S, P, Q,
                                            pp, qp, top, left, sh, sw, ph, pw, dh, dw, c0, c1);
    }
    free(tval);
    free(pos);
    return code;
}

/* sum over i < n of a[i] * b[i], in NVEC vector lanes then added up (lane by lane, then
 * across the lanes, then the tail). */
static void NAME(dot)(const T *a, const T *b, int64_t n, VEC *acc, T *tail)
{
    int64_t i = 0;
    for (; i + BLOCK <= n; i += BLOCK) {
        acc[0] += NAME(load)(a + i) * NAME(load)(b + i);
        acc[1] += NAME(load)(a + i + LANES) * NAME(load)(b + i + LANES);
        acc[2] += NAME(load)(a + i + 2 * LANES) * NAME(load)(b + i + 2 * LANES);
        acc[3] += NAME(load)(a + i + 3 * LANES) * NAME(load)(b + i + 3 * LANES);
    }
    for (; i + LANES <= n; i += LANES) acc[0] += NAME(load)(a + i) * NAME(load)(b + i);
    for (; i < n; i++) *tail += a[i] * b[i];
}

/* Weight gradient at the kept positions of filters [f0, f1) (SDDMM): for the entry (c, r, s)
 * of row f, grad[f, c, r, s] = sum over p, q, b of gp[f, top + p, left + q, b] *
 * xt[c, p*sh + r*dh, q*sw + s*dw, b]; grad is not written elsewhere. At unit column stride
 * a row's Q*B products are one contiguous run. */
int NAME(pdt_pconv_weight_grad)(const T *xt, const T *gp, const int64_t *row_ptr,
                                const int64_t *col_ind, T *grad, int64_t nnz, int64_t B,
                                int64_t C, int64_t F, int64_t R, int64_t S, int64_t hp,
                                int64_t wp, int64_t P, int64_t Q, int64_t pp, int64_t qp,
                                int64_t top, int64_t left, int64_t sh, int64_t sw, int64_t dh,
                                int64_t dw, int64_t f0, int64_t f1)
{
    const int64_t K = C * R * S;
    (void)F;
    if (!rows_ok(row_ptr, f0, f1, nnz)) return 3;
    for (int64_t f = f0; f < f1; f++)
        for (int64_t k = row_ptr[f]; k < row_ptr[f + 1]; k++) {
            const int64_t col = col_ind[k], c = col / (R * S), r = col / S % R, s = col % S;
            if (col < 0 || col >= K) return 3;
            const T *xs = xt + ((c * hp + r * dh) * wp + s * dw) * B;
            VEC acc[NVEC] = {{0}};
            T tail = 0;
            for (int64_t p = 0; p < P; p++) {
                const T *xrow = xs + p * sh * wp * B;
                const T *grow = gp + ((f * pp + top + p) * qp + left) * B;
                if (sw == 1)
                    NAME(dot)(grow, xrow, Q * B, acc, &tail);
                else
                    for (int64_t q = 0; q < Q; q++)
                        NAME(dot)(grow + q * B, xrow + q * sw * B, B, acc, &tail);
            }
            const VEC sum = (acc[0] + acc[1]) + (acc[2] + acc[3]);
            T total = 0;
            for (int64_t l = 0; l < LANES; l++) total += sum[l];
            grad[f * K + col] = total + tail;
        }
    return 0;
}

#undef VEC
#undef LANES
#undef BLOCK
#endif
