// The shared part of the CUDA backend's kernel source: types, per-type math, the grid-stride
// loop, dropout's hash and the macro that instantiates a kernel for f32 and f64. `kernel_source()`
// puts it after the generated definitions (`ops::cuda_defines()`), then `kernels.cu` and
// `fused.cu`; `tests/cuda_kernels_on_host.rs` compiles the definitions, it and `fused.cu` as host
// C++ to check the fused kernels against the CPU's.
//
// Compiled at run time by NVRTC (no headers: only NVRTC's built-in declarations are used), once
// per process and architecture. Every kernel exists as `<name>_f32` and `<name>_f64`, both
// instantiated from one template. Each one computes what the CPU kernel of the same name in
// `crates/exec/src/cpu` computes, element for element; only the order of floating-point
// additions in reductions may differ.
//
// The elementwise ops and reductions themselves are not written here: `kernel_source()`
// prepends the op tables' CUDA columns (crates/exec/src/ops, `cuda_defines`) as `#define`s — the
// op codes (`U_*`, `B_*`, `R_*`) and the `switch` cases UNARY_CASES, UNARY_GRAD_CASES,
// BINARY_CASES, REDUCE_IDENTITY_CASES and REDUCE_COMBINE_CASES used in kernels.cu. So are the
// numbers the kernels share with Rust: BLOCK (threads per block), MAX_DIMS (the most dimensions
// of a strided operand), the math constants and dropout's hash multipliers; no .cu file defines
// or spells them.
//
// Conventions, shared with `mod.rs`:
// * Device pointers, sizes and op codes are passed as 64-bit integers (`unsigned long long`),
//   scalar parameters as `double` (rounded to the element type here, as the CPU kernels do).
// * Shapes and strides travel by value in the parameter structs of kernels.cu and fused.cu, which mirror `#[repr(C)]` structs
//   on the host: every field is 64 bits wide, so the layouts agree without padding.
// * Launches use BLOCK-thread blocks; every loop over work items is a grid-stride loop, so any
//   grid size covers any amount of work.

typedef unsigned long long u64;
typedef long long i64;
typedef unsigned int u32;

// ---------------------------------------------------------------------------------------------
// Per-type helpers.

template <typename T> struct M;
template <> struct M<float> {
    static __device__ __forceinline__ float exp_(float x) {
        // The CPU's f32 exp saturates to +inf above 88.72.
        return x > 88.72f ? __int_as_float(0x7f800000) : expf(x);
    }
    static __device__ __forceinline__ float log_(float x) { return logf(x); }
    static __device__ __forceinline__ float log1p_(float x) { return log1pf(x); }
    static __device__ __forceinline__ float erf_(float x) { return erff(x); }
    static __device__ __forceinline__ float sqrt_(float x) { return sqrtf(x); }
    static __device__ __forceinline__ float abs_(float x) { return fabsf(x); }
    static __device__ __forceinline__ float sin_(float x) { return sinf(x); }
    static __device__ __forceinline__ float cos_(float x) { return cosf(x); }
    static __device__ __forceinline__ float tanh_(float x) { return tanhf(x); }
    static __device__ __forceinline__ float pow_(float x, float p) { return powf(x, p); }
    static __device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }
    static __device__ __forceinline__ float nan_() { return __int_as_float(0x7fffffff); }
};
template <> struct M<double> {
    static __device__ __forceinline__ double exp_(double x) { return exp(x); }
    static __device__ __forceinline__ double log_(double x) { return log(x); }
    static __device__ __forceinline__ double log1p_(double x) { return log1p(x); }
    static __device__ __forceinline__ double erf_(double x) { return erf(x); }
    static __device__ __forceinline__ double sqrt_(double x) { return sqrt(x); }
    static __device__ __forceinline__ double abs_(double x) { return fabs(x); }
    static __device__ __forceinline__ double sin_(double x) { return sin(x); }
    static __device__ __forceinline__ double cos_(double x) { return cos(x); }
    static __device__ __forceinline__ double tanh_(double x) { return tanh(x); }
    static __device__ __forceinline__ double pow_(double x, double p) { return pow(x, p); }
    static __device__ __forceinline__ double neg_inf() {
        return __longlong_as_double(0xfff0000000000000ULL);
    }
    static __device__ __forceinline__ double nan_() {
        return __longlong_as_double(0x7fffffffffffffffULL);
    }
};

// Larger of two, NaN-propagating exactly as `Float::max` on the CPU.
template <typename T> __device__ __forceinline__ T fmax_(T a, T b) {
    return (a >= b || a != a) ? a : b;
}
template <typename T> __device__ __forceinline__ T fmin_(T a, T b) {
    return (a <= b || a != a) ? a : b;
}

#define GRID_LOOP(i, n)                                                                        \
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < (u64)(n);                     \
         i += (u64)blockDim.x * gridDim.x)

// Dropout's keep decision for element `c` (cpu::dropout::keeps: two rounds of a 32-bit mixer
// over the counter and the seed, compared with ⌈p·2³²⌉). The multipliers DROPOUT_MIX_1,
// DROPOUT_MIX_2 and DROPOUT_HIGH_WORD are cpu::dropout's, prepended from Rust.
__device__ __forceinline__ unsigned int dropout_mix(unsigned int x) {
    x ^= x >> 16;
    x *= DROPOUT_MIX_1;
    x ^= x >> 15;
    x *= DROPOUT_MIX_2;
    return x ^ (x >> 16);
}

__device__ __forceinline__ bool dropout_keeps(u64 seed, u64 c, u64 threshold) {
    unsigned int lo = (unsigned int)c + (unsigned int)seed;
    unsigned int hi = (unsigned int)(seed >> 32) ^ ((unsigned int)(c >> 32) * DROPOUT_HIGH_WORD);
    return (u64)dropout_mix(dropout_mix(lo) ^ hi) >= threshold;
}

#define BOTH(NAME, PARAMS, CALL)                                                               \
    extern "C" __global__ void NAME##_f32 PARAMS {                                             \
        typedef float T;                                                                       \
        CALL;                                                                                  \
    }                                                                                          \
    extern "C" __global__ void NAME##_f64 PARAMS {                                             \
        typedef double T;                                                                      \
        CALL;                                                                                  \
    }

