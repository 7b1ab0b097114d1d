/* Fused per-token kernel behind grpo_cli._fast (optional: numpy computes the same).
 *
 * One pass over a record batch's token columns computes, per answer, the sums of the GRPO
 * per-token terms, and, per batch, the clip counts, ratio and KL moments and the two fine
 * histograms that grpo_cli._report.TokenPartial otherwise builds from ~40 numpy passes.
 * The formulas are those of grpo_cli._core (DeepSeekMath eq. 3 and 4; PPO clip, Schulman
 * et al. 2017; dual clip, Ye et al. 2020; k1/k2/k3 KL estimators, Schulman 2020), with the
 * same operations, so every per-token value equals numpy's: the surrogate is written as
 * min(r, 1+eps)·A for A > 0 and max(r, 1-eps)·A for A < 0, which equals numpy's
 * min(r·A, clip(r)·A) bit for bit because rounding is monotone. Summation order differs,
 * and on AVX2 machines the exponential is glibc's vector exp (libmvec, within 4 ulp of
 * the scalar one).
 *
 * On request it also gives each answer's gradient sums (Σ g_p², Σ g_k², Σ g_p·g_k of
 * grpo_cli._core.token_gradients' per-token derivatives, and the tokens of nonzero g_p) and
 * its extremes (the largest KL estimate and |Δ|, and the first token holding each), and
 * bins into histograms only when given them: what `objective --gradient` and `answers`
 * need, in the same pass.
 *
 * The policy term may be another loss's: given per token (pol_in, computed by numpy from
 * the loss registry's function, the kernel summing it with everything else in its one
 * pass), or the clipped surrogate times a per-token weight (w_in: a sampler-trainer
 * correction's weights times the policy-term masks, 0 on a masked token even where the
 * surrogate is infinite, as grpo_cli.fold.parts._times). The clip counts, ratio and KL
 * statistics stay those of the token ratio, as the numpy path computes them for any loss.
 *
 * Built with -ffp-contract=off: a fused multiply-add would bin histogram values
 * differently from numpy's separate multiply and add.
 *
 * Called through ctypes (the call releases the GIL); the Python module this file also
 * defines is empty and only lets importlib find the shared object.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>

#if defined(__x86_64__) && defined(__GLIBC__) && defined(GRPO_LIBMVEC)
#include <immintrin.h>
#define HAVE_AVX2 1
extern __m256d _ZGVdN4v_exp(__m256d);
#endif

/* Settings, fixed for a run. Infinity turns a clamp off; NaN turns dual clip off. */
typedef struct {
    double lo, hi;        /* the clip range of the ratio: 1 - eps_low, 1 + eps_high */
    double dual;          /* dual-clip c (NaN: off) */
    double lrc;           /* log-ratio clamp c (inf: off), before exp of ratio and k3 */
    double beta;          /* KL weight */
    double kl_clamp;      /* clamp of the KL estimate (inf: off) */
    int64_t kl_est;       /* 1, 2 or 3 */
    double h_lo, h_inv_w; /* histograms: first edge, 1 / bin width */
    int64_t h_nb;         /* number of inner bins (plus two open end bins) */
} grpo_params;

/* Per-batch results besides the per-answer sums. */
typedef struct {
    double r_sum, r2_sum; /* Σρ, Σρ² of the raw ratio exp(Δ) */
    double d_min, d_max;  /* extremes of Δ = logp - old_logp */
    double kf_sum, kf_sq; /* Σk, Σk² over finite k */
    double k_min, k_max;
    double x_min, x_max;  /* extremes of x = ref_logp - logp */
    double d_sum, d20_sum; /* Σ Δ and Σ clamp(Δ, ±20) (the trainers' ppo_kl) */
    double x_sum;          /* Σ x */
    int64_t r_inf;         /* tokens whose raw ratio is inf */
    int64_t k_inf;         /* tokens whose k is not finite */
    int64_t n_low, n_high, n_outside, n_dual;
} grpo_totals;

#define BLOCK 512

