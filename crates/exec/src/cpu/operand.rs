//! Kernel operands: a tensor's memory with the shape it holds, so that a kernel over several
//! tensors takes one argument per tensor instead of a buffer and a shape apiece.
//!
//! The memory is a type parameter: a slice (`&[T]`) for a host kernel's input, a mutable slice
//! for its output, a device pointer for a CUDA kernel's (the `cuda` feature's backend).

/// A tensor for a kernel: `data` holds its elements in row-major order, `shape` its extents (a
/// broadcasting kernel reads it through strides derived from the output's shape).
#[derive(Debug, Clone, Copy)]
pub struct Operand<'a, D> {
    /// The elements.
    pub data: D,
    /// The tensor's shape.
    pub shape: &'a [usize],
}

impl<'a, D> Operand<'a, D> {
    /// `data` as a tensor of `shape`.
    pub fn new(data: D, shape: &'a [usize]) -> Self {
        Operand { data, shape }
    }
}

/// A strided view of memory: element `i` of some shape is at `offset + Σ i_d·strides[d]` (in
/// elements; strides may be 0, so that several indices read one element).
#[derive(Debug, Clone, Copy)]
pub struct Strided<'a, D> {
    /// The memory.
    pub data: D,
    /// The element offset of index 0.
    pub offset: usize,
    /// The stride of each axis.
    pub strides: &'a [usize],
}

impl<'a, D> Strided<'a, D> {
    /// The view of `data` from `offset` with `strides`.
    pub fn new(data: D, offset: usize, strides: &'a [usize]) -> Self {
        Strided {
            data,
            offset,
            strides,
        }
    }
}
