//! Owned host data: what outlives an iteration (parameters, values copied out, checkpoints).

use arenagrad_exec::{bf16, f16, Bool, DType, Storage};

use crate::error::{GraphError, Result};

/// Owned elements of one dtype.
#[derive(Debug, Clone, PartialEq)]
pub enum HostData {
    /// `f32` elements.
    F32(Vec<f32>),
    /// `f64` elements.
    F64(Vec<f64>),
    /// `bf16` elements.
    BF16(Vec<bf16>),
    /// `f16` elements.
    F16(Vec<f16>),
    /// `i64` elements.
    I64(Vec<i64>),
    /// `i32` elements.
    I32(Vec<i32>),
    /// `u8` elements.
    U8(Vec<u8>),
    /// Booleans.
    Bool(Vec<Bool>),
}

/// Runs `$body` with `$v` bound to the vector or slice inside a [`HostData`] or
/// [`HostDataMut`] of any dtype.
macro_rules! each_dtype {
    ($e:ident, $d:expr, $v:ident => $body:expr) => {
        match $d {
            $e::F32($v) => $body,
            $e::F64($v) => $body,
            $e::BF16($v) => $body,
            $e::F16($v) => $body,
            $e::I64($v) => $body,
            $e::I32($v) => $body,
            $e::U8($v) => $body,
            $e::Bool($v) => $body,
        }
    };
}

impl HostData {
    /// The dtype.
    pub fn dtype(&self) -> DType {
        match self {
            HostData::F32(_) => DType::F32,
            HostData::F64(_) => DType::F64,
            HostData::BF16(_) => DType::BF16,
            HostData::F16(_) => DType::F16,
            HostData::I64(_) => DType::I64,
            HostData::I32(_) => DType::I32,
            HostData::U8(_) => DType::U8,
            HostData::Bool(_) => DType::Bool,
        }
    }
    /// Number of elements.
    pub fn len(&self) -> usize {
        each_dtype!(HostData, self, v => v.len())
    }
    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// `n` zeros of `dtype`, or [`GraphError::OutOfMemory`] (naming `op` and `shape`) when the
    /// system cannot provide them: the memory is reserved fallibly, never aborting the process.
    pub fn zeros(op: &'static str, dtype: DType, n: usize, shape: &[usize]) -> Result<Self> {
        Self::filled(op, dtype, n, 0.0, shape)
    }
    /// `n` copies of `value` as `dtype`, reserved as [`HostData::zeros`] reserves.
    fn filled(
        op: &'static str,
        dtype: DType,
        n: usize,
        value: f64,
        shape: &[usize],
    ) -> Result<Self> {
        with_storage!(dtype, T, {
            // +0 (not −0) is the zero `calloc` gives.
            let data = if value.to_bits() == 0 {
                try_zeros(op, n, shape)?
            } else {
                try_filled(op, n, T::narrow(value), shape)?
            };
            Ok(T::into_host(data))
        })
    }
    /// Values converted from `f64` (rounded as [`Storage::narrow`] rounds).
    pub fn from_f64(dtype: DType, v: &[f64]) -> Self {
        with_storage!(dtype, T, {
            T::into_host(v.iter().map(|&x| T::narrow(x)).collect())
        })
    }
    /// All values widened to `f64`.
    pub fn to_f64_vec(&self) -> Vec<f64> {
        each_dtype!(HostData, self, v => v.iter().map(|&x| x.widen()).collect())
    }
    /// The elements converted to `dtype` (PyTorch's `.to(dtype)`: exact when widening, rounded
    /// to nearest even when narrowing); a copy even when the dtype is the same.
    /// [`GraphError::OutOfMemory`] naming `op` when the host cannot hold the copy.
    pub fn to_dtype(&self, op: &'static str, dtype: DType) -> Result<HostData> {
        let n = self.len();
        with_storage!(dtype, D, {
            // Zeros from `calloc` (untouched pages), faulted in by the threads that convert: a
            // large tensor (a checkpoint converted as it loads) in chunks across the default
            // threads, elementwise, so the same values on any number of them.
            let mut out = try_zeros(op, n, &[n])?;
            each_dtype!(HostData, self, v => crate::graph::update_in_chunks(&mut out, |at, o| {
                arenagrad_exec::cpu::cast(&v[at..at + o.len()], o, 1)
            }));
            Ok(D::into_host(out))
        })
    }
    /// The elements as `T`, if that is their dtype.
    pub fn as_slice<T: HostElem>(&self) -> Option<&[T]> {
        T::host_slice(self)
    }
    /// The elements as `T`, mutably, if that is their dtype.
    pub fn as_mut_slice<T: HostElem>(&mut self) -> Option<&mut [T]> {
        T::host_slice_mut(self)
    }
    /// The elements' bytes, each little-endian (what a safetensors file holds).
    pub fn to_le_bytes(&self) -> Vec<u8> {
        fn bytes<T: Storage>(v: &[T], out: &mut Vec<u8>, each: impl Fn(T, &mut Vec<u8>)) {
            out.reserve(std::mem::size_of_val(v));
            v.iter().for_each(|&x| each(x, out));
        }
        let mut out = Vec::new();
        match self {
            HostData::F32(v) => bytes(v, &mut out, |x, o| o.extend(x.to_le_bytes())),
            HostData::F64(v) => bytes(v, &mut out, |x, o| o.extend(x.to_le_bytes())),
            HostData::BF16(v) => bytes(v, &mut out, |x, o| o.extend(x.to_le_bytes())),
            HostData::F16(v) => bytes(v, &mut out, |x, o| o.extend(x.to_le_bytes())),
            HostData::I64(v) => bytes(v, &mut out, |x, o| o.extend(x.to_le_bytes())),
            HostData::I32(v) => bytes(v, &mut out, |x, o| o.extend(x.to_le_bytes())),
            HostData::U8(v) => out.extend_from_slice(v),
            HostData::Bool(v) => out.extend(v.iter().map(|b| u8::from(b.get()))),
        }
        out
    }
}

