//! The crate's error type.

use std::fmt;
use std::path::PathBuf;

use arenagrad_graph::{DType, GraphError};

/// One parameter or buffer whose shape in a checkpoint differs from the module's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShapeConflict {
    /// The hierarchical name (`0.weight`, `conv1.bias`).
    pub name: String,
    /// The module's shape.
    pub expected: Vec<usize>,
    /// The checkpoint's shape.
    pub found: Vec<usize>,
}

/// Everything that keeps a checkpoint from fitting a module, all listed at once.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StateMismatch {
    /// Names the module has and the checkpoint lacks.
    pub missing: Vec<String>,
    /// Names the checkpoint has and the module lacks.
    pub unexpected: Vec<String>,
    /// Names present in both with different shapes.
    pub shapes: Vec<ShapeConflict>,
}

impl StateMismatch {
    /// Whether nothing is wrong.
    pub fn is_empty(&self) -> bool {
        self.missing.is_empty() && self.unexpected.is_empty() && self.shapes.is_empty()
    }
}

impl fmt::Display for StateMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if !self.missing.is_empty() {
            parts.push(format!("missing {}", self.missing.join(", ")));
        }
        if !self.unexpected.is_empty() {
            parts.push(format!("unexpected {}", self.unexpected.join(", ")));
        }
        for s in &self.shapes {
            parts.push(format!(
                "{}: module has shape {:?}, checkpoint has {:?}",
                s.name, s.expected, s.found
            ));
        }
        f.write_str(&parts.join("; "))
    }
}

