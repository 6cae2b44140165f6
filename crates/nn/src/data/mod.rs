//! Data: the IDX format (MNIST's and Fashion-MNIST's files, gzipped or not) and shuffled
//! mini-batches of an image-classification dataset ([`Dataset`]), and tabular data — float
//! features with class labels, from CSV files among others — with a standardising transform
//! ([`TabularDataset`], [`Standardize`]); and text for byte-level language models, such as
//! Debian's fortune files, split by document ([`TextCorpus`]).
//!
//! ```
//! use arenagrad_nn::data::{Dataset, IdxArray, IdxData};
//! use arenagrad_nn::Rng;
//! // Four 2×2 images and their labels, as the IDX files would hold them.
//! let images = IdxArray { dims: vec![4, 2, 2], data: IdxData::U8((0..16).map(|v| v * 17).collect()) };
//! let labels = IdxArray { dims: vec![4], data: IdxData::U8(vec![0, 1, 2, 1]) };
//! let ds = Dataset::from_idx(images, labels)?;
//! let mut rng = Rng::seed(0);
//! let mut seen = 0;
//! for batch in ds.shuffled_batches(3, &mut rng)? {
//!     let (x, y) = batch?;
//!     assert_eq!(&x.shape()[1..], &[1, 2, 2]); // [B, 1, H, W], values in [0, 1]
//!     assert_eq!(x.shape()[0], y.len());
//!     seen += y.len();
//! }
//! assert_eq!(seen, 4);
//! # Ok::<(), arenagrad_nn::NnError>(())
//! ```

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use arenagrad_graph::HostTensor;
use flate2::bufread::GzDecoder;

use crate::error::{NnError, Result};
use crate::Rng;

mod tabular;
mod text;
#[cfg(feature = "csv")]
pub use tabular::{CsvOptions, LabelColumn};
pub use tabular::{Standardize, TabularDataset};
pub use text::{Split, TextCorpus};

/// A dataset that [`Batches`] draws from: numbered samples, gathered into one batch tensor and
/// its labels.
pub trait Samples {
    /// Number of samples.
    fn len(&self) -> usize;
    /// Whether there are no samples.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The samples `indices` (each below `len()`) as one tensor whose first dimension is the
    /// batch, and their labels.
    fn batch(&self, indices: &[usize]) -> Result<(HostTensor, Vec<usize>)>;
}

/// The elements of an IDX array, by the format's type code.
#[derive(Debug, Clone, PartialEq)]
pub enum IdxData {
    /// 0x08: unsigned bytes (MNIST's images and labels).
    U8(Vec<u8>),
    /// 0x09: signed bytes.
    I8(Vec<i8>),
    /// 0x0B: big-endian 16-bit integers.
    I16(Vec<i16>),
    /// 0x0C: big-endian 32-bit integers.
    I32(Vec<i32>),
    /// 0x0D: big-endian 32-bit floats.
    F32(Vec<f32>),
    /// 0x0E: big-endian 64-bit floats.
    F64(Vec<f64>),
}

