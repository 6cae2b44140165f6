//! CPU kernels. Each takes plain slices and shapes; the graph has already checked that they agree.

pub mod elementwise;
pub mod fastmath;
pub mod matmul;
pub mod par;
pub mod reduce;
pub mod shape;

pub use elementwise::{binary, select, unary, unary_grad};
pub use matmul::{gemm, Gemm, MatView};
pub use reduce::{reduce, softmax, softmax_grad, sum_row, ReduceOp};
pub use shape::{
    broadcast_to, gather, index_add, index_select, narrow, permute, place_along, scatter_add,
};
