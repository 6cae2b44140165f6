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
    /// `n` zeros of `dtype`.
    pub fn zeros(dtype: DType, n: usize) -> Self {
        match dtype {
            DType::F32 => HostData::F32(vec![0.0; n]),
            DType::F64 => HostData::F64(vec![0.0; n]),
        }
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

/// Typed access into [`HostData`], implemented for `f32` and `f64`.
pub trait HostElem: Sized {
    /// Borrow as this type.
    fn host_slice(d: &HostData) -> Option<&[Self]>;
    /// Borrow mutably as this type.
    fn host_slice_mut(d: &mut HostData) -> Option<&mut [Self]>;
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
    fn into_host(v: Vec<f64>) -> HostData {
        HostData::F64(v)
    }
}

/// A tensor's values owned on the host, outside any iteration.
#[derive(Debug, Clone, PartialEq)]
pub struct HostTensor {
    /// The shape.
    pub shape: Vec<usize>,
    /// The elements, row-major.
    pub data: HostData,
}

impl HostTensor {
    /// A tensor from a vector and a shape; the lengths must agree.
    pub fn new<T: crate::Elem>(data: Vec<T>, shape: &[usize]) -> Result<Self> {
        let expected = crate::shape::checked_numel("HostTensor::new", shape)?;
        if expected != data.len() {
            return Err(GraphError::DataLength {
                op: "HostTensor::new",
                shape: shape.to_vec(),
                expected,
                got: data.len(),
            });
        }
        Ok(HostTensor {
            shape: shape.to_vec(),
            data: T::into_host(data),
        })
    }
    /// Zeros.
    pub fn zeros(shape: &[usize], dtype: DType) -> Result<Self> {
        let n = crate::shape::checked_numel("HostTensor::zeros", shape)?;
        Ok(HostTensor {
            shape: shape.to_vec(),
            data: HostData::zeros(dtype, n),
        })
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