impl IdxData {
    /// The format's type code.
    pub fn type_code(&self) -> u8 {
        match self {
            IdxData::U8(_) => 0x08,
            IdxData::I8(_) => 0x09,
            IdxData::I16(_) => 0x0B,
            IdxData::I32(_) => 0x0C,
            IdxData::F32(_) => 0x0D,
            IdxData::F64(_) => 0x0E,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            IdxData::U8(v) => v.len(),
            IdxData::I8(v) => v.len(),
            IdxData::I16(v) => v.len(),
            IdxData::I32(v) => v.len(),
            IdxData::F32(v) => v.len(),
            IdxData::F64(v) => v.len(),
        }
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn elem_size(code: u8) -> Option<usize> {
    Some(match code {
        0x08 | 0x09 => 1,
        0x0B => 2,
        0x0C | 0x0D => 4,
        0x0E => 8,
        _ => return None,
    })
}

/// An n-dimensional array read from (or written to) an IDX file.
#[derive(Debug, Clone, PartialEq)]
pub struct IdxArray {
    /// The dimensions, outermost first (`[60000, 28, 28]` for MNIST's training images).
    pub dims: Vec<usize>,
    /// The elements, row-major.
    pub data: IdxData,
}

/// Why a label of `usize::MAX` (at `what`) is refused: the class count, one more than the
/// largest label, would not fit (and wrapped to 0 classes).
pub(crate) fn no_class_count(what: &str) -> String {
    format!(
        "{what} is {}: one more than it, the number of classes, does not fit usize",
        usize::MAX
    )
}

/// An empty vector with room for `n` elements (a tensor of `shape`), reserved fallibly: where the
/// host cannot provide them, [`GraphError::OutOfMemory`](arenagrad_graph::GraphError) naming
/// `op` and `shape`, not an abort.
pub(crate) fn try_vec<T>(op: &'static str, shape: &[usize], n: usize) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n)
        .map_err(|_| arenagrad_graph::GraphError::OutOfMemory {
            op,
            shape: shape.to_vec(),
            bytes: n.saturating_mul(std::mem::size_of::<T>()),
        })?;
    Ok(v)
}

/// The gzip magic bytes.
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// Reads an IDX file, gunzipping it first if it starts with the gzip magic bytes.
pub fn read_idx(path: impl AsRef<Path>) -> Result<IdxArray> {
    let path = path.as_ref();
    let file = std::fs::File::open(path).map_err(|source| NnError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    read_idx_from(std::io::BufReader::new(file), path)
}

/// Parses IDX bytes (gzipped or not) held in memory.
pub fn parse_idx(bytes: &[u8]) -> Result<IdxArray> {
    read_idx_from(bytes, Path::new("<memory>"))
}

/// Reads an IDX array from any reader (gzipped or not); `path` only labels errors. The body is
/// read only as far as the header says, so a gzip bomb or trailing garbage cannot make it
/// allocate more than the header's dimensions; bytes past them make the file
/// [`NnError::IdxCorrupt`] (a file whose header and length disagree is not the array it claims),
/// and so do bytes after a gzipped file's member, as after a raw file.
pub fn read_idx_from(mut r: impl Read, path: &Path) -> Result<IdxArray> {
    let io_err = |source| NnError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut head = [0u8; 2];
    let got = read_up_to(&mut r, &mut head).map_err(io_err)?;
    let rest = (&head[..got]).chain(r);
    if got == 2 && head == GZIP_MAGIC {
        // The buffered decoder takes from the buffer only the member's bytes, so what follows
        // the member is still there to be found.
        let mut dec = GzDecoder::new(std::io::BufReader::new(rest));
        let corrupt = |e: NnError| match e {
            NnError::Io { path, source }
                if matches!(
                    source.kind(),
                    std::io::ErrorKind::InvalidData
                        | std::io::ErrorKind::InvalidInput
                        | std::io::ErrorKind::UnexpectedEof
                ) =>
            {
                NnError::IdxCorrupt {
                    path,
                    reason: source.to_string(),
                }
            }
            other => other,
        };
        let a = read_raw(&mut dec, path).map_err(corrupt)?;
        // Reading on to the end checks the gzip trailer (CRC-32 and length), so a file cut or
        // damaged there fails too. Data past the dimensions is counted only up to a bound.
        let mut sink = [0u8; 4096];
        let mut trailing = 0usize;
        while trailing < (1 << 20) {
            match dec.read(&mut sink) {
                Ok(0) => break,
                Ok(n) => trailing += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(source) => {
                    return Err(NnError::IdxCorrupt {
                        path: path.to_path_buf(),
                        reason: source.to_string(),
                    })
                }
            }
        }
        refuse_trailing(trailing, 1 << 20, path)?;
        // Bytes after the member are refused as bytes after a raw file are (a second member
        // too: the format holds one array).
        let mut probe = [0u8; 4096];
        let after = read_up_to(&mut dec.into_inner(), &mut probe).map_err(io_err)?;
        if after > 0 {
            return Err(NnError::IdxCorrupt {
                path: path.to_path_buf(),
                reason: format!(
                    "{}{after} bytes follow the gzip member",
                    if after >= probe.len() {
                        "at least "
                    } else {
                        ""
                    }
                ),
            });
        }
        Ok(a)
    } else {
        let mut rest = rest;
        let a = read_raw(&mut rest, path)?;
        let mut probe = [0u8; 4096];
        let trailing = read_up_to(&mut rest, &mut probe).map_err(io_err)?;
        refuse_trailing(trailing, probe.len(), path)?;
        Ok(a)
    }
}

/// Bytes past the header's dimensions (`trailing`, counted up to `bound`) are an error.
fn refuse_trailing(trailing: usize, bound: usize, path: &Path) -> Result<()> {
    if trailing == 0 {
        return Ok(());
    }
    Err(NnError::IdxCorrupt {
        path: path.to_path_buf(),
        reason: format!(
            "{}{trailing} bytes follow the data its header's dimensions describe",
            if trailing >= bound { "at least " } else { "" }
        ),
    })
}

/// Reads until `buf` is full or the input ends; returns the bytes read.
fn read_up_to(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

fn read_raw(mut r: impl Read, path: &Path) -> Result<IdxArray> {
    let p = || path.to_path_buf();
    let io_err = |source| NnError::Io { path: p(), source };
    let mut magic = [0u8; 4];
    let got = read_up_to(&mut r, &mut magic).map_err(io_err)?;
    if got < 4 || magic[0] != 0 || magic[1] != 0 || magic[3] == 0 {
        return Err(NnError::IdxMagic {
            path: p(),
            magic: magic[..got].to_vec(),
        });
    }
    let code = magic[2];
    let size = elem_size(code).ok_or(NnError::IdxType { path: p(), code })?;
    let ndim = magic[3] as usize;
    let mut dim_bytes = vec![0u8; 4 * ndim];
    let got = read_up_to(&mut r, &mut dim_bytes).map_err(io_err)?;
    if got < dim_bytes.len() {
        return Err(NnError::IdxTruncated {
            path: p(),
            expected: 4 + dim_bytes.len() as u64,
            got: 4 + got as u64,
        });
    }
    let dims64: Vec<u64> = dim_bytes
        .chunks_exact(4)
        .map(|c| u64::from(u32::from_be_bytes([c[0], c[1], c[2], c[3]])))
        .collect();
    let header = 4 + dim_bytes.len() as u64;
    let too_large = || NnError::IdxTooLarge {
        path: p(),
        dims: dims64.clone(),
    };
    let count = dims64
        .iter()
        .try_fold(1u64, |a, &d| a.checked_mul(d))
        .ok_or_else(too_large)?;
    let body_len = count.checked_mul(size as u64).ok_or_else(too_large)?;
    let body_len_usize = usize::try_from(body_len).map_err(|_| too_large())?;
    // Read in bounded steps, so a header claiming terabytes fails on the data, not on allocation.
    let mut body = Vec::with_capacity(body_len_usize.min(1 << 24));
    let read = r
        .by_ref()
        .take(body_len)
        .read_to_end(&mut body)
        .map_err(|e| match e.kind() {
            // A truncated gzip stream surfaces as an unexpected end of input.
            std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::InvalidInput => {
                NnError::IdxTruncated {
                    path: p(),
                    expected: header + body_len,
                    got: header + body.len() as u64,
                }
            }
            _ => io_err(e),
        })?;
    if (read as u64) < body_len {
        return Err(NnError::IdxTruncated {
            path: p(),
            expected: header + body_len,
            got: header + read as u64,
        });
    }
    let dims: Vec<usize> = dims64.iter().map(|&d| d as usize).collect();
    let data = match code {
        0x08 => IdxData::U8(body),
        0x09 => IdxData::I8(body.iter().map(|&b| b as i8).collect()),
        0x0B => IdxData::I16(
            body.chunks_exact(2)
                .map(|c| i16::from_be_bytes([c[0], c[1]]))
                .collect(),
        ),
        0x0C => IdxData::I32(
            body.chunks_exact(4)
                .map(|c| i32::from_be_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        ),
        0x0D => IdxData::F32(
            body.chunks_exact(4)
                .map(|c| f32::from_be_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        ),
        _ => IdxData::F64(
            body.chunks_exact(8)
                .map(|c| f64::from_be_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
                .collect(),
        ),
    };
    Ok(IdxArray { dims, data })
}

/// Encodes an IDX array (uncompressed, or gzipped with `gzip`).
pub fn encode_idx(a: &IdxArray, gzip: bool) -> Result<Vec<u8>> {
    let bad = |reason: String| NnError::BadData {
        what: "encode_idx",
        reason,
    };
    let count = a.dims.iter().try_fold(1usize, |x, &d| x.checked_mul(d));
    if count != Some(a.data.len()) {
        return Err(bad(format!(
            "{} elements for dimensions {:?}",
            a.data.len(),
            a.dims
        )));
    }
    if a.dims.len() > 255 || a.dims.iter().any(|&d| u32::try_from(d).is_err()) {
        return Err(bad(format!(
            "dimensions {:?} do not fit the format",
            a.dims
        )));
    }
    let mut out = vec![0, 0, a.data.type_code(), a.dims.len() as u8];
    for &d in &a.dims {
        out.extend((d as u32).to_be_bytes());
    }
    match &a.data {
        IdxData::U8(v) => out.extend_from_slice(v),
        IdxData::I8(v) => out.extend(v.iter().map(|&x| x as u8)),
        IdxData::I16(v) => out.extend(v.iter().flat_map(|x| x.to_be_bytes())),
        IdxData::I32(v) => out.extend(v.iter().flat_map(|x| x.to_be_bytes())),
        IdxData::F32(v) => out.extend(v.iter().flat_map(|x| x.to_be_bytes())),
        IdxData::F64(v) => out.extend(v.iter().flat_map(|x| x.to_be_bytes())),
    }
    if !gzip {
        return Ok(out);
    }
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    let gz = |source| NnError::Io {
        path: PathBuf::from("<memory>"),
        source,
    };
    enc.write_all(&out).map_err(gz)?;
    enc.finish().map_err(gz)
}

/// Writes an IDX file (gzipped with `gzip`), atomically.
pub fn write_idx(path: impl AsRef<Path>, a: &IdxArray, gzip: bool) -> Result<()> {
    let bytes = encode_idx(a, gzip)?;
    crate::files::write_atomic(path.as_ref(), &bytes, |f| f)
}

/// An image-classification dataset held in memory as bytes: `len` images of `sample_shape`
/// (`[1, H, W]` for grey images, `[C, H, W]` for colour) and a class label per image.
#[derive(Debug, Clone, PartialEq)]
pub struct Dataset {
    images: Vec<u8>,
    labels: Vec<usize>,
    sample_shape: Vec<usize>,
}

impl Dataset {
    /// A dataset from raw pixel bytes (row-major, one image after another) and labels.
    /// `sample_shape` is `[H, W]` (stored as `[1, H, W]`) or `[C, H, W]`.
    pub fn new(images: Vec<u8>, labels: Vec<usize>, sample_shape: &[usize]) -> Result<Self> {
        let bad = |reason: String| NnError::BadData {
            what: "Dataset",
            reason,
        };
        let sample_shape: Vec<usize> = match sample_shape.len() {
            2 => vec![1, sample_shape[0], sample_shape[1]],
            3 => sample_shape.to_vec(),
            _ => {
                return Err(bad(format!(
                    "sample shape {sample_shape:?} is neither [H, W] nor [C, H, W]"
                )))
            }
        };
        let per = sample_shape
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .ok_or_else(|| {
                bad(format!(
                    "sample shape {sample_shape:?}: its element count overflows usize"
                ))
            })?;
        if per == 0 || labels.len().checked_mul(per) != Some(images.len()) {
            return Err(bad(format!(
                "{} pixel bytes for {} labels of {sample_shape:?} images",
                images.len(),
                labels.len()
            )));
        }
        if let Some(k) = labels.iter().position(|&l| l == usize::MAX) {
            return Err(bad(no_class_count(&format!("label {k}"))));
        }
        Ok(Dataset {
            images,
            labels,
            sample_shape,
        })
    }

    /// A dataset from IDX arrays: images `u8 [N, H, W]` (or `[N, C, H, W]`), labels `u8 [N]`.
    pub fn from_idx(images: IdxArray, labels: IdxArray) -> Result<Self> {
        let bad = |reason: String| NnError::BadData {
            what: "Dataset",
            reason,
        };
        let IdxData::U8(pixels) = images.data else {
            return Err(bad(format!(
                "images must be unsigned bytes (type 0x08), got type 0x{:02x}",
                images.data.type_code()
            )));
        };
        let IdxData::U8(l) = labels.data else {
            return Err(bad(format!(
                "labels must be unsigned bytes (type 0x08), got type 0x{:02x}",
                labels.data.type_code()
            )));
        };
        if labels.dims.len() != 1 || !(3..=4).contains(&images.dims.len()) {
            return Err(bad(format!(
                "images {:?} and labels {:?} are not [N, H, W] (or [N, C, H, W]) and [N]",
                images.dims, labels.dims
            )));
        }
        if images.dims[0] != labels.dims[0] {
            return Err(bad(format!(
                "{} images but {} labels",
                images.dims[0], labels.dims[0]
            )));
        }
        Self::new(
            pixels,
            l.into_iter().map(usize::from).collect(),
            &images.dims[1..],
        )
    }

    /// Reads a pair of IDX files (MNIST's `…-images-idx3-ubyte[.gz]` and
    /// `…-labels-idx1-ubyte[.gz]`).
    pub fn from_idx_files(images: impl AsRef<Path>, labels: impl AsRef<Path>) -> Result<Self> {
        Self::from_idx(read_idx(images)?, read_idx(labels)?)
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether there are no samples.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// One sample's shape, `[C, H, W]`.
    pub fn sample_shape(&self) -> &[usize] {
        &self.sample_shape
    }

    /// The labels.
    pub fn labels(&self) -> &[usize] {
        &self.labels
    }

    /// One more than the largest label (0 when empty).
    pub fn num_classes(&self) -> usize {
        self.labels.iter().max().map_or(0, |m| {
            m.checked_add(1)
                .expect("invariant: a label of usize::MAX is refused by Dataset::new")
        })
    }

    /// The first `n` samples (all of them if there are fewer).
    pub fn take(&self, n: usize) -> Dataset {
        let n = n.min(self.len());
        let per: usize = self.sample_shape.iter().product();
        Dataset {
            images: self.images[..n * per].to_vec(),
            labels: self.labels[..n].to_vec(),
            sample_shape: self.sample_shape.clone(),
        }
    }

    /// The samples `indices` as images `f32 [B, C, H, W]` scaled to `[0, 1]` and their labels.
    pub fn batch(&self, indices: &[usize]) -> Result<(HostTensor, Vec<usize>)> {
        const OP: &str = "Dataset::batch";
        let (bytes, labels, shape) = self.samples(OP, indices)?;
        let mut x = try_vec(OP, &shape, bytes.len())?;
        x.extend(bytes.iter().map(|&b| f32::from(b) / 255.0));
        Ok((HostTensor::new(x, &shape)?, labels))
    }

    /// The samples `indices` as stored: images `u8 [B, C, H, W]` and labels `i64 [B]`, for a
    /// pipeline that converts on the graph (`to_dtype`, then scaling) and feeds the labels to
    /// ops that take index tensors ([`crate::loss::cross_entropy_by`]).
    ///
    /// ```
    /// use arenagrad_nn::data::Dataset;
    /// use arenagrad_nn::{DType, Graph};
    /// let d = Dataset::new(vec![0, 255, 51, 102], vec![3, 1], &[1, 1, 2])?;
    /// let (x, y) = d.batch_raw(&[1, 0])?;
    /// let g = Graph::new();
    /// // As `x.float() / 255` in PyTorch: the same values as `batch` gives.
    /// let x = g.from_host(&x)?.to_dtype(DType::F32)?.div(g.scalar(255.0, DType::F32)?)?;
    /// assert_eq!(x.to_vec::<f32>()?, [0.2, 0.4, 0.0, 1.0]);
    /// assert_eq!(d.batch(&[1, 0])?.0.as_slice::<f32>(), Some(&[0.2f32, 0.4, 0.0, 1.0][..]));
    /// assert_eq!(y.as_slice::<i64>(), Some(&[1i64, 3][..]));
    /// # Ok::<(), arenagrad_nn::NnError>(())
    /// ```
    pub fn batch_raw(&self, indices: &[usize]) -> Result<(HostTensor, HostTensor)> {
        let (bytes, labels, shape) = self.samples("Dataset::batch_raw", indices)?;
        let labels: Vec<i64> = labels.iter().map(|&l| l as i64).collect();
        Ok((
            HostTensor::new(bytes, &shape)?,
            HostTensor::new(labels, &[indices.len()])?,
        ))
    }

    /// The bytes and labels of the samples `indices`, and the batch's shape `[B, sample…]`.
    fn samples(
        &self,
        op: &'static str,
        indices: &[usize],
    ) -> Result<(Vec<u8>, Vec<usize>, Vec<usize>)> {
        let per: usize = self.sample_shape.iter().product();
        let mut shape = vec![indices.len()];
        shape.extend_from_slice(&self.sample_shape);
        let n = indices.len().checked_mul(per).ok_or_else(|| {
            arenagrad_graph::GraphError::TooLarge {
                op,
                shape: shape.clone(),
            }
        })?;
        let mut x: Vec<u8> = try_vec(op, &shape, n)?;
        let mut y: Vec<usize> = try_vec(op, &shape, indices.len())?;
        for &i in indices {
            if i >= self.len() {
                return Err(NnError::IndexOutOfRange {
                    op,
                    position: y.len(),
                    index: i,
                    bound: self.len(),
                });
            }
            x.extend_from_slice(&self.images[i * per..(i + 1) * per]);
            y.push(self.labels[i]);
        }
        Ok((x, y, shape))
    }

    /// Mini-batches in order (the last one smaller if `batch_size` does not divide the length).
    pub fn batches(&self, batch_size: usize) -> Result<Batches<'_>> {
        Batches::new(self, (0..self.len()).collect(), batch_size)
    }

    /// Mini-batches in an order shuffled by `rng` (a fresh order per call: call it once per
    /// epoch with the same generator, and a seed fixes every epoch's order).
    pub fn shuffled_batches(&self, batch_size: usize, rng: &mut Rng) -> Result<Batches<'_>> {
        Batches::new(self, rng.permutation(self.len())?, batch_size)
    }
}

impl Samples for Dataset {
    fn len(&self) -> usize {
        Dataset::len(self)
    }

    fn batch(&self, indices: &[usize]) -> Result<(HostTensor, Vec<usize>)> {
        Dataset::batch(self, indices)
    }
}

/// An iterator of mini-batches `(samples, labels)` over a dataset: for a [`Dataset`], images
/// `f32 [B, C, H, W]` in `[0, 1]`; for a [`TabularDataset`], features `[B, n_features]`. Each
/// item is the batch or the error gathering it (memory the host cannot provide, say): an error
/// is yielded where it happens, not taken for the end of the pass, and the pass goes on after it.
#[derive(Debug, Clone)]
pub struct Batches<'a, D: Samples + ?Sized = Dataset> {
    ds: &'a D,
    order: Vec<usize>,
    pos: usize,
    batch_size: usize,
    drop_last: bool,
}

impl<'a, D: Samples + ?Sized> Batches<'a, D> {
    fn new(ds: &'a D, order: Vec<usize>, batch_size: usize) -> Result<Self> {
        if batch_size == 0 {
            return Err(NnError::InvalidConfig {
                component: "Batches",
                reason: "batch_size must be positive".into(),
            });
        }
        Ok(Batches {
            ds,
            order,
            pos: 0,
            batch_size,
            drop_last: false,
        })
    }

    /// Skips a last batch smaller than the batch size (default: keep it).
    pub fn drop_last(mut self, drop: bool) -> Self {
        self.drop_last = drop;
        self
    }

    /// The sample order of this pass.
    pub fn order(&self) -> &[usize] {
        &self.order
    }

    fn remaining(&self) -> usize {
        let left = self.order.len() - self.pos;
        if self.drop_last {
            left / self.batch_size
        } else {
            left.div_ceil(self.batch_size)
        }
    }
}

impl<D: Samples + ?Sized> Iterator for Batches<'_, D> {
    type Item = Result<(HostTensor, Vec<usize>)>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.remaining() == 0 {
            return None;
        }
        let end = (self.pos + self.batch_size).min(self.order.len());
        let idx = &self.order[self.pos..end];
        self.pos = end;
        Some(self.ds.batch(idx))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.remaining();
        (n, Some(n))
    }
}

impl<D: Samples + ?Sized> ExactSizeIterator for Batches<'_, D> {}

#[cfg(test)]
mod tests {
    use super::*;

    /// Three samples of one value each; sample 1 cannot be read.
    struct OneBad;

    impl Samples for OneBad {
        fn len(&self) -> usize {
            3
        }
        fn batch(&self, indices: &[usize]) -> Result<(HostTensor, Vec<usize>)> {
            if indices.contains(&1) {
                return Err(NnError::BadData {
                    what: "OneBad",
                    reason: "sample 1 is unreadable".into(),
                });
            }
            let x: Vec<f32> = indices.iter().map(|&i| i as f32).collect();
            Ok((HostTensor::new(x, &[indices.len(), 1])?, indices.to_vec()))
        }
    }

    #[test]
    fn a_batch_that_fails_is_yielded_as_its_error_not_the_end() {
        let seen: Vec<_> = Batches::new(&OneBad, vec![0, 1, 2], 1).unwrap().collect();
        assert_eq!(seen.len(), 3);
        assert_eq!(seen[0].as_ref().unwrap().1, [0]);
        assert!(
            matches!(&seen[1], Err(NnError::BadData { what: "OneBad", .. })),
            "{:?}",
            seen[1]
        );
        assert_eq!(seen[2].as_ref().unwrap().1, [2]);
    }
}
