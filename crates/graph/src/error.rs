//! The graph's error type.

use arenagrad_exec::DType;

use crate::Device;

/// A shape as it appears in an error message.
pub type ShapeVec = Vec<usize>;

/// Everything that can go wrong building or differentiating a graph. Each variant names the op and
/// the shapes involved, so that a message read from a log says what to fix.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum GraphError {
    /// Two operands that must have equal (or broadcastable) shapes do not.
    #[error("{op}: shapes {lhs:?} and {rhs:?} do not broadcast")]
    ShapeMismatch {
        /// The op.
        op: &'static str,
        /// Left operand's shape.
        lhs: ShapeVec,
        /// Right operand's shape.
        rhs: ShapeVec,
    },
    /// Inner dimensions of a matrix product differ, or an operand is 0-D.
    #[error("{op}: cannot multiply {lhs:?} by {rhs:?}")]
    MatmulShape {
        /// The op.
        op: &'static str,
        /// Left operand's shape.
        lhs: ShapeVec,
        /// Right operand's shape.
        rhs: ShapeVec,
    },
    /// Operands of different element types.
    #[error("{op}: dtype mismatch, {lhs} vs {rhs}")]
    DTypeMismatch {
        /// The op.
        op: &'static str,
        /// Left operand's dtype.
        lhs: DType,
        /// Right operand's dtype.
        rhs: DType,
    },
    /// A gradient asked of an integer or boolean tensor (PyTorch: "only Tensors of floating
    /// point dtype can require gradients").
    #[error("{op}: {dtype} tensors carry no gradient (only floating dtypes do; cast with to_dtype first)")]
    NoGradDType {
        /// The op.
        op: &'static str,
        /// The dtype.
        dtype: DType,
    },
    /// A dtype the op does not take (on this device, or at all).
    #[error("{op}: {dtype} tensors are not supported here")]
    UnsupportedDType {
        /// The op.
        op: &'static str,
        /// The dtype refused.
        dtype: DType,
    },
    /// Operands on different devices.
    #[error("{op}: device mismatch, {lhs} vs {rhs}; move one with to_device")]
    DeviceMismatch {
        /// The op.
        op: &'static str,
        /// Left operand's device.
        lhs: Device,
        /// Right operand's device.
        rhs: Device,
    },
    /// Operands that belong to different graphs.
    #[error("{op}: operands belong to different graphs")]
    GraphMismatch {
        /// The op.
        op: &'static str,
    },
    /// A tensor handle or id from an ended iteration, from another graph, or freed.
    #[error("{op}: stale tensor handle (its iteration ended or it belongs to another graph)")]
    StaleTensor {
        /// The op.
        op: &'static str,
    },
    /// Backward reached a node whose graph was already consumed by an earlier backward.
    #[error(
        "backward: trying to backward through the graph a second time (node `{op}` was already \
         used by a backward pass); pass retain_graph = true to the first backward to keep it"
    )]
    GraphSpent {
        /// The op of the spent node.
        op: &'static str,
    },
    /// An axis out of range for the tensor's rank.
    #[error("{op}: axis {axis} is out of range for a tensor of shape {shape:?}")]
    BadAxis {
        /// The op.
        op: &'static str,
        /// The axis as given.
        axis: isize,
        /// The tensor's shape.
        shape: ShapeVec,
    },
    /// An axis listed twice (directly, or once counted from the end).
    #[error("{op}: axis {axis} appears more than once in the axes of a tensor of shape {shape:?}")]
    RepeatedAxis {
        /// The op.
        op: &'static str,
        /// The axis as given (its second appearance).
        axis: isize,
        /// The tensor's shape.
        shape: ShapeVec,
    },
    /// A permutation that is not one of the tensor's axes.
    #[error("{op}: {perm:?} is not a permutation of the axes of a tensor of shape {shape:?}")]
    BadPermutation {
        /// The op.
        op: &'static str,
        /// The permutation given.
        perm: Vec<usize>,
        /// The tensor's shape.
        shape: ShapeVec,
    },
    /// A reshape to a shape with another number of elements.
    #[error("{op}: cannot reshape {from:?} into {to:?}")]
    BadReshape {
        /// The op.
        op: &'static str,
        /// The tensor's shape.
        from: ShapeVec,
        /// The requested shape (`-1` shown as given).
        to: Vec<isize>,
    },
    /// A range outside an axis.
    #[error("{op}: range {start}..{end} is outside axis {axis} of shape {shape:?}")]
    BadRange {
        /// The op.
        op: &'static str,
        /// The axis.
        axis: usize,
        /// Range start.
        start: usize,
        /// Range end.
        end: usize,
        /// The tensor's shape.
        shape: ShapeVec,
    },
    /// An index outside an axis.
    #[error("{op}: index {index} is out of range for axis {axis} of shape {shape:?}")]
    IndexOutOfRange {
        /// The op.
        op: &'static str,
        /// The offending index.
        index: usize,
        /// The axis.
        axis: usize,
        /// The tensor's shape.
        shape: ShapeVec,
    },
    /// The number of values does not match the shape.
    #[error("{op}: {got} values given for shape {shape:?} ({expected} elements)")]
    DataLength {
        /// The op.
        op: &'static str,
        /// The shape.
        shape: ShapeVec,
        /// Elements the shape holds.
        expected: usize,
        /// Values given.
        got: usize,
    },
    /// A shape whose element count or byte size overflows, or cannot be allocated.
    #[error("{op}: a tensor of shape {shape:?} is too large")]
    TooLarge {
        /// The op.
        op: &'static str,
        /// The shape.
        shape: ShapeVec,
    },
    /// Host memory for a tensor could not be reserved (the system refused the allocation).
    #[error("{op}: out of memory reserving {bytes} bytes for a tensor of shape {shape:?}")]
    OutOfMemory {
        /// The op.
        op: &'static str,
        /// The shape.
        shape: ShapeVec,
        /// Bytes asked for.
        bytes: usize,
    },
    /// An op that needs a scalar got something else.
    #[error("{op}: expected a single-element tensor, got shape {shape:?}")]
    NotScalar {
        /// The op.
        op: &'static str,
        /// The shape.
        shape: ShapeVec,
    },
    /// Backward from a tensor that does not require grad.
    #[error("backward: the tensor does not require grad and has no grad_fn")]
    NoGradFn,
    /// `requires_grad` on a tensor that is not a leaf.
    #[error("{op}: only leaf tensors can change requires_grad")]
    NotLeaf {
        /// The op.
        op: &'static str,
    },
    /// An operand list that must not be empty was empty, or lists of mismatched ranks.
    #[error("{op}: {what}")]
    BadArgument {
        /// The op.
        op: &'static str,
        /// What was wrong, in words fixed at compile time.
        what: &'static str,
    },
    /// The requested device is not available.
    #[error("no CUDA device is available (ordinal {ordinal}): {reason}")]
    NoCudaDevice {
        /// The ordinal asked for.
        ordinal: usize,
        /// Why.
        reason: String,
    },
    /// A device (CUDA) call failed.
    #[error("{op}: device error: {msg}")]
    Device {
        /// The op.
        op: &'static str,
        /// The driver's or library's message.
        msg: String,
    },
    /// The element type is wrong for a read (for example `to_vec::<f32>` of an f64 tensor).
    #[error("{op}: tensor holds {stored}, read as {requested}")]
    WrongDType {
        /// The op.
        op: &'static str,
        /// Stored type.
        stored: DType,
        /// Requested type.
        requested: DType,
    },
    /// A checkpointed block's code failed with an error of its own (a layer library's, say).
    #[error("checkpoint: the block failed: {msg}")]
    Checkpoint {
        /// The block's error, in words.
        msg: String,
    },
    /// An allocation failed.
    #[error("{op}: {source}")]
    Alloc {
        /// The op.
        op: &'static str,
        /// The memory layer's error.
        source: arenagrad_alloc::AllocError,
    },
}

/// The graph's result type.
pub type Result<T, E = GraphError> = std::result::Result<T, E>;