/// Everything that can go wrong in this crate. Variants carry the values involved, so a caller can
/// match on them and a message read from a log says what to fix.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NnError {
    /// A tensor op failed (shape, dtype, stale handle, allocation, ...).
    #[error(transparent)]
    Graph(#[from] GraphError),
    /// A layer, loss, optimiser or data option that makes no sense (zero features, a negative
    /// learning rate, groups that do not divide the channels, ...).
    #[error("{component}: {reason}")]
    InvalidConfig {
        /// The type or function given the option.
        component: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// An input whose shape the module or loss cannot take.
    #[error("{op}: expected input of shape {expected}, got {got:?}")]
    InputShape {
        /// The module or loss.
        op: &'static str,
        /// The accepted shapes, in words (`[N, C, H, W]`).
        expected: String,
        /// The shape given.
        got: Vec<usize>,
    },
    /// Tensors or parameters of a dtype other than the one needed.
    #[error("{op}: expected {expected}, got {got}")]
    DType {
        /// The operation.
        op: &'static str,
        /// The dtype needed.
        expected: DType,
        /// The dtype given.
        got: DType,
    },
    /// A class index (or embedding index) outside its range.
    #[error("{op}: index {index} at position {position} is out of range for {bound} entries")]
    IndexOutOfRange {
        /// The loss or module.
        op: &'static str,
        /// Where in the target list.
        position: usize,
        /// The offending index.
        index: usize,
        /// The number of classes (or rows).
        bound: usize,
    },
    /// A value that should be an index (a non-negative integer) is not.
    #[error("{op}: value {value} at position {position} is not a non-negative integer index")]
    NotAnIndex {
        /// The module.
        op: &'static str,
        /// Where in the tensor.
        position: usize,
        /// The value found.
        value: f64,
    },
    /// The number of targets does not match the number of predictions.
    #[error("{op}: {targets} targets for {predictions} predictions")]
    TargetCount {
        /// The loss.
        op: &'static str,
        /// Predictions (rows) in the input.
        predictions: usize,
        /// Targets given.
        targets: usize,
    },
    /// A file could not be read, written, synced or renamed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// A checkpoint that is not a valid safetensors file (truncated, corrupted header, offsets
    /// outside the file, ...).
    #[cfg(feature = "checkpoint")]
    #[error("{path}: not a valid safetensors checkpoint: {source}")]
    Safetensors {
        /// The file.
        path: PathBuf,
        /// The format library's error.
        #[source]
        source: safetensors::SafeTensorError,
    },
    /// A checkpoint whose tensor data does not match the checksum written with it.
    #[error("{path}: checksum mismatch (stored {stored:08x}, computed {computed:08x}): the file is corrupted")]
    Checksum {
        /// The file.
        path: PathBuf,
        /// The CRC-32 in the file's metadata.
        stored: u32,
        /// The CRC-32 of the data read.
        computed: u32,
    },
    /// A checkpoint whose metadata is malformed (for example an unreadable checksum).
    #[error("{path}: bad checkpoint metadata: {reason}")]
    Metadata {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A checkpoint tensor of an element type this crate does not hold (only F32 and F64).
    #[error("{path}: tensor {name} has unsupported dtype {dtype}")]
    UnsupportedDType {
        /// The file.
        path: PathBuf,
        /// The tensor's name.
        name: String,
        /// The dtype as the file names it.
        dtype: String,
    },
    /// A checkpoint whose names or shapes do not match the module's parameters and buffers.
    #[error("{path}: checkpoint does not match the module: {mismatch}")]
    StateMismatch {
        /// The file.
        path: PathBuf,
        /// Every missing, unexpected and mis-shaped name.
        mismatch: StateMismatch,
    },
    /// An IDX file whose first bytes are not an IDX (or gzip) magic number.
    #[error("{path}: not an IDX file (magic bytes {magic:02x?})")]
    IdxMagic {
        /// The file.
        path: PathBuf,
        /// The first bytes found (fewer than four if the file is shorter).
        magic: Vec<u8>,
    },
    /// An IDX file with an element-type code outside the format.
    #[error("{path}: IDX element type 0x{code:02x} is not defined by the format")]
    IdxType {
        /// The file.
        path: PathBuf,
        /// The code found.
        code: u8,
    },
    /// An IDX file shorter than its header says.
    #[error("{path}: IDX file truncated: {expected} bytes expected, {got} found")]
    IdxTruncated {
        /// The file.
        path: PathBuf,
        /// Bytes the header promises (header included).
        expected: u64,
        /// Bytes present.
        got: u64,
    },
    /// A gzipped IDX file whose compressed stream is damaged or cut short (bad deflate data, a
    /// CRC-32 or length mismatch in the gzip trailer).
    #[error("{path}: corrupt gzip stream: {reason}")]
    IdxCorrupt {
        /// The file.
        path: PathBuf,
        /// The decompressor's complaint.
        reason: String,
    },
    /// An IDX file whose dimensions overflow or are too large to hold.
    #[error("{path}: IDX dimensions {dims:?} are too large")]
    IdxTooLarge {
        /// The file.
        path: PathBuf,
        /// The dimensions in the header.
        dims: Vec<u64>,
    },
    /// A CSV file that cannot be read as a dataset: a field that is not a number, a row with a
    /// different number of fields, a missing label column.
    #[error("{path}:{line}: {reason}")]
    Csv {
        /// The file.
        path: PathBuf,
        /// The line (from 1; 0 where the reader could not tell).
        line: u64,
        /// What is wrong, naming the column.
        reason: String,
    },
    /// Data of the wrong kind for its use: an IDX array of labels that are not 1-D bytes, a
    /// binary cross-entropy's target outside `[0, 1]`.
    #[error("{what}: {reason}")]
    BadData {
        /// What was being built.
        what: &'static str,
        /// What is wrong.
        reason: String,
    },
}

/// The crate's result type.
pub type Result<T, E = NnError> = std::result::Result<T, E>;

/// Shorthand for [`NnError::InvalidConfig`].
pub(crate) fn config(component: &'static str, reason: impl Into<String>) -> NnError {
    NnError::InvalidConfig {
        component,
        reason: reason.into(),
    }
}

/// Shorthand for [`NnError::InputShape`].
pub(crate) fn input_shape(op: &'static str, expected: &str, got: &[usize]) -> NnError {
    NnError::InputShape {
        op,
        expected: expected.to_string(),
        got: got.to_vec(),
    }
}
