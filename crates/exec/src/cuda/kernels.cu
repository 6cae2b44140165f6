// Kernels of arenagrad's CUDA backend (after `prelude.cu`).

// ---------------------------------------------------------------------------------------------
// Parameter structs (mirrored in mod.rs).

// A shape and the element strides of up to four operands over it.
struct Strided {
    i64 rank;
    i64 shape[MAX_DIMS];
    i64 st[4][MAX_DIMS];
};

// A reduction: the kept dimensions (their order is the output's) and the reduced ones, each with
// the input's strides.
struct ReduceParams {
    i64 kept_rank;
    i64 kept_shape[MAX_DIMS];
    i64 kept_stride[MAX_DIMS];
    i64 red_rank;
    i64 red_shape[MAX_DIMS];
    i64 red_stride[MAX_DIMS];
    u64 n_out;
    u64 n_red;
};

// A 2-D sliding window (cpu::Window) and its output size.
struct Win {
    i64 c, h, w, kh, kw, sh, sw, ph, pw, dh, dw, ho, wo;
};

__device__ __forceinline__ void atomic_add(float* p, float v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_add(double* p, double v) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 600
    atomicAdd(p, v);
#else
    // Before sm_60 there is no native double atomicAdd: compare-and-swap loop.
    u64* a = (u64*)p;
    u64 old = *a, assumed;
    do {
        assumed = old;
        old = atomicCAS(a, assumed, (u64)__double_as_longlong(v + __longlong_as_double((i64)assumed)));
    } while (assumed != old);
#endif
}

// x^p as PyTorch computes a scalar power (and as the host's ops::pow_scalar): x for 1, products
// for 2 and 3, reciprocals for -1 and -2, ±0.5 through the square root (so (-inf)^0.5 is NaN
// rather than pow's +inf), pow otherwise.
template <typename T> __device__ __forceinline__ T pow_scalar_(T x, double p) {
    if (p == 1.0) return x;
    if (p == 2.0) return x * x;
    if (p == 3.0) return x * x * x;
    if (p == -1.0) return (T)1 / x;
    if (p == -2.0) return (T)1 / (x * x);
    if (p == 0.5) return M<T>::sqrt_(x);
    if (p == -0.5) return (T)1 / M<T>::sqrt_(x);
    return M<T>::pow_(x, (T)p);
}

// Element offsets of the first N operands of `p` at linear (row-major) index i.
template <int N> __device__ __forceinline__ void decode(const Strided& p, u64 i, u64* off) {
    for (int k = 0; k < N; ++k) off[k] = 0;
    for (int d = (int)p.rank - 1; d >= 0; --d) {
        u64 ext = (u64)p.shape[d];
        u64 c = i % ext;
        i /= ext;
        for (int k = 0; k < N; ++k) off[k] += c * (u64)p.st[k][d];
    }
}

__device__ __forceinline__ u64 offset_of(i64 rank, const i64* shape, const i64* stride, u64 i) {
    u64 off = 0;
    for (int d = (int)rank - 1; d >= 0; --d) {
        u64 ext = (u64)shape[d];
        off += (i % ext) * (u64)stride[d];
        i /= ext;
    }
    return off;
}

// ---------------------------------------------------------------------------------------------
// Elementwise.

template <typename T> __device__ __forceinline__ void fill_k(T* out, u64 n, double v) {
    T x = (T)v;
    GRID_LOOP(i, n) out[i] = x;
}

template <typename T> __device__ __forceinline__ T sigmoid_(T x) {
    if (x >= (T)0) {
        return (T)1 / ((T)1 + M<T>::exp_(-x));
    }
    T e = M<T>::exp_(x);
    return e / ((T)1 + e);
}

// GELU's constants (FRAC_1_SQRT_2, FRAC_1_SQRT_2PI, SQRT_2_OVER_PI, GELU_C) are prepended from
// arenagrad_exec::ops, as the CPU's versions use them.
template <typename T> __device__ __forceinline__ T gelu_erf_(T x) {
    return (T)0.5 * x * ((T)1 + M<T>::erf_(x * (T)FRAC_1_SQRT_2));
}

