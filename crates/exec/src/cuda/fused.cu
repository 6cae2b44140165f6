// Fused kernels (after `prelude.cu` and `kernels.cu`): layer and RMS normalisation, and scaled
// dot-product attention, each computing what its CPU kernel in `crates/exec/src/cpu` (`norm.rs`,
// `attention.rs`) computes.
//
// Every kernel here gives one thread a whole row (or column) of the problem and lets no thread
// wait on another: no shared memory, no barriers, no atomics, and no per-thread arrays (a thread
// accumulates straight into its own row of the output, reads its operands where they lie, and so
// takes no local memory whatever the widths). Attention streams one query (or key) over the keys
// (queries) with a running softmax, so, as on the CPU, the `lq × lk` weights never exist whole:
// the forward keeps the output and each row's log-sum-exp, and backward recomputes the weights
// from them. A key whose weight is exactly 0 (hidden by the mask or causality) is skipped, so a
// NaN in its values cannot reach a result; the CPU's tiles multiply such zeros through within a
// 32-key tile.
// Because no thread depends on another, running a kernel's threads one after another on the
// host gives exactly what the device gives, which is how `tests/cuda_kernels_on_host.rs` checks
// these kernels against the CPU's without a GPU.

// ---------------------------------------------------------------------------------------------
// Normalisation over rows of `n` (cpu::norm): statistics [mean, rstd] per row, in f64.

template <typename T>
__device__ __forceinline__ void norm_stats_k(const T* x, u64 rows, u64 n, double eps, u64 rms,
                                             T* st) {
    GRID_LOOP(r, rows) {
        const T* row = x + r * n;
        double inv = 1.0 / (double)n;
        double mean = 0.0, var = 0.0;
        if (rms) {
            double s = 0.0;
            for (u64 j = 0; j < n; ++j) s += (double)row[j] * (double)row[j];
            var = s * inv;
        } else {
            double s = 0.0;
            for (u64 j = 0; j < n; ++j) s += (double)row[j];
            mean = s * inv;
            double v = 0.0;
            for (u64 j = 0; j < n; ++j) {
                double dd = (double)row[j] - mean;
                v += dd * dd;
            }
            var = v * inv;
        }
        st[2 * r] = (T)mean;
        st[2 * r + 1] = (T)(1.0 / sqrt(var + eps));
    }
}

// y = (x − mean)·rstd·w + b, one thread per element; `w`, `b` used when `has_w`, `has_b`.
template <typename T>
__device__ __forceinline__ void norm_apply_k(const T* x, u64 rows, u64 n, const T* st, const T* w,
                                             const T* b, u64 has_w, u64 has_b, T* y) {
    GRID_LOOP(e, rows * n) {
        u64 r = e / n, j = e % n;
        T v = (x[e] - st[2 * r]) * st[2 * r + 1];
        if (has_w) v = v * w[j];
        if (has_b) v = v + b[j];
        y[e] = v;
    }
}

// The input's gradient, one thread per row: with x̂ = (x − mean)·rstd and g = gy·w,
// dx = rstd·(g − mean(g) − x̂·mean(g·x̂)) (RMS: without the mean(g) term), in f64.
template <typename T>
__device__ __forceinline__ void norm_grad_input_k(const T* x, const T* gy, const T* st, u64 rows,
                                                  u64 n, const T* w, u64 has_w, u64 rms, T* dx) {
    GRID_LOOP(r, rows) {
        const T* row = x + r * n;
        const T* gr = gy + r * n;
        double m = (double)st[2 * r], s = (double)st[2 * r + 1];
        double sg = 0.0, sgx = 0.0;
        for (u64 j = 0; j < n; ++j) {
            double gj = has_w ? (double)gr[j] * (double)w[j] : (double)gr[j];
            sg += gj;
            sgx += gj * ((double)row[j] - m) * s;
        }
        double inv = 1.0 / (double)n;
        double mg = rms ? 0.0 : sg * inv;
        double mgx = sgx * inv;
        for (u64 j = 0; j < n; ++j) {
            double gj = has_w ? (double)gr[j] * (double)w[j] : (double)gr[j];
            double xh = ((double)row[j] - m) * s;
            dx[r * n + j] = (T)(s * (gj - mg - xh * mgx));
        }
    }
}