/// An empty vector with room for `n` elements, reserved fallibly: where the host cannot
/// provide them, [`GraphError::OutOfMemory`] naming `op` and the tensor's `shape` — every host
/// buffer of a tensor is reserved through here.
pub(crate) fn try_vec<T>(op: &'static str, shape: &[usize], n: usize) -> Result<Vec<T>> {
    let mut out = Vec::new();
    out.try_reserve_exact(n)
        .map_err(|_| GraphError::OutOfMemory {
            op,
            shape: shape.to_vec(),
            bytes: n.saturating_mul(std::mem::size_of::<T>()),
        })?;
    Ok(out)
}

/// `n` copies of `v` in memory reserved by [`try_vec`].
pub(crate) fn try_filled<T: Copy>(
    op: &'static str,
    n: usize,
    v: T,
    shape: &[usize],
) -> Result<Vec<T>> {
    let mut out = try_vec(op, shape, n)?;
    out.resize(n, v);
    Ok(out)
}

/// `n` zeros (`T::default()`, +0 for every storage type), from the allocator already zeroed
/// (`calloc`: a large block is fresh pages the system zeroes when first touched, so zeros that
/// are overwritten before they are read — a model about to load a checkpoint — cost no pass of
/// their own), fallibly: where the host cannot provide them, [`GraphError::OutOfMemory`] as
/// [`try_vec`] says it.
pub(crate) fn try_zeros<T: arenagrad_alloc::Pod>(
    op: &'static str,
    n: usize,
    shape: &[usize],
) -> Result<Vec<T>> {
    arenagrad_alloc::try_zeroed_vec(n).ok_or_else(|| GraphError::OutOfMemory {
        op,
        shape: shape.to_vec(),
        bytes: n.saturating_mul(std::mem::size_of::<T>()),
    })
}