template <typename T> __device__ __forceinline__ T gelu_erf_grad_(T x) {
    T cdf = (T)0.5 * ((T)1 + M<T>::erf_(x * (T)FRAC_1_SQRT_2));
    return cdf + x * (T)FRAC_1_SQRT_2PI * M<T>::exp_((T)-0.5 * x * x);
}

template <typename T> __device__ __forceinline__ T gelu_(T x) {
    const T c = (T)SQRT_2_OVER_PI;
    const T k = (T)GELU_C;
    T u = c * (x + k * x * x * x);
    return (T)0.5 * x * ((T)1 + M<T>::tanh_(u));
}

template <typename T> __device__ __forceinline__ T gelu_grad_(T x) {
    const T c = (T)SQRT_2_OVER_PI;
    const T k = (T)GELU_C;
    T t = M<T>::tanh_(c * (x + k * x * x * x));
    const T half = (T)0.5;
    return half * ((T)1 + t) + half * x * ((T)1 - t * t) * c * ((T)1 + (T)3.0 * k * x * x);
}

// The unary table's forward: `UNARY_CASES` (prepended from arenagrad_exec::ops) is one
// `case CODE: return (expr);` per row, in `x` and `p`.
template <typename T> __device__ __forceinline__ T unary_one(u64 op, T x, double p) {
    switch (op) {
    UNARY_CASES
    default: return M<T>::nan_();
    }
}

template <typename T>
__device__ __forceinline__ void unary_k(const T* x, T* out, u64 n, u64 op, double p) {
    GRID_LOOP(i, n) out[i] = unary_one<T>(op, x[i], p);
}

// The unary table's derivative g * op'(x), in `x`, `y` (the forward output), `g` and `p`.
template <typename T>
__device__ __forceinline__ T unary_grad_one(u64 op, T x, T y, T g, double p) {
    switch (op) {
    UNARY_GRAD_CASES
    default: return M<T>::nan_();
    }
}

template <typename T>
__device__ __forceinline__ void unary_grad_k(const T* x, const T* y, const T* gy, T* out, u64 n,
                                             u64 op, double p) {
    GRID_LOOP(i, n) out[i] = unary_grad_one<T>(op, x[i], y[i], gy[i], p);
}

// The binary table's function, in `a` and `b`.
template <typename T> __device__ __forceinline__ T binary_one(u64 op, T a, T b) {
    switch (op) {
    BINARY_CASES
    default: return M<T>::nan_();
    }
}

// out (contiguous, operand 0 of p) = op(a (operand 1), b (operand 2)).
template <typename T>
__device__ __forceinline__ void binary_k(const T* a, const T* b, T* out, u64 n, Strided p,
                                         u64 op) {
    GRID_LOOP(i, n) {
        u64 off[3];
        decode<3>(p, i, off);
        out[off[0]] = binary_one<T>(op, a[off[1]], b[off[2]]);
    }
}

// out (operand 0) = cond (1) != 0 ? a (2) : b (3).
template <typename T>
__device__ __forceinline__ void select_k(const T* cond, const T* a, const T* b, T* out, u64 n,
                                         Strided p) {
    GRID_LOOP(i, n) {
        u64 off[4];
        decode<4>(p, i, off);
        out[off[0]] = cond[off[1]] != (T)0 ? a[off[2]] : b[off[3]];
    }
}

// dst[dst_off + operand 1 offset] = src[src_off + operand 0 offset].
template <typename T>
__device__ __forceinline__ void copy_strided_k(const T* src, u64 src_off, T* dst, u64 dst_off,
                                               u64 n, Strided p) {
    GRID_LOOP(i, n) {
        u64 off[2];
        decode<2>(p, i, off);
        dst[dst_off + off[1]] = src[src_off + off[0]];
    }
}

// ---------------------------------------------------------------------------------------------
// Reductions.

// The reduction table's identity and step: `REDUCE_IDENTITY_CASES` and `REDUCE_COMBINE_CASES`
// (prepended from arenagrad_exec::ops) are one `case CODE: return (expr);` per row, the step in
// `acc` and `v`. A code without a row gives NaN.
template <typename T> __device__ __forceinline__ T reduce_init(u64 op) {
    switch (op) {
    REDUCE_IDENTITY_CASES
    default: return M<T>::nan_();
    }
}
template <typename T> __device__ __forceinline__ T reduce_combine(u64 op, T acc, T v) {
    switch (op) {
    REDUCE_COMBINE_CASES
    default: return M<T>::nan_();
    }
}