// The affine parameters' gradients, one thread per column j: dw[j] = Σ_rows gy·x̂ and
// db[j] = Σ_rows gy, in f64 (each written when asked for).
template <typename T>
__device__ __forceinline__ void norm_grad_params_k(const T* x, const T* gy, const T* st, u64 rows,
                                                   u64 n, u64 has_w, u64 has_b, T* dw, T* db) {
    GRID_LOOP(j, n) {
        double aw = 0.0, ab = 0.0;
        for (u64 r = 0; r < rows; ++r) {
            double g = (double)gy[r * n + j];
            aw += g * ((double)x[r * n + j] - (double)st[2 * r]) * (double)st[2 * r + 1];
            ab += g;
        }
        if (has_w) dw[j] = (T)aw;
        if (has_b) db[j] = (T)ab;
    }
}

// ---------------------------------------------------------------------------------------------
// Scaled dot-product attention (cpu::attention) over `bh` heads of `lq` queries and `lk` keys,
// query and key width `d`, value width `dv`.

// The problem (cpu::attention::AttnDims and AttnMask), mirrored in params.rs. The mask is
// additive, head h's entry (i, j) at mask[head_offset(h) + i·mask_rs + j·mask_cs], where the
// head's offset comes from its coordinates over the leading axes `lead_shape` and the mask's
// strides over them `lead_stride` (0 where the mask is broadcast).
struct AttnParams {
    u64 bh, lq, lk, d, dv;
    u64 causal;
    u64 has_mask;
    u64 dropout;
    u64 seed;
    u64 threshold;
    double scale;
    double keep_scale;
    i64 mask_rs;
    i64 mask_cs;
    i64 lead_rank;
    i64 lead_shape[MAX_DIMS];
    i64 lead_stride[MAX_DIMS];
};

__device__ __forceinline__ u64 attn_head_offset(const AttnParams& p, u64 h) {
    u64 off = 0;
    for (int a = (int)p.lead_rank - 1; a >= 0; --a) {
        u64 ext = (u64)p.lead_shape[a];
        off += (h % ext) * (u64)p.lead_stride[a];
        h /= ext;
    }
    return off;
}

// Score (i, j) of a head: q_i·k_j·scale + mask, −∞ where causal hides the key.
template <typename T>
__device__ __forceinline__ T attn_score(const AttnParams& p, const T* qi, const T* kj,
                                        const T* mask, u64 moff, u64 i, u64 j) {
    if (p.causal && j > i) return M<T>::neg_inf();
    T s = (T)0;
    for (u64 c = 0; c < p.d; ++c) s += qi[c] * kj[c];
    s *= (T)p.scale;
    if (p.has_mask) s += mask[moff + i * (u64)p.mask_rs + j * (u64)p.mask_cs];
    return s;
}

// Dropout's decision for weight (h, i, j): its row-major position among all heads' weights.
__device__ __forceinline__ bool attn_keeps(const AttnParams& p, u64 h, u64 i, u64 j) {
    return dropout_keeps(p.seed, (h * p.lq + i) * p.lk + j, p.threshold);
}

// The keys query i of a head sees: all of them, or those up to i when causal.
__device__ __forceinline__ u64 attn_keys_end(const AttnParams& p, u64 i) {
    return p.causal ? (i + 1 < p.lk ? i + 1 : p.lk) : p.lk;
}