/// A tensor's elements borrowed mutably: values can change, their number and dtype cannot (what
/// [`crate::Parameter::update`] and [`HostTensor::data_mut`] hand out).
#[derive(Debug, PartialEq)]
pub enum HostDataMut<'a> {
    /// `f32` elements.
    F32(&'a mut [f32]),
    /// `f64` elements.
    F64(&'a mut [f64]),
    /// `bf16` elements.
    BF16(&'a mut [bf16]),
    /// `f16` elements.
    F16(&'a mut [f16]),
    /// `i64` elements.
    I64(&'a mut [i64]),
    /// `i32` elements.
    I32(&'a mut [i32]),
    /// `u8` elements.
    U8(&'a mut [u8]),
    /// Booleans.
    Bool(&'a mut [Bool]),
}

impl<'a> HostDataMut<'a> {
    /// Borrows `d`'s elements.
    pub fn of(d: &'a mut HostData) -> Self {
        match d {
            HostData::F32(v) => HostDataMut::F32(v),
            HostData::F64(v) => HostDataMut::F64(v),
            HostData::BF16(v) => HostDataMut::BF16(v),
            HostData::F16(v) => HostDataMut::F16(v),
            HostData::I64(v) => HostDataMut::I64(v),
            HostData::I32(v) => HostDataMut::I32(v),
            HostData::U8(v) => HostDataMut::U8(v),
            HostData::Bool(v) => HostDataMut::Bool(v),
        }
    }
    /// The dtype.
    pub fn dtype(&self) -> DType {
        match self {
            HostDataMut::F32(_) => DType::F32,
            HostDataMut::F64(_) => DType::F64,
            HostDataMut::BF16(_) => DType::BF16,
            HostDataMut::F16(_) => DType::F16,
            HostDataMut::I64(_) => DType::I64,
            HostDataMut::I32(_) => DType::I32,
            HostDataMut::U8(_) => DType::U8,
            HostDataMut::Bool(_) => DType::Bool,
        }
    }
    /// Number of elements.
    pub fn len(&self) -> usize {
        each_dtype!(HostDataMut, self, v => v.len())
    }
    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The elements as `T`, if that is their dtype.
    pub fn as_mut_slice<T: HostElem>(&mut self) -> Option<&mut [T]> {
        T::host_slice_mut_of(self)
    }
}

/// Typed access into [`HostData`], implemented for every storage type (`f32`, `f64`, `bf16`,
/// `f16`, `i64`, `i32`, `u8`, [`Bool`]).
pub trait HostElem: Storage {
    /// Borrow as this type.
    fn host_slice(d: &HostData) -> Option<&[Self]>;
    /// Borrow mutably as this type.
    fn host_slice_mut(d: &mut HostData) -> Option<&mut [Self]>;
    /// Borrow a [`HostDataMut`]'s elements as this type.
    fn host_slice_mut_of<'a>(d: &'a mut HostDataMut<'_>) -> Option<&'a mut [Self]>;
    /// Wrap a vector.
    fn into_host(v: Vec<Self>) -> HostData;
}

macro_rules! host_elem {
    ($($t:ty => $variant:ident),*) => {$(
        impl HostElem for $t {
            fn host_slice(d: &HostData) -> Option<&[$t]> {
                match d {
                    HostData::$variant(v) => Some(v),
                    _ => None,
                }
            }
            fn host_slice_mut(d: &mut HostData) -> Option<&mut [$t]> {
                match d {
                    HostData::$variant(v) => Some(v),
                    _ => None,
                }
            }
            fn host_slice_mut_of<'a>(d: &'a mut HostDataMut<'_>) -> Option<&'a mut [$t]> {
                match d {
                    HostDataMut::$variant(v) => Some(v),
                    _ => None,
                }
            }
            fn into_host(v: Vec<$t>) -> HostData {
                HostData::$variant(v)
            }
        }
    )*};
}
host_elem!(f32 => F32, f64 => F64, bf16 => BF16, f16 => F16, i64 => I64, i32 => I32, u8 => U8, Bool => Bool);

/// A tensor's values owned on the host, outside any iteration.
///
/// Its shape and its number of elements always agree: the fields are private, every constructor
/// checks them, and mutable access ([`HostTensor::data_mut`], [`HostTensor::as_mut_slice`])
/// lends the elements as a slice, whose length cannot change.
///
/// ```compile_fail
/// // The fields are private: a shape without its elements cannot be built.
/// use arenagrad_graph::{HostData, HostTensor};
/// let t = HostTensor { shape: vec![5], data: HostData::F32(vec![1.0, 2.0]) };
/// ```
///
/// ```compile_fail
/// // An optimiser hook gets slices; it cannot swap in data of another length.
/// use arenagrad_graph::{HostData, HostTensor, Parameter};
/// let p = Parameter::new("w", HostTensor::zeros(&[256, 256], arenagrad_graph::DType::F32)?);
/// p.update(|v, _| *v = HostData::F32(vec![1.0]));
/// # Ok::<(), arenagrad_graph::GraphError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct HostTensor {
    shape: Vec<usize>,
    data: HostData,
}

impl HostTensor {
    /// A tensor from a vector and a shape; the lengths must agree.
    pub fn new<T: HostElem>(data: Vec<T>, shape: &[usize]) -> Result<Self> {
        Self::checked("HostTensor::new", T::into_host(data), shape)
    }
    /// A tensor from owned data of any dtype and a shape; the lengths must agree.
    pub fn from_data(data: HostData, shape: &[usize]) -> Result<Self> {
        Self::checked("HostTensor::from_data", data, shape)
    }
    /// Values converted from `f64` to `dtype`; the lengths must agree.
    pub fn from_f64(data: &[f64], shape: &[usize], dtype: DType) -> Result<Self> {
        Self::checked(
            "HostTensor::from_f64",
            HostData::from_f64(dtype, data),
            shape,
        )
    }
    pub(crate) fn checked(op: &'static str, data: HostData, shape: &[usize]) -> Result<Self> {
        let expected = crate::shape::checked_numel(op, shape)?;
        if expected != data.len() {
            return Err(GraphError::DataLength {
                op,
                shape: shape.to_vec(),
                expected,
                got: data.len(),
            });
        }
        Ok(HostTensor {
            shape: shape.to_vec(),
            data,
        })
    }
    /// Zeros; [`GraphError::OutOfMemory`] when the host cannot provide them.
    pub fn zeros(shape: &[usize], dtype: DType) -> Result<Self> {
        Self::filled("HostTensor::zeros", shape, 0.0, dtype)
    }
    /// Every element `value`; [`GraphError::OutOfMemory`] when the host cannot hold them.
    pub fn full(shape: &[usize], value: f64, dtype: DType) -> Result<Self> {
        Self::filled("HostTensor::full", shape, value, dtype)
    }
    fn filled(op: &'static str, shape: &[usize], value: f64, dtype: DType) -> Result<Self> {
        let n = crate::shape::checked_numel(op, shape)?;
        Ok(HostTensor {
            shape: shape.to_vec(),
            data: HostData::filled(op, dtype, n, value, shape)?,
        })
    }
    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }
    /// The elements, row-major.
    pub fn data(&self) -> &HostData {
        &self.data
    }
    /// The elements, mutably: values can change, their number cannot.
    pub fn data_mut(&mut self) -> HostDataMut<'_> {
        HostDataMut::of(&mut self.data)
    }
    /// The elements as `T`, if that is their dtype.
    pub fn as_slice<T: HostElem>(&self) -> Option<&[T]> {
        self.data.as_slice()
    }
    /// The elements as `T`, mutably, if that is their dtype.
    pub fn as_mut_slice<T: HostElem>(&mut self) -> Option<&mut [T]> {
        self.data.as_mut_slice()
    }
    /// The elements, giving up the shape.
    pub fn into_data(self) -> HostData {
        self.data
    }
    /// The shape and the elements.
    pub fn into_parts(self) -> (Vec<usize>, HostData) {
        (self.shape, self.data)
    }
    /// The dtype.
    pub fn dtype(&self) -> DType {
        self.data.dtype()
    }
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.data.len()
    }
    /// Values widened to `f64`.
    pub fn to_f64_vec(&self) -> Vec<f64> {
        self.data.to_f64_vec()
    }
    /// A copy converted to `dtype` (see [`HostData::to_dtype`]).
    pub fn to_dtype(&self, dtype: DType) -> Result<HostTensor> {
        Ok(HostTensor {
            shape: self.shape.clone(),
            data: self.data.to_dtype("HostTensor::to_dtype", dtype)?,
        })
    }
    /// The transpose of a matrix (`[r, c]` → `[c, r]`, the same dtype);
    /// [`GraphError::BadArgument`] for any other rank.
    ///
    /// ```
    /// use arenagrad_graph::HostTensor;
    /// let t = HostTensor::new(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])?;
    /// let u = t.transposed()?;
    /// assert_eq!(u.shape(), &[3, 2]);
    /// assert_eq!(u.as_slice::<f32>().unwrap(), &[1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
    /// # Ok::<(), arenagrad_graph::GraphError>(())
    /// ```
    pub fn transposed(&self) -> Result<HostTensor> {
        let &[r, c] = self.shape.as_slice() else {
            return Err(GraphError::BadArgument {
                op: "HostTensor::transposed",
                what: "only a matrix (a tensor of rank 2) has a transpose",
            });
        };
        fn flip<T: Copy>(v: &[T], r: usize, c: usize) -> Vec<T> {
            (0..c)
                .flat_map(|j| (0..r).map(move |i| v[i * c + j]))
                .collect()
        }
        let data = match &self.data {
            HostData::F32(v) => HostData::F32(flip(v, r, c)),
            HostData::F64(v) => HostData::F64(flip(v, r, c)),
            HostData::BF16(v) => HostData::BF16(flip(v, r, c)),
            HostData::F16(v) => HostData::F16(flip(v, r, c)),
            HostData::I64(v) => HostData::I64(flip(v, r, c)),
            HostData::I32(v) => HostData::I32(flip(v, r, c)),
            HostData::U8(v) => HostData::U8(flip(v, r, c)),
            HostData::Bool(v) => HostData::Bool(flip(v, r, c)),
        };
        Ok(HostTensor {
            shape: vec![c, r],
            data,
        })
    }
}