// Tree reduction of one value per thread over a BLOCK-thread block; every thread gets the
// result. `sh` is BLOCK elements of shared memory. Must be reached by every thread of the block.
template <typename T> __device__ __forceinline__ T block_reduce(u64 op, T v, T* sh) {
    sh[threadIdx.x] = v;
    __syncthreads();
    for (unsigned s = BLOCK / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) sh[threadIdx.x] = reduce_combine<T>(op, sh[threadIdx.x], sh[threadIdx.x + s]);
        __syncthreads();
    }
    T r = sh[0];
    __syncthreads();
    return r;
}

// One thread per output: a sequential loop over the reduced elements.
template <typename T>
__device__ __forceinline__ void reduce_thread_k(const T* x, T* out, ReduceParams p, u64 op) {
    GRID_LOOP(o, p.n_out) {
        u64 base = offset_of(p.kept_rank, p.kept_shape, p.kept_stride, o);
        T acc = reduce_init<T>(op);
        for (u64 r = 0; r < p.n_red; ++r) {
            acc = reduce_combine<T>(op, acc, x[base + offset_of(p.red_rank, p.red_shape, p.red_stride, r)]);
        }
        out[o] = acc;
    }
}

// One block per (output, chunk): the block reduces reduced elements [c·chunk, (c+1)·chunk) of
// output o into out[o·n_chunks + c]. With n_chunks = 1 this is the whole reduction; with more,
// `out` holds partial results that a second launch reduces.
template <typename T>
__device__ __forceinline__ void reduce_block_k(const T* x, T* out, ReduceParams p, u64 op,
                                               u64 chunk, u64 n_chunks, T* sh) {
    u64 total = p.n_out * n_chunks;
    for (u64 oc = blockIdx.x; oc < total; oc += gridDim.x) {
        u64 o = oc / n_chunks;
        u64 c = oc % n_chunks;
        u64 base = offset_of(p.kept_rank, p.kept_shape, p.kept_stride, o);
        u64 start = c * chunk;
        u64 end = start + chunk < p.n_red ? start + chunk : p.n_red;
        T acc = reduce_init<T>(op);
        for (u64 r = start + threadIdx.x; r < end; r += BLOCK) {
            acc = reduce_combine<T>(op, acc, x[base + offset_of(p.red_rank, p.red_shape, p.red_stride, r)]);
        }
        T total_v = block_reduce<T>(op, acc, sh);
        if (threadIdx.x == 0) out[oc] = total_v;
    }
}

// ---------------------------------------------------------------------------------------------
// Softmax along an axis of a tensor viewed as [outer, len, inner].

// The row maximum as cpu::softmax uses it (0 when every entry is -inf).
template <typename T> __device__ __forceinline__ T softmax_shift(T m) {
    return m == M<T>::neg_inf() ? (T)0 : m;
}

template <typename T>
__device__ __forceinline__ void softmax_thread_k(const T* x, T* out, u64 outer, u64 len, u64 inner,
                                                 u64 log_) {
    GRID_LOOP(row, outer * inner) {
        u64 o = row / inner, i = row % inner;
        u64 base = o * len * inner + i;
        T m = M<T>::neg_inf();
        for (u64 j = 0; j < len; ++j) m = fmax_(m, x[base + j * inner]);
        m = softmax_shift(m);
        T s = (T)0;
        for (u64 j = 0; j < len; ++j) {
            T e = M<T>::exp_(x[base + j * inner] - m);
            out[base + j * inner] = e;
            s += e;
        }
        if (log_) {
            // (v - m) - ln s: adding ln s to a large m first would round it away.
            T ls = M<T>::log_(s);
            for (u64 j = 0; j < len; ++j) out[base + j * inner] = (x[base + j * inner] - m) - ls;
        } else {
            T inv = (T)1 / s;
            for (u64 j = 0; j < len; ++j) out[base + j * inner] *= inv;
        }
    }
}