/* Where the per-answer results go ((n,) arrays; NULL: not asked). */
typedef struct {
    double *term, *policy, *kl;     /* Σ_t of the term, the policy term and the KL estimate */
    int64_t *low, *high;            /* tokens with ρ < 1 - ε_low and A < 0; ρ > 1 + ε_high, A > 0 */
    int64_t *d_hist, *x_hist;       /* nb + 2 counts of Δ and of x (NULL: not binned) */
    double *g_pp, *g_kk, *g_pk;     /* Σ g_p², Σ g_k², Σ g_p·g_k (g_kk, g_pk NULL: no KL part) */
    int64_t *g_nz;                  /* tokens with g_p != 0 */
    double *kl_max, *lr_max;        /* the largest KL estimate, the largest |Δ| */
    int64_t *kl_at, *lr_at;         /* the first of the answer's tokens holding it */
    /* inputs, (T,) (NULL: not given): the per-token policy term replacing the clipped
     * surrogate, or the weight multiplying it (and its gradient) */
    const double *pol_in, *w_in;
} grpo_out;

/* One block of one answer, ready for phase 2: log-ratios and their exponentials. */
typedef struct {
    int64_t m;
    double dl[BLOCK]; /* Δ */
    double r[BLOCK];  /* the ratio the surrogate uses: exp(clamped Δ) */
    double rr[BLOCK]; /* the raw ratio exp(Δ), when Δ is clamped */
    double x[BLOCK];  /* x = ref_logp - logp */
    double k[BLOCK];  /* the KL estimate */
    double ek[BLOCK]; /* k3's exp(x) (x clamped when asked): its derivative is 1 - exp(x) */
    double t[BLOCK];  /* scratch */
    const double *pin; /* the block's given policy terms (NULL: the clipped surrogate) */
    const double *w;   /* the block's weights of the clipped surrogate (NULL: 1) */
} block;

/* Running sums of one answer; extremes and counts of the batch. */
typedef struct {
    double term, pol, kl, r, r2, kf, kf2, d, d20, x;
} sums;

/* The gradient sums and extremes of one answer, carried over its blocks. */
typedef struct {
    double pp, kk, pk;
    int64_t nz;
    double kl_max, lr_max;
    int64_t kl_at, lr_at;
} extras;

/* ----------------------------------------------------------------- phase 1 */
typedef void (*exp_fn)(const double *, double *, int64_t);

static void exp_scalar(const double *x, double *y, int64_t n) {
    for (int64_t j = 0; j < n; j++) y[j] = exp(x[j]);
}

#ifdef HAVE_AVX2
__attribute__((target("avx2,fma"))) static void exp_avx2(const double *x, double *y, int64_t n) {
    int64_t j = 0;
    for (; j + 4 <= n; j += 4) _mm256_storeu_pd(y + j, _ZGVdN4v_exp(_mm256_loadu_pd(x + j)));
    for (; j < n; j++) y[j] = exp(x[j]);
}
#endif

static inline double clampd(double x, double c) { return x < -c ? -c : (x > c ? c : x); }

/* Plain loops below are vectorised by the compiler; on x86-64 also for AVX2 (chosen at
 * load time). */
#ifdef HAVE_AVX2
#define CLONES __attribute__((target_clones("avx2", "default")))
#else
#define CLONES
#endif

/* out = (double)a - (double)b over [b0, b0 + m); b NULL means 0. */
CLONES static void diff(const void *a, const void *b, int f32, int64_t b0, int64_t m, double *out) {
    if (f32) {
        const float *fa = (const float *)a + b0, *fb = b ? (const float *)b + b0 : NULL;
        for (int64_t j = 0; j < m; j++) out[j] = fb ? (double)fa[j] - (double)fb[j] : 0.0;
    } else {
        const double *da = (const double *)a + b0, *db = b ? (const double *)b + b0 : NULL;
        for (int64_t j = 0; j < m; j++) out[j] = db ? da[j] - db[j] : 0.0;
    }
}

