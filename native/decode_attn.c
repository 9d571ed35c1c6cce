/*
 * One decode step's attention for the native engine's CPU path (fastcrit/rollout/decode_attn.py):
 * for every (row, KV head), write the step's key and value into the row's generated cache, then
 * scores over the prompt's shared cache and the row's generated cache, one softmax, and the
 * weighted values, in one pass per (row, KV head) and without any intermediate tensor.
 *
 * Why in C: with torch ops the same step is four batched products of tiny matrices (one per KV
 * head and row), a concatenation, a softmax and the copies that stack a prompt's rows, and most
 * of their time is per-matrix overhead and intermediate traffic rather than arithmetic.
 *
 * Layouts (fp32, row-major):
 *   q       [rows, heads, d] with row stride qs; head h*g + i is query i of KV head h
 *   k_new   [rows, kv, d] with row stride ks;  v_new likewise (vs)
 *   kpT     [prompts, kv, Pl / 16, d, 16]: the prompt's keys in blocks of 16 keys, each block
 *           transposed ([d, 16]); Pl = P rounded up to 16 (the scores of columns past P are
 *           computed with their block and then overwritten)
 *   vp      [prompts, kv, P, d]
 *   bias_p  [prompts, P]: 0 on a prompt token, -inf on padding
 *   group   [rows] int64: each row's prompt
 *   kgT     [rows, kv, cap / 16, d, 16]: generated keys, blocked as kpT; cap a multiple of 16; key t
 *           is written
 *   vg      [rows, kv, cap, d]: generated values; row t is written
 *   out     [rows, heads, d]
 * Keys are stored transposed in blocks of 16 so that a block's scores are 16 contiguous lanes (d
 * fused multiply-adds per block, no horizontal sums) and the first n keys are ceil(n / 16)
 * contiguous blocks (sequential reads, whatever the cache's capacity). d must be a multiple of 16
 * and at most 512.
 *
 * Work is split over (row, KV head) with OpenMP; built against the libgomp torch itself loads, the
 * threads are torch's own (see CMakeLists.txt). Vectors are GCC/Clang vector extensions, compiled
 * for AVX-512, AVX2 and baseline x86-64 and chosen at load time (target_clones), so one build runs
 * on any x86-64 machine.
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#define B 16     /* lanes of one vector of scores */
#define MAX_D 512

typedef float vf __attribute__((vector_size(64)));
typedef int32_t vi __attribute__((vector_size(64)));
typedef float vfu __attribute__((vector_size(64), aligned(4)));

#define INL static inline __attribute__((always_inline))

INL vf ld(const float *p) { return *(const vfu *)p; }
INL void st(float *p, vf x) { *(vfu *)p = x; }
INL vf splat(float x) { return (vf){0} + x; }
INL vf sel(vi m, vf a, vf b) { return (vf)((m & (vi)a) | (~m & (vi)b)); }

/* e^x for x <= 0 (and -inf), to about 2 ulp: 2^n p(r) with r = x - n ln2 in [-ln2/2, ln2/2] and
 * p the degree-7 Taylor polynomial; exactly 0 below -87 (where fp32 e^x is denormal or 0). */
INL vf exp_neg(vf x) {
    vi dead = x < -87.0f;
    vf xc = sel(dead, splat(-87.0f), x);
    const vf magic = splat(12582912.0f); /* 1.5 * 2^23: adding it rounds to an integer */
    vf n = (xc * 1.44269504088896341f + magic) - magic;
    vf r = xc - n * 0.693359375f;
    r = r + n * 2.12194440e-4f; /* ln2 = 0.693359375 - 2.12194440e-4, in two parts */
    vf p = splat(1.0f / 5040.0f);
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    vi bits = (__builtin_convertvector(n, vi) + 127) << 23;
    return sel(dead, splat(0.0f), p * (vf)bits);
}

/* sa[j], sb[j] = scale * (qa . k_j), (qb . k_j) for j < roundup(n, 16), the keys in blocks
 * KT [n / 16, d, 16]; sb only when `two` (a constant at each call: the loops are compiled for
 * each). Four blocks at a time: eight independent accumulators keep the FMA units busy. */
