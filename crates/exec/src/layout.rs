//! Shapes, strides and the strided walk that every kernel over several operands uses.

/// Row-major (C-order) strides of a shape, in elements.
pub fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1usize; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// Number of elements, or `None` if it overflows `usize`.
pub fn numel(shape: &[usize]) -> Option<usize> {
    shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d))
}

/// The numpy broadcast of two shapes, or `None` if they do not broadcast.
pub fn broadcast_shapes(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let n = a.len().max(b.len());
    let mut out = vec![0; n];
    for i in 0..n {
        let da = if i + a.len() >= n {
            a[i + a.len() - n]
        } else {
            1
        };
        let db = if i + b.len() >= n {
            b[i + b.len() - n]
        } else {
            1
        };
        out[i] = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return None,
        };
    }
    Some(out)
}

/// Strides that read a contiguous tensor of shape `from` as if broadcast to `to` (0 on broadcast
/// dimensions). `from` must broadcast to `to`.
pub fn broadcast_strides(from: &[usize], to: &[usize]) -> Vec<usize> {
    let src = contiguous_strides(from);
    let off = to.len() - from.len();
    (0..to.len())
        .map(|i| {
            if i < off || from[i - off] == 1 {
                0
            } else {
                src[i - off]
            }
        })
        .collect()
}

/// Merges adjacent dimensions that are contiguous for every operand, so the innermost loop is as
/// long as possible. Returns the merged shape and strides.
pub fn coalesce<const N: usize>(
    shape: &[usize],
    strides: [&[usize]; N],
) -> (Vec<usize>, [Vec<usize>; N]) {
    let mut sh: Vec<usize> = Vec::with_capacity(shape.len());
    let mut st: [Vec<usize>; N] = std::array::from_fn(|_| Vec::with_capacity(shape.len()));
    for d in 0..shape.len() {
        if shape[d] == 1 {
            continue;
        }
        if let Some(&last) = sh.last() {
            let k = sh.len() - 1;
            if (0..N).all(|o| st[o][k] == strides[o][d] * shape[d]) {
                sh[k] = last * shape[d];
                for o in 0..N {
                    st[o][k] = strides[o][d];
                }
                continue;
            }
        }
        sh.push(shape[d]);
        for o in 0..N {
            st[o].push(strides[o][d]);
        }
    }
    (sh, st)
}

/// Calls `f(offsets, inner_len, inner_strides)` once per innermost row of `shape`, in row-major
/// order, with each operand's element offset of that row's start. Iterative (no recursion): an
/// odometer over the outer dimensions.
pub fn walk<const N: usize>(
    shape: &[usize],
    strides: [&[usize]; N],
    mut f: impl FnMut([usize; N], usize, [usize; N]),
) {
    let (shape, strides) = coalesce(shape, strides);
    if shape.contains(&0) {
        return;
    }
    if shape.is_empty() {
        f([0; N], 1, [0; N]);
        return;
    }
    let r = shape.len();
    let inner = shape[r - 1];
    let inner_st: [usize; N] = std::array::from_fn(|o| strides[o][r - 1]);
    let mut idx = vec![0usize; r - 1];
    let mut off = [0usize; N];
    loop {
        f(off, inner, inner_st);
        // odometer step over dims r-2 .. 0
        let mut d = r - 1;
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            idx[d] += 1;
            for o in 0..N {
                off[o] += strides[o][d];
            }
            if idx[d] < shape[d] {
                break;
            }
            for o in 0..N {
                off[o] -= strides[o][d] * shape[d];
            }
            idx[d] = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcasting_rules() {
        assert_eq!(broadcast_shapes(&[3, 1], &[4]), Some(vec![3, 4]));
        assert_eq!(broadcast_shapes(&[], &[2, 2]), Some(vec![2, 2]));
        assert_eq!(broadcast_shapes(&[2, 3], &[3, 2]), None);
        assert_eq!(broadcast_strides(&[3, 1], &[2, 3, 4]), vec![0, 1, 0]);
    }

    #[test]
    fn walk_visits_every_row_in_order() {
        let shape = [2, 3, 4];
        let s = contiguous_strides(&shape);
        let b = broadcast_strides(&[3, 1], &shape);
        let mut seen = Vec::new();
        walk(&shape, [&s, &b], |off, n, st| {
            for i in 0..n {
                seen.push((off[0] + i * st[0], off[1] + i * st[1]));
            }
        });
        assert_eq!(seen.len(), 24);
        for (k, (a, bb)) in seen.iter().enumerate() {
            assert_eq!(*a, k);
            assert_eq!(*bb, (k / 4) % 3);
        }
    }

    #[test]
    fn walk_scalar_and_empty() {
        let mut n = 0;
        walk::<1>(&[], [&[]], |_, len, _| n += len);
        assert_eq!(n, 1);
        let mut m = 0;
        walk::<1>(&[3, 0], [&[0, 1]], |_, len, _| m += len);
        assert_eq!(m, 0);
    }
}