CLONES static void phase1(const grpo_params *p, exp_fn vexp, const void *logp, const void *old,
                   const void *ref, int f32, int64_t b0, block *B) {
    const int64_t m = B->m;
    if (old) {
        diff(logp, old, f32, b0, m, B->dl);
    } else {
        for (int64_t j = 0; j < m; j++) B->dl[j] = 0.0;
    }
    if (isfinite(p->lrc)) {
        for (int64_t j = 0; j < m; j++) B->t[j] = clampd(B->dl[j], p->lrc);
        vexp(B->t, B->r, m);
        vexp(B->dl, B->rr, m);
    } else {
        vexp(B->dl, B->r, m);
    }
    if (!ref) return;
    diff(ref, logp, f32, b0, m, B->x);
    double *k = B->k;
    if (p->kl_est == 3) { /* k = exp(x) - x - 1, x clamped first when asked */
        const double *xe = B->x;
        if (isfinite(p->lrc)) {
            for (int64_t j = 0; j < m; j++) B->t[j] = clampd(B->x[j], p->lrc);
            xe = B->t;
        }
        vexp(xe, B->ek, m);
        for (int64_t j = 0; j < m; j++) {
            k[j] = B->ek[j] - xe[j];
            k[j] -= 1.0;
            if (xe[j] == INFINITY) k[j] = INFINITY; /* inf - inf: the limit is +inf */
        }
    } else if (p->kl_est == 2) { /* k = (0.5 x) x */
        for (int64_t j = 0; j < m; j++) k[j] = 0.5 * B->x[j] * B->x[j];
    } else { /* k = -x */
        for (int64_t j = 0; j < m; j++) k[j] = -B->x[j];
    }
    if (isfinite(p->kl_clamp))
        for (int64_t j = 0; j < m; j++) k[j] = clampd(k[j], p->kl_clamp);
}

/* ----------------------------------------------------------------- phase 2 */
static inline int64_t bin_of(double x, double inv_w, double c0, double top) {
    double pos = x * inv_w;
    pos += c0;
    if (pos < 0.0) pos = 0.0;
    if (pos > top) pos = top; /* also +inf */
    return (int64_t)pos;
}

/* Tokens [j0, m) of a block, one at a time (any CPU; the tail of the AVX2 path). */
static void phase2_scalar(const grpo_params *p, double A, int has_ref, const block *B, int64_t j0,
                          sums *s, grpo_totals *tot, int64_t *d_hist, int64_t *x_hist) {
    const double c0 = 1.0 - p->h_lo * p->h_inv_w, top = (double)(p->h_nb + 1);
    const int dual = !isnan(p->dual), use_beta = p->beta != 0.0;
    const double *raw = isfinite(p->lrc) ? B->rr : B->r;
    for (int64_t j = j0; j < B->m; j++) {
        const double r = B->r[j];
        double pol = 0.0;
        if (A > 0) {
            pol = (r < p->hi ? r : p->hi) * A;
            tot->n_high += r > p->hi;
        } else if (A < 0) {
            double g = r > p->lo ? r : p->lo;
            if (dual) {
                tot->n_dual += r > p->dual;
                g = g < p->dual ? g : p->dual;
            }
            pol = g * A;
            tot->n_low += r < p->lo;
        }
        tot->n_outside += (r < p->lo) + (r > p->hi);
        if (B->pin) {
            pol = B->pin[j];
        } else if (B->w) {
            pol = B->w[j] == 0.0 ? 0.0 : pol * B->w[j];
        }
        s->pol += pol;
        const double q = raw[j];
        s->r += q;
        s->r2 += q * q;
        tot->r_inf += isinf(q) != 0;
        const double d = B->dl[j];
        s->d += d;
        s->d20 += clampd(d, 20.0);
        tot->d_min = d < tot->d_min ? d : tot->d_min;
        tot->d_max = d > tot->d_max ? d : tot->d_max;
        if (d_hist) d_hist[bin_of(d, p->h_inv_w, c0, top)]++;
        if (!has_ref) {
            s->term += pol;
            continue;
        }
        const double k = B->k[j], x = B->x[j];
        s->kl += k;
        s->x += x;
        if (isfinite(k)) {
            s->kf += k;
            s->kf2 += k * k;
        } else {
            tot->k_inf++;
        }
        tot->k_min = k < tot->k_min ? k : tot->k_min;
        tot->k_max = k > tot->k_max ? k : tot->k_max;
        tot->x_min = x < tot->x_min ? x : tot->x_min;
        tot->x_max = x > tot->x_max ? x : tot->x_max;
        if (x_hist) x_hist[bin_of(x, p->h_inv_w, c0, top)]++;
        s->term += use_beta ? pol - p->beta * k : pol;
    }
}

