//! CPU kernels. Each takes plain slices and shapes; the graph has already checked that they agree.

pub mod attention;
pub mod bandwidth;
pub mod bf16;
pub mod cast;
pub mod chain_gemm;
pub mod conv;
pub mod conv_direct;
pub mod dropout;
pub mod elementwise;
pub mod fastmath;
pub mod lockstep;
pub mod matmul;
pub mod norm;
pub mod operand;
pub mod par;
pub mod reduce;
pub mod rnn;
pub mod shape;
pub mod thread_pool;
pub mod transpose;
pub mod wait;
pub mod wide;

pub use cast::{cast, Storage};
pub use conv::{
    col2im, col2im_batch, conv_gemm_forward, conv_input_grad, fold_products, im2col, im2col_batch,
    max_pool_indices, max_pool_indices_half, patch_products, put_add, put_into, take, take_par,
    ConvDims, PatchOut, PatchProduct, PatchWeightGrad, Window,
};
pub use elementwise::{binary, select, unary, unary_grad, unary_grad_in_place};
pub use matmul::{gemm, gemm_batched, BatchView, Gemm, MatView, Mnk};
pub use operand::{Operand, Strided};
pub use reduce::{
    cumsum, nll_mean, nll_mean_grad, reduce, softmax, softmax_grad, sum_row, ReduceOp,
};
pub use shape::{
    broadcast_to, broadcast_to_par, gather, index_add, index_add_par, index_select,
    index_select_par, narrow, permute, permute_par, place_along, scatter_add,
};
pub use wide::{prefetch, set_simd, simd, simd_available, wide, Simd};

/// Test data shared by the kernels' unit tests.
#[cfg(test)]
pub(crate) mod test_data {
    use crate::Float;

    /// `len` values in [−scale, scale) from a xorshift generator seeded with `seed`.
    pub(crate) fn values<T: Float>(len: usize, seed: u64, scale: f64) -> Vec<T> {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                T::from_f64(scale * ((x % 2001) as f64 / 1000.0 - 1.0))
            })
            .collect()
    }
}