INL void scores_t(const float *restrict qa, const float *restrict qb, const int two, const float *restrict KT,
                  int64_t n, int64_t d, float scale, float *restrict sa, float *restrict sb) {
    const int64_t nb = (n + B - 1) / B * B, bs = d * B; /* floats per block */
    int64_t j = 0;
    for (; j + 4 * B <= nb; j += 4 * B) {
        vf a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, b0 = {0}, b1 = {0}, b2 = {0}, b3 = {0};
        const float *kb = KT + (j / B) * bs;
        for (int64_t e = 0; e < d; ++e) {
            const float *k = kb + e * B;
            vf k0 = ld(k), k1 = ld(k + bs), k2 = ld(k + 2 * bs), k3 = ld(k + 3 * bs);
            float x = qa[e];
            a0 += x * k0, a1 += x * k1, a2 += x * k2, a3 += x * k3;
            if (two) {
                float y = qb[e];
                b0 += y * k0, b1 += y * k1, b2 += y * k2, b3 += y * k3;
            }
        }
        st(sa + j, a0 * scale), st(sa + j + B, a1 * scale), st(sa + j + 2 * B, a2 * scale);
        st(sa + j + 3 * B, a3 * scale);
        if (two) {
            st(sb + j, b0 * scale), st(sb + j + B, b1 * scale), st(sb + j + 2 * B, b2 * scale);
            st(sb + j + 3 * B, b3 * scale);
        }
    }
    for (; j < nb; j += B) {
        vf a = {0}, b = {0};
        const float *kb = KT + (j / B) * bs;
        for (int64_t e = 0; e < d; ++e) {
            vf k = ld(kb + e * B);
            a += qa[e] * k;
            if (two) b += qb[e] * k;
        }
        st(sa + j, a * scale);
        if (two) st(sb + j, b * scale);
    }
}

/* oa += sum_j pa[j] V[j, :], ob likewise when `two`, over n rows of V [n, d]; two rows at a time
 * into separate accumulators (independent FMA chains), added at the end. */
INL void wsum(const float *restrict pa, const float *restrict pb, const int two, const float *restrict V, int64_t n,
              int64_t d, float *restrict oa, float *restrict ob) {
    for (int64_t e = 0; e < d; e += B) {
        vf a = {0}, b = {0}, a2 = {0}, b2 = {0};
        int64_t j = 0;
        for (; j + 2 <= n; j += 2) {
            vf v = ld(V + j * d + e), w = ld(V + (j + 1) * d + e);
            a += pa[j] * v, a2 += pa[j + 1] * w;
            if (two) b += pb[j] * v, b2 += pb[j + 1] * w;
        }
        if (j < n) {
            vf v = ld(V + j * d + e);
            a += pa[j] * v;
            if (two) b += pb[j] * v;
        }
        st(oa + e, ld(oa + e) + (a + a2));
        if (two) st(ob + e, ld(ob + e) + (b + b2));
    }
}

/* softmax of s[0, n) in place; s has room up to roundup(n, 16), set to -inf past n */
INL void softmax_(float *restrict s, int64_t n) {
    int64_t nb = (n + B - 1) / B * B;
    for (int64_t j = n; j < nb; ++j) s[j] = -INFINITY;
    vf m = splat(-INFINITY);
    for (int64_t j = 0; j < nb; j += B) {
        vf x = ld(s + j);
        m = sel(x > m, x, m);
    }
    float mx = m[0];
    for (int l = 1; l < B; ++l) mx = m[l] > mx ? m[l] : mx;
    vf sum = {0};
    for (int64_t j = 0; j < nb; j += B) {
        vf e = exp_neg(ld(s + j) - mx);
        st(s + j, e);
        sum += e;
    }
    float tot = 0.0f;
    for (int l = 0; l < B; ++l) tot += sum[l];
    float inv = 1.0f / tot;
    for (int64_t j = 0; j < nb; j += B) st(s + j, ld(s + j) * inv);
}