template <typename T>
__device__ __forceinline__ void softmax_block_k(const T* x, T* out, u64 outer, u64 len, u64 inner,
                                                u64 log_, T* sh) {
    for (u64 row = blockIdx.x; row < outer * inner; row += gridDim.x) {
        u64 o = row / inner, i = row % inner;
        u64 base = o * len * inner + i;
        T m = M<T>::neg_inf();
        for (u64 j = threadIdx.x; j < len; j += BLOCK) m = fmax_(m, x[base + j * inner]);
        m = softmax_shift(block_reduce<T>(R_MAX, m, sh));
        T s = (T)0;
        for (u64 j = threadIdx.x; j < len; j += BLOCK) s += M<T>::exp_(x[base + j * inner] - m);
        s = block_reduce<T>(R_SUM, s, sh);
        if (log_) {
            T ls = M<T>::log_(s);
            for (u64 j = threadIdx.x; j < len; j += BLOCK)
                out[base + j * inner] = (x[base + j * inner] - m) - ls;
        } else {
            T inv = (T)1 / s;
            for (u64 j = threadIdx.x; j < len; j += BLOCK)
                out[base + j * inner] = M<T>::exp_(x[base + j * inner] - m) * inv;
        }
    }
}

// softmax: out = y·(g - Σ g·y); log-softmax: out = g - e^y·Σ g.
template <typename T>
__device__ __forceinline__ void softmax_grad_thread_k(const T* y, const T* g, T* out, u64 outer,
                                                      u64 len, u64 inner, u64 log_) {
    GRID_LOOP(row, outer * inner) {
        u64 o = row / inner, i = row % inner;
        u64 base = o * len * inner + i;
        T s = (T)0;
        if (log_) {
            for (u64 j = 0; j < len; ++j) s += g[base + j * inner];
            for (u64 j = 0; j < len; ++j) {
                u64 at = base + j * inner;
                out[at] = g[at] - M<T>::exp_(y[at]) * s;
            }
        } else {
            for (u64 j = 0; j < len; ++j) s += g[base + j * inner] * y[base + j * inner];
            for (u64 j = 0; j < len; ++j) {
                u64 at = base + j * inner;
                out[at] = y[at] * (g[at] - s);
            }
        }
    }
}