// One thread per query row: the output (softmax(s)·v, dropout on the weights after the sum
// that normalises them) and the row's log-sum-exp; 0 and −∞ for a row that sees no key.
template <typename T>
__device__ __forceinline__ void attn_forward_k(const T* q, const T* k, const T* v,
                                               const T* mask, AttnParams p, T* o, T* lse) {
    GRID_LOOP(row, p.bh * p.lq) {
        u64 h = row / p.lq, i = row % p.lq;
        const T* qi = q + row * p.d;
        T* oi = o + row * p.dv;
        for (u64 c = 0; c < p.dv; ++c) oi[c] = (T)0;
        u64 moff = p.has_mask ? attn_head_offset(p, h) : 0;
        T m = M<T>::neg_inf();
        double l = 0.0;
        u64 end = attn_keys_end(p, i);
        for (u64 j = 0; j < end; ++j) {
            T s = attn_score(p, qi, k + (h * p.lk + j) * p.d, mask, moff, i, j);
            T mn = fmax_(s, m);
            // Every key so far hidden: nothing to add.
            if (mn == M<T>::neg_inf()) continue;
            T alpha = M<T>::exp_(m - mn);
            T e = M<T>::exp_(s - mn);
            l = l * (double)alpha + (double)e;
            T w = e;
            if (p.dropout) w = attn_keeps(p, h, i, j) ? e * (T)p.keep_scale : (T)0;
            const T* vj = v + (h * p.lk + j) * p.dv;
            for (u64 c = 0; c < p.dv; ++c) oi[c] = oi[c] * alpha + w * vj[c];
            m = mn;
        }
        if (l == 0.0) {
            // Every key hidden: PyTorch's safe softmax gives weights of 0, so 0 out (nothing was
            // added).
            lse[row] = M<T>::neg_inf();
            continue;
        }
        T inv = (T)(1.0 / l);
        for (u64 c = 0; c < p.dv; ++c) oi[c] = oi[c] * inv;
        lse[row] = m + (T)log(l);
    }
}

// D_i = Σ dO_i·O_i, one thread per query row (summed in f64).
template <typename T>
__device__ __forceinline__ void attn_delta_k(const T* go, const T* o, AttnParams p, T* delta) {
    GRID_LOOP(row, p.bh * p.lq) {
        double acc = 0.0;
        for (u64 c = 0; c < p.dv; ++c) acc += (double)(go[row * p.dv + c] * o[row * p.dv + c]);
        delta[row] = (T)acc;
    }
}

// The weight's gradient dS = P∘(dP − D)·scale of pair (i, j), with dP = dO_i·v_j through the
// dropout mask; 0 where the weight is 0.
template <typename T>
__device__ __forceinline__ T attn_ds(const AttnParams& p, T pv, const T* goi, const T* vj, T di,
                                     u64 h, u64 i, u64 j) {
    T g = (T)0;
    for (u64 c = 0; c < p.dv; ++c) g += goi[c] * vj[c];
    if (p.dropout) g = attn_keeps(p, h, i, j) ? g * (T)p.keep_scale : (T)0;
    return pv * (g - di) * (T)p.scale;
}

// dQ_i = Σ_j dS_ij·k_j, one thread per query row.
template <typename T>
__device__ __forceinline__ void attn_dq_k(const T* q, const T* k, const T* v, const T* mask,
                                          const T* go, const T* lse, const T* delta, AttnParams p,
                                          T* dq) {
    GRID_LOOP(row, p.bh * p.lq) {
        u64 h = row / p.lq, i = row % p.lq;
        const T* qi = q + row * p.d;
        const T* goi = go + row * p.dv;
        T* dqi = dq + row * p.d;
        for (u64 c = 0; c < p.d; ++c) dqi[c] = (T)0;
        T li = lse[row], di = delta[row];
        u64 moff = p.has_mask ? attn_head_offset(p, h) : 0;
        // A row that sees no key has weights 0, and so gradients 0.
        u64 end = li == M<T>::neg_inf() ? 0 : attn_keys_end(p, i);
        for (u64 j = 0; j < end; ++j) {
            const T* kj = k + (h * p.lk + j) * p.d;
            T pv = M<T>::exp_(attn_score(p, qi, kj, mask, moff, i, j) - li);
            // A hidden key's weight is exactly 0, and so is its gradient.
            if (pv == (T)0) continue;
            T ds = attn_ds(p, pv, goi, v + (h * p.lk + j) * p.dv, di, h, i, j);
            for (u64 c = 0; c < p.d; ++c) dqi[c] += ds * kj[c];
        }
    }
}