#ifdef HAVE_AVX2
#define V __m256d
#define SET1 _mm256_set1_pd
#define ADD _mm256_add_pd
#define MUL _mm256_mul_pd
#define VMIN _mm256_min_pd /* min_pd(a, b) = a < b ? a : b, as the scalar code */
#define VMAX _mm256_max_pd /* max_pd(a, b) = a > b ? a : b */
#define CMP(a, b, op) _mm256_cmp_pd(a, b, op)
#define COUNT(mask) __builtin_popcount((unsigned)_mm256_movemask_pd(mask))

__attribute__((target("avx2,fma"))) static inline double hsum(V v) {
    double l[4];
    _mm256_storeu_pd(l, v);
    return (l[0] + l[1]) + (l[2] + l[3]);
}

__attribute__((target("avx2,fma"))) static inline double hmin(V v) {
    double l[4];
    _mm256_storeu_pd(l, v);
    double a = l[0] < l[1] ? l[0] : l[1], b = l[2] < l[3] ? l[2] : l[3];
    return a < b ? a : b;
}

__attribute__((target("avx2,fma"))) static inline double hmax(V v) {
    double l[4];
    _mm256_storeu_pd(l, v);
    double a = l[0] > l[1] ? l[0] : l[1], b = l[2] > l[3] ? l[2] : l[3];
    return a > b ? a : b;
}

/* The bins of four values, stored at idx; the counts are incremented after the loop. */
__attribute__((target("avx2,fma"))) static inline void bins4(V x, V inv_w, V c0, V top,
                                                              int32_t *idx) {
    V pos = ADD(MUL(x, inv_w), c0);
    pos = VMIN(VMAX(pos, _mm256_setzero_pd()), top); /* NaN-free: pos > 0 ? pos : 0 */
    _mm_storeu_si128((__m128i *)idx, _mm256_cvttpd_epi32(pos));
}