template <typename T>
__device__ __forceinline__ void softmax_grad_block_k(const T* y, const T* g, T* out, u64 outer,
                                                     u64 len, u64 inner, u64 log_, T* sh) {
    for (u64 row = blockIdx.x; row < outer * inner; row += gridDim.x) {
        u64 o = row / inner, i = row % inner;
        u64 base = o * len * inner + i;
        T s = (T)0;
        for (u64 j = threadIdx.x; j < len; j += BLOCK) {
            u64 at = base + j * inner;
            s += log_ ? g[at] : g[at] * y[at];
        }
        s = block_reduce<T>(R_SUM, s, sh);
        for (u64 j = threadIdx.x; j < len; j += BLOCK) {
            u64 at = base + j * inner;
            out[at] = log_ ? g[at] - M<T>::exp_(y[at]) * s : y[at] * (g[at] - s);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Indexing. An index out of range reads as NaN and adds nothing.

// out [outer, n_idx, inner] = x [outer, axis_len, inner] at idx along the middle axis.
template <typename T>
__device__ __forceinline__ void index_select_k(const T* x, u64 outer, u64 axis_len, u64 inner,
                                               const u32* idx, u64 n_idx, T* out) {
    GRID_LOOP(i, outer * n_idx * inner) {
        u64 t = i % inner;
        u64 j = (i / inner) % n_idx;
        u64 o = i / (inner * n_idx);
        u64 k = idx[j];
        out[i] = k < axis_len ? x[(o * axis_len + k) * inner + t] : M<T>::nan_();
    }
}

// out[i] = x[i]·scale where element i is kept, else 0 (cpu::dropout::dropout).
template <typename T>
__device__ __forceinline__ void dropout_k(const T* x, u64 n, u64 seed, u64 threshold, double scale,
                                          T* out) {
    GRID_LOOP(i, n) {
        out[i] = dropout_keeps(seed, i, threshold) ? x[i] * (T)scale : (T)0;
    }
}

// Running sums along the middle axis of [outer, len, inner], one thread per line, in index
// order (from the end when `reverse`), as cpu::cumsum.
template <typename T>
__device__ __forceinline__ void cumsum_k(const T* x, u64 outer, u64 len, u64 inner, u64 reverse,
                                         T* out) {
    GRID_LOOP(i, outer * inner) {
        u64 t = i % inner;
        u64 o = i / inner;
        T acc = (T)0;
        for (u64 s = 0; s < len; ++s) {
            u64 k = reverse ? len - 1 - s : s;
            u64 at = (o * len + k) * inner + t;
            acc += x[at];
            out[at] = acc;
        }
    }
}

template <typename T>
__device__ __forceinline__ void index_add_k(const T* g, u64 outer, u64 n_idx, u64 inner,
                                            const u32* idx, u64 axis_len, T* out) {
    GRID_LOOP(i, outer * n_idx * inner) {
        u64 t = i % inner;
        u64 j = (i / inner) % n_idx;
        u64 o = i / (inner * n_idx);
        u64 k = idx[j];
        if (k < axis_len) atomic_add(&out[(o * axis_len + k) * inner + t], g[i]);
    }
}

// out[p] = x[(o·ext + idx[p])·inner + t] with p = (o·iext + j)·inner + t.
template <typename T>
__device__ __forceinline__ void gather_k(const T* x, u64 outer, u64 ext, u64 inner, const u32* idx,
                                         u64 iext, T* out) {
    GRID_LOOP(p, outer * iext * inner) {
        u64 t = p % inner;
        u64 o = p / (inner * iext);
        u64 k = idx[p];
        out[p] = k < ext ? x[(o * ext + k) * inner + t] : M<T>::nan_();
    }
}

template <typename T>
__device__ __forceinline__ void scatter_add_k(const T* g, u64 outer, u64 ext, u64 inner,
                                              const u32* idx, u64 iext, T* out) {
    GRID_LOOP(p, outer * iext * inner) {
        u64 t = p % inner;
        u64 o = p / (inner * iext);
        u64 k = idx[p];
        if (k < ext) atomic_add(&out[(o * ext + k) * inner + t], g[p]);
    }
}

template <typename T>
__device__ __forceinline__ void take_k(const T* x, u64 xn, const u32* idx, u64 n, T* out) {
    // An index past x reads NaN (as gather_k): a bad index must not fault the context.
    GRID_LOOP(i, n) {
        u64 j = idx[i];
        out[i] = j < xn ? x[j] : M<T>::nan_();
    }
}

template <typename T>
__device__ __forceinline__ void put_add_k(const T* g, const u32* idx, u64 n, T* out, u64 on) {
    // An index past out adds nothing.
    GRID_LOOP(i, n) {
        u64 j = idx[i];
        if (j < on) atomic_add(&out[j], g[i]);
    }
}

// ---------------------------------------------------------------------------------------------
// Convolution layout and pooling over a batch of [c, h, w] images.

// cols[b, row, col] (row = (c·kh + ki)·kw + kj, col = oh·wo + ow) = the input under that tap, 0 in
// the padding.
template <typename T> __device__ __forceinline__ void im2col_k(const T* x, u64 n, Win w, T* out) {
    u64 l = (u64)(w.ho * w.wo);
    u64 plen = (u64)(w.c * w.kh * w.kw);
    u64 img = (u64)(w.c * w.h * w.w);
    GRID_LOOP(i, n * plen * l) {
        u64 col = i % l;
        u64 row = (i / l) % plen;
        u64 b = i / (l * plen);
        i64 kj = (i64)(row % (u64)w.kw);
        i64 ki = (i64)((row / (u64)w.kw) % (u64)w.kh);
        i64 c = (i64)(row / (u64)(w.kw * w.kh));
        i64 oh = (i64)(col / (u64)w.wo);
        i64 ow = (i64)(col % (u64)w.wo);
        i64 ih = oh * w.sh + ki * w.dh - w.ph;
        i64 iw = ow * w.sw + kj * w.dw - w.pw;
        bool inside = ih >= 0 && ih < w.h && iw >= 0 && iw < w.w;
        out[i] = inside ? x[b * img + (u64)((c * w.h + ih) * w.w + iw)] : (T)0;
    }
}

// The adjoint, as a gather: each input element sums the columns that read it, taps in (ki, kj)
// order (the order in which cpu::col2im adds them), and is written, not accumulated.
template <typename T> __device__ __forceinline__ void col2im_k(const T* cols, u64 n, Win w, T* out) {
    u64 l = (u64)(w.ho * w.wo);
    u64 plen = (u64)(w.c * w.kh * w.kw);
    u64 img = (u64)(w.c * w.h * w.w);
    GRID_LOOP(i, n * img) {
        i64 iw = (i64)(i % (u64)w.w);
        i64 ih = (i64)((i / (u64)w.w) % (u64)w.h);
        i64 c = (i64)((i / (u64)(w.w * w.h)) % (u64)w.c);
        u64 b = i / img;
        const T* cb = cols + b * plen * l;
        T acc = (T)0;
        for (i64 ki = 0; ki < w.kh; ++ki) {
            i64 y = ih + w.ph - ki * w.dh;
            if (y < 0 || y % w.sh != 0) continue;
            i64 oh = y / w.sh;
            if (oh >= w.ho) continue;
            for (i64 kj = 0; kj < w.kw; ++kj) {
                i64 xx = iw + w.pw - kj * w.dw;
                if (xx < 0 || xx % w.sw != 0) continue;
                i64 ow = xx / w.sw;
                if (ow >= w.wo) continue;
                u64 row = (u64)((c * w.kh + ki) * w.kw + kj);
                acc += cb[row * l + (u64)(oh * w.wo + ow)];
            }
        }
        out[i] = acc;
    }
}

// idx[b, c, oh, ow] = flat index into x of the window's maximum, as cpu::max_pool_indices with
// base = b·c·h·w: without padding the first maximum wins and a NaN is taken whenever met (so the
// last NaN wins); with padding the first maximum and the first NaN win.
template <typename T>
__device__ __forceinline__ void max_pool_indices_k(const T* x, u64 n, Win w, u32* idx) {
    u64 img = (u64)(w.c * w.h * w.w);
    u64 per_img = (u64)(w.c * w.ho * w.wo);
    GRID_LOOP(i, n * per_img) {
        i64 ow = (i64)(i % (u64)w.wo);
        i64 oh = (i64)((i / (u64)w.wo) % (u64)w.ho);
        i64 c = (i64)((i / (u64)(w.wo * w.ho)) % (u64)w.c);
        u64 b = i / per_img;
        const T* xb = x + b * img;
        i64 bk = 0;
        if (w.ph == 0 && w.pw == 0) {
            i64 start = (c * w.h + oh * w.sh) * w.w + ow * w.sw;
            bk = start;
            T bv = xb[start];
            for (i64 ki = 0; ki < w.kh; ++ki) {
                i64 r = start + ki * w.dh * w.w;
                for (i64 kj = 0; kj < w.kw; ++kj) {
                    i64 k = r + kj * w.dw;
                    T v = xb[k];
                    bool take = (v > bv) || (v != v);
                    bv = take ? v : bv;
                    bk = take ? k : bk;
                }
            }
        } else {
            bool found = false;
            T bv = (T)0;
            for (i64 ki = 0; ki < w.kh; ++ki) {
                i64 ih = oh * w.sh + ki * w.dh - w.ph;
                if (ih < 0 || ih >= w.h) continue;
                for (i64 kj = 0; kj < w.kw; ++kj) {
                    i64 iw = ow * w.sw + kj * w.dw - w.pw;
                    if (iw < 0 || iw >= w.w) continue;
                    i64 k = (c * w.h + ih) * w.w + iw;
                    T v = xb[k];
                    bool better = !found || v > bv || (v != v && bv == bv);
                    if (better) {
                        found = true;
                        bv = v;
                        bk = k;
                    }
                }
            }
        }
        idx[i] = (u32)(b * img + (u64)bk);
    }
}

// ---------------------------------------------------------------------------------------------
// Entry points: one f32 and one f64 instance of each kernel.

#define SHARED __shared__ T sh[BLOCK]

BOTH(fill, (u64 out, u64 n, double v), fill_k<T>((T*)out, n, v))
BOTH(unary, (u64 x, u64 out, u64 n, u64 op, double p), unary_k<T>((const T*)x, (T*)out, n, op, p))
BOTH(unary_grad, (u64 x, u64 y, u64 gy, u64 out, u64 n, u64 op, double p),
     unary_grad_k<T>((const T*)x, (const T*)y, (const T*)gy, (T*)out, n, op, p))
BOTH(binary, (u64 a, u64 b, u64 out, u64 n, Strided p, u64 op),
     binary_k<T>((const T*)a, (const T*)b, (T*)out, n, p, op))
BOTH(select, (u64 cond, u64 a, u64 b, u64 out, u64 n, Strided p),
     select_k<T>((const T*)cond, (const T*)a, (const T*)b, (T*)out, n, p))
BOTH(copy_strided, (u64 src, u64 src_off, u64 dst, u64 dst_off, u64 n, Strided p),
     copy_strided_k<T>((const T*)src, src_off, (T*)dst, dst_off, n, p))
BOTH(reduce_thread, (u64 x, u64 out, ReduceParams p, u64 op),
     reduce_thread_k<T>((const T*)x, (T*)out, p, op))
BOTH(reduce_block, (u64 x, u64 out, ReduceParams p, u64 op, u64 chunk, u64 n_chunks),
     SHARED; reduce_block_k<T>((const T*)x, (T*)out, p, op, chunk, n_chunks, sh))
BOTH(softmax_thread, (u64 x, u64 out, u64 outer, u64 len, u64 inner, u64 log_),
     softmax_thread_k<T>((const T*)x, (T*)out, outer, len, inner, log_))
BOTH(softmax_block, (u64 x, u64 out, u64 outer, u64 len, u64 inner, u64 log_),
     SHARED; softmax_block_k<T>((const T*)x, (T*)out, outer, len, inner, log_, sh))
BOTH(softmax_grad_thread, (u64 y, u64 g, u64 out, u64 outer, u64 len, u64 inner, u64 log_),
     softmax_grad_thread_k<T>((const T*)y, (const T*)g, (T*)out, outer, len, inner, log_))
BOTH(softmax_grad_block, (u64 y, u64 g, u64 out, u64 outer, u64 len, u64 inner, u64 log_),
     SHARED; softmax_grad_block_k<T>((const T*)y, (const T*)g, (T*)out, outer, len, inner, log_, sh))
BOTH(index_select, (u64 x, u64 outer, u64 axis_len, u64 inner, u64 idx, u64 n_idx, u64 out),
     index_select_k<T>((const T*)x, outer, axis_len, inner, (const u32*)idx, n_idx, (T*)out))
BOTH(index_add, (u64 g, u64 outer, u64 n_idx, u64 inner, u64 idx, u64 axis_len, u64 out),
     index_add_k<T>((const T*)g, outer, n_idx, inner, (const u32*)idx, axis_len, (T*)out))
BOTH(gather, (u64 x, u64 outer, u64 ext, u64 inner, u64 idx, u64 iext, u64 out),
     gather_k<T>((const T*)x, outer, ext, inner, (const u32*)idx, iext, (T*)out))
BOTH(scatter_add, (u64 g, u64 outer, u64 ext, u64 inner, u64 idx, u64 iext, u64 out),
     scatter_add_k<T>((const T*)g, outer, ext, inner, (const u32*)idx, iext, (T*)out))
BOTH(take, (u64 x, u64 xn, u64 idx, u64 n, u64 out),
     take_k<T>((const T*)x, xn, (const u32*)idx, n, (T*)out))
BOTH(put_add, (u64 g, u64 idx, u64 n, u64 out, u64 on),
     put_add_k<T>((const T*)g, (const u32*)idx, n, (T*)out, on))
BOTH(im2col, (u64 x, u64 n, Win w, u64 out), im2col_k<T>((const T*)x, n, w, (T*)out))
BOTH(col2im, (u64 cols, u64 n, Win w, u64 out), col2im_k<T>((const T*)cols, n, w, (T*)out))
BOTH(max_pool_indices, (u64 x, u64 n, Win w, u64 idx),
     max_pool_indices_k<T>((const T*)x, n, w, (u32*)idx))
BOTH(dropout, (u64 x, u64 n, u64 seed, u64 threshold, double scale, u64 out),
     dropout_k<T>((const T*)x, n, seed, threshold, scale, (T*)out))
BOTH(cumsum, (u64 x, u64 outer, u64 len, u64 inner, u64 reverse, u64 out),
     cumsum_k<T>((const T*)x, outer, len, inner, reverse, (T*)out))