// dK_j = Σ_i dS_ij·q_i and dV_j = Σ_i P̃_ij·dO_i (P̃ the weights after dropout), one thread per
// key row.
template <typename T>
__device__ __forceinline__ void attn_dkdv_k(const T* q, const T* k, const T* v, const T* mask,
                                            const T* go, const T* lse, const T* delta,
                                            AttnParams p, T* dk, T* dvo) {
    GRID_LOOP(col, p.bh * p.lk) {
        u64 h = col / p.lk, j = col % p.lk;
        const T* kj = k + col * p.d;
        const T* vj = v + col * p.dv;
        T* dkj = dk + col * p.d;
        T* dvj = dvo + col * p.dv;
        for (u64 c = 0; c < p.d; ++c) dkj[c] = (T)0;
        for (u64 c = 0; c < p.dv; ++c) dvj[c] = (T)0;
        u64 moff = p.has_mask ? attn_head_offset(p, h) : 0;
        // Causal: only the queries from j on see key j.
        for (u64 i = p.causal ? j : 0; i < p.lq; ++i) {
            u64 row = h * p.lq + i;
            T li = lse[row];
            if (li == M<T>::neg_inf()) continue;
            const T* qi = q + row * p.d;
            T pv = M<T>::exp_(attn_score(p, qi, kj, mask, moff, i, j) - li);
            if (pv == (T)0) continue;
            const T* goi = go + row * p.dv;
            T pd = pv;
            if (p.dropout) pd = attn_keeps(p, h, i, j) ? pv * (T)p.keep_scale : (T)0;
            for (u64 c = 0; c < p.dv; ++c) dvj[c] += pd * goi[c];
            T ds = attn_ds(p, pv, goi, vj, delta[row], h, i, j);
            for (u64 c = 0; c < p.d; ++c) dkj[c] += ds * qi[c];
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Entry points.

BOTH(norm_stats, (u64 x, u64 rows, u64 n, double eps, u64 rms, u64 st),
     norm_stats_k<T>((const T*)x, rows, n, eps, rms, (T*)st))
BOTH(norm_apply, (u64 x, u64 rows, u64 n, u64 st, u64 w, u64 b, u64 has_w, u64 has_b, u64 y),
     norm_apply_k<T>((const T*)x, rows, n, (const T*)st, (const T*)w, (const T*)b, has_w, has_b,
                     (T*)y))
BOTH(norm_grad_input, (u64 x, u64 gy, u64 st, u64 rows, u64 n, u64 w, u64 has_w, u64 rms, u64 dx),
     norm_grad_input_k<T>((const T*)x, (const T*)gy, (const T*)st, rows, n, (const T*)w, has_w,
                          rms, (T*)dx))
BOTH(norm_grad_params, (u64 x, u64 gy, u64 st, u64 rows, u64 n, u64 has_w, u64 has_b, u64 dw,
                        u64 db),
     norm_grad_params_k<T>((const T*)x, (const T*)gy, (const T*)st, rows, n, has_w, has_b, (T*)dw,
                           (T*)db))
BOTH(attn_forward, (u64 q, u64 k, u64 v, u64 mask, AttnParams p, u64 o, u64 lse),
     attn_forward_k<T>((const T*)q, (const T*)k, (const T*)v, (const T*)mask, p, (T*)o, (T*)lse))
BOTH(attn_delta, (u64 go, u64 o, AttnParams p, u64 delta),
     attn_delta_k<T>((const T*)go, (const T*)o, p, (T*)delta))
BOTH(attn_dq, (u64 q, u64 k, u64 v, u64 mask, u64 go, u64 lse, u64 delta, AttnParams p, u64 dq),
     attn_dq_k<T>((const T*)q, (const T*)k, (const T*)v, (const T*)mask, (const T*)go,
                  (const T*)lse, (const T*)delta, p, (T*)dq))
BOTH(attn_dkdv, (u64 q, u64 k, u64 v, u64 mask, u64 go, u64 lse, u64 delta, AttnParams p, u64 dk,
                 u64 dv),
     attn_dkdv_k<T>((const T*)q, (const T*)k, (const T*)v, (const T*)mask, (const T*)go,
                    (const T*)lse, (const T*)delta, p, (T*)dk, (T*)dv))