/* The same as phase2_scalar, four tokens at a time; the last m % 4 go to phase2_scalar. */
__attribute__((target("avx2,fma"))) static void phase2_avx2(const grpo_params *p, double A,
                                                            int has_ref, const block *B, sums *s,
                                                            grpo_totals *tot, int64_t *d_hist,
                                                            int64_t *x_hist) {
    const int64_t m4 = B->m & ~(int64_t)3;
    const V lo = SET1(p->lo), hi = SET1(p->hi), dual = SET1(p->dual), vA = SET1(A);
    const V beta = SET1(p->beta), inf = SET1(INFINITY), zero = _mm256_setzero_pd();
    const V absmask = _mm256_castsi256_pd(_mm256_set1_epi64x(0x7fffffffffffffffLL));
    const V inv_w = SET1(p->h_inv_w), c0 = SET1(1.0 - p->h_lo * p->h_inv_w);
    const V top = SET1((double)(p->h_nb + 1));
    const int has_dual = !isnan(p->dual), use_beta = p->beta != 0.0;
    const double *raw = isfinite(p->lrc) ? B->rr : B->r;
    V s_pol = zero, s_term = zero, s_kl = zero, s_r = zero, s_r2 = zero, s_kf = zero;
    V s_kf2 = zero, s_d = zero, s_d20 = zero, s_x = zero;
    const V c20 = SET1(20.0), m20 = SET1(-20.0);
    V dmin = SET1(tot->d_min), dmax = SET1(tot->d_max), kmin = SET1(tot->k_min);
    V kmax = SET1(tot->k_max), xmin = SET1(tot->x_min), xmax = SET1(tot->x_max);
    int64_t n_low = 0, n_high = 0, n_out = 0, n_dual = 0, r_inf = 0, k_inf = 0;
    int32_t di[BLOCK], xi[BLOCK];
    for (int64_t j = 0; j < m4; j += 4) {
        const V r = _mm256_loadu_pd(B->r + j);
        const V below = CMP(r, lo, _CMP_LT_OQ), above = CMP(r, hi, _CMP_GT_OQ);
        V pol = zero;
        if (A > 0) {
            pol = MUL(VMIN(r, hi), vA);
            n_high += COUNT(above);
        } else if (A < 0) {
            V g = VMAX(r, lo);
            if (has_dual) {
                n_dual += COUNT(CMP(r, dual, _CMP_GT_OQ));
                g = VMIN(g, dual);
            }
            pol = MUL(g, vA);
            n_low += COUNT(below);
        }
        n_out += COUNT(below) + COUNT(above);
        if (B->pin) {
            pol = _mm256_loadu_pd(B->pin + j);
        } else if (B->w) {
            const V w = _mm256_loadu_pd(B->w + j);
            pol = _mm256_andnot_pd(CMP(w, zero, _CMP_EQ_OQ), MUL(pol, w)); /* 0 where w = 0 */
        }
        s_pol = ADD(s_pol, pol);
        const V q = _mm256_loadu_pd(raw + j);
        s_r = ADD(s_r, q);
        s_r2 = ADD(s_r2, MUL(q, q));
        r_inf += COUNT(CMP(q, inf, _CMP_EQ_OQ));
        const V d = _mm256_loadu_pd(B->dl + j);
        s_d = ADD(s_d, d);
        s_d20 = ADD(s_d20, VMIN(VMAX(d, m20), c20));
        dmin = VMIN(d, dmin);
        dmax = VMAX(d, dmax);
        if (d_hist) bins4(d, inv_w, c0, top, di + j);
        if (!has_ref) {
            s_term = ADD(s_term, pol);
            continue;
        }
        const V k = _mm256_loadu_pd(B->k + j), x = _mm256_loadu_pd(B->x + j);
        s_kl = ADD(s_kl, k);
        s_x = ADD(s_x, x);
        const V finite = CMP(_mm256_and_pd(k, absmask), inf, _CMP_LT_OQ);
        s_kf = ADD(s_kf, _mm256_and_pd(k, finite));
        s_kf2 = ADD(s_kf2, _mm256_and_pd(MUL(k, k), finite));
        k_inf += 4 - COUNT(finite);
        kmin = VMIN(k, kmin);
        kmax = VMAX(k, kmax);
        xmin = VMIN(x, xmin);
        xmax = VMAX(x, xmax);
        if (x_hist) bins4(x, inv_w, c0, top, xi + j);
        s_term = ADD(s_term, use_beta ? _mm256_sub_pd(pol, MUL(beta, k)) : pol);
    }
    if (d_hist)
        for (int64_t j = 0; j < m4; j++) d_hist[di[j]]++;
    if (has_ref && x_hist)
        for (int64_t j = 0; j < m4; j++) x_hist[xi[j]]++;
    s->pol += hsum(s_pol);
    s->term += hsum(s_term);
    s->r += hsum(s_r);
    s->r2 += hsum(s_r2);
    s->d += hsum(s_d);
    s->d20 += hsum(s_d20);
    if (has_ref) {
        s->kl += hsum(s_kl);
        s->x += hsum(s_x);
        s->kf += hsum(s_kf);
        s->kf2 += hsum(s_kf2);
        tot->k_min = hmin(kmin);
        tot->k_max = hmax(kmax);
        tot->x_min = hmin(xmin);
        tot->x_max = hmax(xmax);
    }
    tot->d_min = hmin(dmin);
    tot->d_max = hmax(dmax);
    tot->n_low += n_low;
    tot->n_high += n_high;
    tot->n_outside += n_out;
    tot->n_dual += n_dual;
    tot->r_inf += r_inf;
    tot->k_inf += k_inf;
    phase2_scalar(p, A, has_ref, B, m4, s, tot, d_hist, x_hist);
}
#endif

/* ------------------------------------------------------- gradient and extremes */
/* The derivatives of grpo_cli._core.token_gradients at token level, with the same
 * operations: g_p = ρA where the unclipped branch is taken, no dual clip binds and
 * |Δ| <= the log-ratio clamp, else 0; g_k = 1 (k1), -x (k2), 1 - exp(x) (k3; 0 where
 * |x| > the log-ratio clamp), 0 where |k| >= the KL clamp. Their squares and product are
 * summed four lanes at a time (the lanes are added at the end of the block). */
