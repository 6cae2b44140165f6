//! Shape helpers shared by the ops.

use smallvec::SmallVec;

use crate::error::{GraphError, Result};

/// A tensor's extents; up to four dimensions live inline.
pub type Shape = SmallVec<[usize; 4]>;

/// A copy of `s`. Shapes of up to four axes are copied as four words, with no call to `memcpy`
/// (which a copy of a variable length becomes, and which a tiny op's whole budget notices).
#[inline(always)]
pub fn copy_of(s: &[usize]) -> Shape {
    copy_and_numel(s).0
}

/// [`copy_of`] and the element count of `s` (the product of its extents, 1 for a scalar),
/// computed from the same four words. The caller has checked the count before (`s` is a
/// tensor's shape), so the product cannot overflow.
#[inline(always)]
pub fn copy_and_numel(s: &[usize]) -> (Shape, usize) {
    if s.len() <= 4 {
        let at = |k: usize| s.get(k).copied().unwrap_or(0);
        // `take(4)` bounds the loop so that it unrolls (19 instructions an op fewer than the
        // unbounded fold).
        let n = s.iter().take(4).fold(1usize, |p, &d| p.wrapping_mul(d));
        (
            Shape::from_buf_and_len([at(0), at(1), at(2), at(3)], s.len()),
            n,
        )
    } else {
        (Shape::from_slice(s), s.iter().product())
    }
}

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
    for &given in axes {
        let a = norm_axis(op, given, shape)?;
        if m[a] {
            // `[0, 0]` or `[1, -1]`: PyTorch refuses a dimension listed twice.
            return Err(GraphError::RepeatedAxis {
                op,
                axis: given,
                shape: shape.to_vec(),
            });
        }
        m[a] = true;
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    #[test]
    fn copy_of_copies_every_rank() {
        let dims = [3usize, 1, 4, 1, 5, 9];
        for r in 0..=dims.len() {
            let c = super::copy_of(&dims[..r]);
            assert_eq!(c.as_slice(), &dims[..r]);
            assert_eq!(c.spilled(), r > 4);
        }
    }
}
