//! Shape helpers shared by the ops.

use smallvec::SmallVec;

use crate::error::{GraphError, Result};

/// A tensor's extents; up to four dimensions live inline.
pub type Shape = SmallVec<[usize; 4]>;

/// Element count, or a typed error when it overflows or cannot be addressed.
///
/// Extents are also bounded as if zeros were ones, so that a zero-element tensor cannot carry
/// extents whose strides overflow.
pub fn checked_numel(op: &'static str, shape: &[usize]) -> Result<usize> {
    let strides_fit = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d.max(1)))
        .is_some_and(|b| b.checked_mul(8).is_some_and(|b| b <= isize::MAX as usize));
    match arenagrad_exec::layout::numel(shape) {
        Some(n) if strides_fit && n.checked_mul(8).is_some_and(|b| b <= isize::MAX as usize) => {
            Ok(n)
        }
        _ => Err(GraphError::TooLarge {
            op,
            shape: shape.to_vec(),
        }),
    }
}

/// Resolves a possibly negative axis against a rank.
pub fn norm_axis(op: &'static str, axis: isize, shape: &[usize]) -> Result<usize> {
    let r = shape.len() as isize;
    let a = if axis < 0 { axis + r } else { axis };
    if a < 0 || a >= r {
        return Err(GraphError::BadAxis {
            op,
            axis,
            shape: shape.to_vec(),
        });
    }
    Ok(a as usize)
}

/// Resolves a list of axes into a mask; an empty list means every axis.
pub fn axes_mask(op: &'static str, axes: &[isize], shape: &[usize]) -> Result<SmallVec<[bool; 4]>> {
    if axes.is_empty() {
        return Ok(smallvec::smallvec![true; shape.len()]);
    }
    let mut m: SmallVec<[bool; 4]> = smallvec::smallvec![false; shape.len()];
    for &a in axes {
        let a = norm_axis(op, a, shape)?;
        m[a] = true;
    }
    Ok(m)
}
