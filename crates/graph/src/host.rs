//! Owned host data: what outlives an iteration (parameters, values copied out, checkpoints).

use arenagrad_exec::DType;

use crate::error::{GraphError, Result};

/// Owned elements of one dtype.
#[derive(Debug, Clone, PartialEq)]
pub enum HostData {
    /// `f32` elements.
    F32(Vec<f32>),
    /// `f64` elements.
    F64(Vec<f64>),
}

impl HostData {
    /// The dtype.
    pub fn dtype(&self) -> DType {
        match self {
            HostData::F32(_) => DType::F32,
            HostData::F64(_) => DType::F64,
        }
    }
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            HostData::F32(v) => v.len(),
            HostData::F64(v) => v.len(),
        }
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
        Ok(match dtype {
            DType::F32 => HostData::F32(try_filled(op, n, value as f32, shape)?),
            DType::F64 => HostData::F64(try_filled(op, n, value, shape)?),
        })
    }
    /// Values converted from `f64`.
    pub fn from_f64(dtype: DType, v: &[f64]) -> Self {
        match dtype {
            DType::F32 => HostData::F32(v.iter().map(|&x| x as f32).collect()),
            DType::F64 => HostData::F64(v.to_vec()),
        }
    }
    /// All values widened to `f64`.
    pub fn to_f64_vec(&self) -> Vec<f64> {
        match self {
            HostData::F32(v) => v.iter().map(|&x| f64::from(x)).collect(),
            HostData::F64(v) => v.clone(),
        }
    }
    /// The elements as `T`, if that is their dtype.
    pub fn as_slice<T: crate::Elem>(&self) -> Option<&[T]> {
        T::host_slice(self)
    }
    /// The elements as `T`, mutably, if that is their dtype.
    pub fn as_mut_slice<T: crate::Elem>(&mut self) -> Option<&mut [T]> {
        T::host_slice_mut(self)
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

/// A tensor's elements borrowed mutably: values can change, their number and dtype cannot (what
/// [`crate::Parameter::update`] and [`HostTensor::data_mut`] hand out).
#[derive(Debug, PartialEq)]
pub enum HostDataMut<'a> {
    /// `f32` elements.
    F32(&'a mut [f32]),
    /// `f64` elements.
    F64(&'a mut [f64]),
}

impl<'a> HostDataMut<'a> {
    /// Borrows `d`'s elements.
    pub fn of(d: &'a mut HostData) -> Self {
        match d {
            HostData::F32(v) => HostDataMut::F32(v),
            HostData::F64(v) => HostDataMut::F64(v),
        }
    }
    /// The dtype.
    pub fn dtype(&self) -> DType {
        match self {
            HostDataMut::F32(_) => DType::F32,
            HostDataMut::F64(_) => DType::F64,
        }
    }
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            HostDataMut::F32(v) => v.len(),
            HostDataMut::F64(v) => v.len(),
        }
    }
    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The elements as `T`, if that is their dtype.
    pub fn as_mut_slice<T: crate::Elem>(&mut self) -> Option<&mut [T]> {
        T::host_slice_mut_of(self)
    }
}

/// Typed access into [`HostData`], implemented for `f32` and `f64`.
pub trait HostElem: Sized {
    /// Borrow as this type.
    fn host_slice(d: &HostData) -> Option<&[Self]>;
    /// Borrow mutably as this type.
    fn host_slice_mut(d: &mut HostData) -> Option<&mut [Self]>;
    /// Borrow a [`HostDataMut`]'s elements as this type.
    fn host_slice_mut_of<'a>(d: &'a mut HostDataMut<'_>) -> Option<&'a mut [Self]>;
    /// Wrap a vector.
    fn into_host(v: Vec<Self>) -> HostData;
}

impl HostElem for f32 {
    fn host_slice(d: &HostData) -> Option<&[f32]> {
        match d {
            HostData::F32(v) => Some(v),
            HostData::F64(_) => None,
        }
    }
    fn host_slice_mut(d: &mut HostData) -> Option<&mut [f32]> {
        match d {
            HostData::F32(v) => Some(v),
            HostData::F64(_) => None,
        }
    }
    fn host_slice_mut_of<'a>(d: &'a mut HostDataMut<'_>) -> Option<&'a mut [f32]> {
        match d {
            HostDataMut::F32(v) => Some(v),
            HostDataMut::F64(_) => None,
        }
    }
    fn into_host(v: Vec<f32>) -> HostData {
        HostData::F32(v)
    }
}

impl HostElem for f64 {
    fn host_slice(d: &HostData) -> Option<&[f64]> {
        match d {
            HostData::F64(v) => Some(v),
            HostData::F32(_) => None,
        }
    }
    fn host_slice_mut(d: &mut HostData) -> Option<&mut [f64]> {
        match d {
            HostData::F64(v) => Some(v),
            HostData::F32(_) => None,
        }
    }
    fn host_slice_mut_of<'a>(d: &'a mut HostDataMut<'_>) -> Option<&'a mut [f64]> {
        match d {
            HostDataMut::F64(v) => Some(v),
            HostDataMut::F32(_) => None,
        }
    }
    fn into_host(v: Vec<f64>) -> HostData {
        HostData::F64(v)
    }
}

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
    pub fn new<T: crate::Elem>(data: Vec<T>, shape: &[usize]) -> Result<Self> {
        Self::checked("HostTensor::new", T::into_host(data), shape)
    }
    /// A tensor from owned data of either dtype and a shape; the lengths must agree.
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
    pub fn as_slice<T: crate::Elem>(&self) -> Option<&[T]> {
        self.data.as_slice()
    }
    /// The elements as `T`, mutably, if that is their dtype.
    pub fn as_mut_slice<T: crate::Elem>(&mut self) -> Option<&mut [T]> {
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
}