/* The attention of query qa (and qa + d when `two`) of one row and KV head: scores over the
 * prompt's P keys (plus the bias) and the row's n generated keys, one softmax, the weighted values
 * into oa (and oa + d). sa, sb: Pl + cap floats each. */
INL void attend_item(const float *qa, const int two, float *oa, const float *KP, const float *VP, const float *bp,
                     int64_t P, int64_t Pl, const float *KT, const float *VG, int64_t n, int64_t d, float scale,
                     float *sa, float *sb) {
    const float *qb = qa + d;
    float *ob = oa + d;
    scores_t(qa, qb, two, KP, P, d, scale, sa, sb);
    for (int64_t j = 0; j < P; ++j) sa[j] += bp[j];
    if (two)
        for (int64_t j = 0; j < P; ++j) sb[j] += bp[j];
    scores_t(qa, qb, two, KT, n, d, scale, sa + Pl, sb + Pl);
    if (Pl != P) { /* the generated scores right after the prompt's P */
        memmove(sa + P, sa + Pl, sizeof(float) * n);
        if (two) memmove(sb + P, sb + Pl, sizeof(float) * n);
    }
    softmax_(sa, P + n);
    if (two) softmax_(sb, P + n);
    memset(oa, 0, sizeof(float) * d * (two ? 2 : 1));
    wsum(sa, sb, two, VP, P, d, oa, ob);
    wsum(sa + P, sb + P, two, VG, n, d, oa, ob);
}

/* The interface's version: decode_attn.py loads a library only when it matches (a library built
 * from an older decode_attn.c, say after a pull without a reinstall, would be called with the wrong
 * arguments). Bump it with any change to fc_decode_attn's arguments or layouts. */
int fc_decode_attn_abi(void) { return 1; }

/* The attention of decode step t (0-based) for every (row, KV head); see the top of the file.
 * scratch: nthreads * 2 * (Pl + cap) floats. Returns 0, or -1 (nothing read or written) when a size
 * is refused: d not a multiple of 16 or above 512, cap or Pl not multiples of 16, Pl < P, or t
 * outside [0, cap). */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif
int fc_decode_attn(const float *q, int64_t qs, const float *k_new, int64_t ks, const float *v_new, int64_t vs,
                   const float *kpT, int64_t Pl, const float *vp, const float *bias_p, const int64_t *group,
                   float *kgT, float *vg, int64_t cap, int64_t t, float *out, int64_t rows, int64_t kv, int64_t g,
                   int64_t d, int64_t P, float scale, float *scratch_all, int nthreads) {
    if (d % B != 0 || d > MAX_D || cap % B != 0 || Pl % B != 0 || Pl < P || t < 0 || t >= cap) return -1;
    const int64_t n = t + 1, Ls = Pl + cap;
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t it = 0; it < rows * kv; ++it) {
        const int64_t r = it / kv, h = it % kv, p = group[r];
        float *KT = kgT + (r * kv + h) * d * cap, *VG = vg + (r * kv + h) * cap * d;
        const float *kn = k_new + r * ks + h * d, *vn = v_new + r * vs + h * d;
        float *kt = KT + (t / B) * d * B + t % B;
        for (int64_t e = 0; e < d; ++e) kt[e * B] = kn[e];
        memcpy(VG + t * d, vn, sizeof(float) * d);
        const float *KP = kpT + (p * kv + h) * d * Pl, *VP = vp + (p * kv + h) * P * d, *bp = bias_p + p * P;
        float *scratch = scratch_all + (int64_t)omp_get_thread_num() * 2 * Ls;
        for (int64_t i = 0; i < g; i += 2) { /* two queries at a time: each key and value read once */
            const float *qa = q + r * qs + (h * g + i) * d;
            float *oa = out + (r * kv * g + h * g + i) * d;
            if (i + 1 < g)
                attend_item(qa, 1, oa, KP, VP, bp, P, Pl, KT, VG, n, d, scale, scratch, scratch + Ls);
            else /* the last of an odd number */
                attend_item(qa, 0, oa, KP, VP, bp, P, Pl, KT, VG, n, d, scale, scratch, scratch + Ls);
        }
    }
    return 0;
}