CLONES static void grad_block(const grpo_params *p, double A, int with_kl, const block *B,
                              extras *e) {
    const int64_t m = B->m;
    const double lo = p->lo, hi = p->hi, dual = p->dual, lrc = p->lrc, klc = p->kl_clamp;
    const int has_dual = !isnan(dual), has_lrc = isfinite(lrc), has_klc = isfinite(klc);
    double pp[4] = {0, 0, 0, 0}, kk[4] = {0, 0, 0, 0}, pk[4] = {0, 0, 0, 0};
    int64_t nz = 0;
    for (int64_t j = 0; j < m; j++) {
        const double r = B->r[j];
        int act = 0;
        if (A > 0) {
            act = r <= hi;
        } else if (A < 0) {
            act = r >= lo && !(has_dual && r > dual);
        }
        if (has_lrc && !(fabs(B->dl[j]) <= lrc)) act = 0;
        double gp = act ? r * A : 0.0;
        if (B->w) gp = B->w[j] == 0.0 ? 0.0 : gp * B->w[j];
        nz += gp != 0.0;
        pp[j & 3] += gp * gp;
        if (!with_kl) continue;
        const double x = B->x[j];
        double gk;
        if (p->kl_est == 1) {
            gk = 1.0;
        } else if (p->kl_est == 2) {
            gk = -x;
        } else {
            gk = 1.0 - B->ek[j];
            if (has_lrc && fabs(x) > lrc) gk = 0.0;
        }
        if (has_klc && fabs(B->k[j]) >= klc) gk = 0.0;
        kk[j & 3] += gk * gk;
        pk[j & 3] += gp * gk;
    }
    e->pp += (pp[0] + pp[1]) + (pp[2] + pp[3]);
    e->kk += (kk[0] + kk[1]) + (kk[2] + kk[3]);
    e->pk += (pk[0] + pk[1]) + (pk[2] + pk[3]);
    e->nz += nz;
}

/* The largest of m values (NaN-free: the KL estimate and |Δ| never are NaN), four lanes at
 * a time, so that the compiler vectorises it. */
