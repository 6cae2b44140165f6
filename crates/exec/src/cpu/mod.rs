//! CPU kernels. Each takes plain slices and shapes; the graph has already checked that they agree.

pub mod attention;
pub mod chain_gemm;
pub mod conv;
pub mod dropout;
pub mod elementwise;
pub mod fastmath;
pub mod lockstep;
pub mod matmul;
pub mod norm;
pub mod par;
pub mod reduce;
pub mod rnn;
pub mod shape;
pub mod thread_pool;
pub mod transpose;
pub mod wide;

pub use conv::{
    col2im, col2im_batch, conv_gemm_forward, im2col, im2col_batch, max_pool_indices, put_add,
    put_into, take, take_par, ConvDims, Window,
};
pub use elementwise::{binary, select, unary, unary_grad, unary_grad_in_place};
pub use matmul::{gemm, gemm_batched, Gemm, MatView};
pub use reduce::{
    cumsum, nll_mean, nll_mean_grad, reduce, softmax, softmax_grad, sum_row, ReduceOp,
};
pub use shape::{
    broadcast_to, gather, index_add, index_select, narrow, permute, permute_par, place_along,
    scatter_add,
};
pub use wide::{prefetch, set_simd, simd, simd_available, wide, Simd};