CLONES static double block_max(const double *v, int64_t m) {
    double l[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
    int64_t j = 0;
    for (; j + 4 <= m; j += 4)
        for (int k = 0; k < 4; k++) l[k] = v[j + k] > l[k] ? v[j + k] : l[k];
    for (; j < m; j++) l[0] = v[j] > l[0] ? v[j] : l[0];
    const double a = l[0] > l[1] ? l[0] : l[1], b = l[2] > l[3] ? l[2] : l[3];
    return a > b ? a : b;
}

/* Keep the first largest: when the block's largest exceeds the best so far, find its
 * first token (b0: the block's first token within its answer), as numpy's argmax does. */
static void first_max(const double *v, int64_t m, int64_t b0, double *best, int64_t *at) {
    const double top = block_max(v, m);
    if (!(top > *best)) return;
    for (int64_t j = 0; j < m; j++) {
        if (v[j] == top) {
            *best = top;
            *at = b0 + j;
            return;
        }
    }
}

/* The largest KL estimate and |Δ| of the block's tokens and the first token holding each. */
CLONES static void extremes_block(block *B, int has_ref, int64_t b0, extras *e) {
    for (int64_t j = 0; j < B->m; j++) B->t[j] = fabs(B->dl[j]);
    first_max(B->t, B->m, b0, &e->lr_max, &e->lr_at);
    if (has_ref) first_max(B->k, B->m, b0, &e->kl_max, &e->kl_at);
}

/* The interface version and the sizes of the structs the caller mirrors (grpo_cli._fast):
 * the loader refuses a kernel whose layout is not its own instead of reading garbage. */
#define GRPO_ABI_VERSION 6
int64_t grpo_abi(int64_t *out) {
    out[0] = GRPO_ABI_VERSION;
    out[1] = (int64_t)sizeof(grpo_params);
    out[2] = (int64_t)sizeof(grpo_totals);
    out[3] = (int64_t)sizeof(grpo_out);
    return 4;
}

/* 1 when this build has the AVX2 path and this CPU can run it. */
int64_t grpo_vector_exp(void) {
#ifdef HAVE_AVX2
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return 0;
#endif
}

/* y[j] = exp(x[j]) for n doubles: libmvec's AVX2 exp where this build and CPU have it
 * (within 4 ulp of the scalar one; about 1 ns a value against numpy's ~7 without AVX-512),
 * else the scalar exp. For the loss registry's functions (grpo_cli.core.vmath), whose
 * exponentials were most of their time on the kernel's path. Returns 0. */
int64_t grpo_exp(const double *x, double *y, int64_t n) {
#ifdef HAVE_AVX2
    if (grpo_vector_exp()) {
        exp_avx2(x, y, n);
        return 0;
    }
#endif
    exp_scalar(x, y, n);
    return 0;
}

/* Fold a batch of n answers (tokens offsets[i] .. offsets[i+1]) of float32 (f32 = 1) or
 * float64 columns; old and ref may be NULL; out->pol_in or out->w_in change the policy term
 * (with pol_in, the gradient sums are the clipped surrogate's: the caller does not ask). Writes the per-answer results *out asks for
 * (term, policy, low and high always; kl with ref), increments the histograms it gives
 * and accumulates into *tot. vector = 0 forces the scalar path. Returns 0. */
int64_t grpo_fold(const grpo_params *p, int64_t n, const int64_t *offsets, const double *adv,
                  const void *logp, const void *old, const void *ref, int64_t f32,
                  const grpo_out *out, grpo_totals *tot, int64_t vector) {
#ifdef HAVE_AVX2
    const int use_avx2 = vector && grpo_vector_exp();
    const exp_fn vexp = use_avx2 ? exp_avx2 : exp_scalar;
#else
    (void)vector;
    const exp_fn vexp = exp_scalar;
#endif
    static __thread block B;
    const int grad = out->g_pp != NULL, grad_kl = grad && ref && out->g_kk && out->g_pk;
    const int ext = out->lr_max != NULL;
    for (int64_t i = 0; i < n; i++) {
        sums s = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
        extras e = {0, 0, 0, 0, -INFINITY, -INFINITY, 0, 0};
        const int64_t low0 = tot->n_low, high0 = tot->n_high;
        for (int64_t b0 = offsets[i]; b0 < offsets[i + 1]; b0 += BLOCK) {
            B.m = offsets[i + 1] - b0 < BLOCK ? offsets[i + 1] - b0 : BLOCK;
            B.pin = out->pol_in ? out->pol_in + b0 : NULL;
            B.w = out->w_in ? out->w_in + b0 : NULL;
            phase1(p, vexp, logp, old, ref, (int)f32, b0, &B);
            if (grad) grad_block(p, adv[i], grad_kl, &B, &e);
            if (ext) extremes_block(&B, ref != NULL, b0 - offsets[i], &e);
#ifdef HAVE_AVX2
            if (use_avx2) {
                phase2_avx2(p, adv[i], ref != NULL, &B, &s, tot, out->d_hist, out->x_hist);
                continue;
            }
#endif
            phase2_scalar(p, adv[i], ref != NULL, &B, 0, &s, tot, out->d_hist, out->x_hist);
        }
        out->term[i] = s.term;
        out->policy[i] = s.pol;
        out->low[i] = tot->n_low - low0;
        out->high[i] = tot->n_high - high0;
        tot->r_sum += s.r;
        tot->r2_sum += s.r2;
        tot->d_sum += s.d;
        tot->d20_sum += s.d20;
        if (ref) {
            out->kl[i] = s.kl;
            tot->x_sum += s.x;
            tot->kf_sum += s.kf;
            tot->kf_sq += s.kf2;
        }
        if (grad) {
            out->g_pp[i] = e.pp;
            out->g_nz[i] = e.nz;
            if (grad_kl) {
                out->g_kk[i] = e.kk;
                out->g_pk[i] = e.pk;
            }
        }
        if (ext) {
            out->lr_max[i] = e.lr_max;
            out->lr_at[i] = e.lr_at;
            if (ref) {
                out->kl_max[i] = e.kl_max;
                out->kl_at[i] = e.kl_at;
            }
        }
    }
    return 0;
}

static struct PyModuleDef kernel_module = {
    PyModuleDef_HEAD_INIT, "_kernel", "Fused GRPO token kernel, called through ctypes.", -1, NULL,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__kernel(void) { return PyModule_Create(&kernel_module); }
