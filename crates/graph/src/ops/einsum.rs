//! `einsum` for one or two operands, as permutes, reshapes, sums and one batched matrix product.

use crate::error::{GraphError, Result};
use crate::{Graph, Tensor};

const OP: &str = "einsum";

fn bad(what: &'static str) -> GraphError {
    GraphError::BadArgument { op: OP, what }
}

/// The subscripts of `spec`: each operand's letters and the output's (implicit output: the
/// letters seen once, in alphabetical order, as numpy's).
fn parse(spec: &str, n: usize) -> Result<(Vec<Vec<char>>, Vec<char>)> {
    let spec: String = spec.chars().filter(|c| !c.is_whitespace()).collect();
    let (lhs, out) = match spec.split_once("->") {
        Some((l, r)) => (l.to_string(), Some(r.to_string())),
        None => (spec.clone(), None),
    };
    let inputs: Vec<Vec<char>> = lhs.split(',').map(|s| s.chars().collect()).collect();
    if inputs.len() != n {
        return Err(bad("the subscripts name a different number of operands"));
    }
    let letters = |s: &[char]| s.iter().all(|c| c.is_ascii_alphabetic());
    if !inputs.iter().all(|s| letters(s)) {
        return Err(bad("subscripts are letters (no ellipsis)"));
    }
    for s in &inputs {
        if (1..s.len()).any(|k| s[..k].contains(&s[k])) {
            return Err(bad(
                "a letter repeated within one operand (a diagonal) is not supported",
            ));
        }
    }
    let out: Vec<char> = match out {
        Some(o) => {
            let o: Vec<char> = o.chars().collect();
            if !letters(&o) {
                return Err(bad("subscripts are letters (no ellipsis)"));
            }
            if (1..o.len()).any(|k| o[..k].contains(&o[k])) {
                return Err(bad("a letter repeated in the output"));
            }
            if o.iter().any(|c| !inputs.iter().any(|s| s.contains(c))) {
                return Err(bad("an output letter names no input axis"));
            }
            o
        }
        None => {
            let mut once: Vec<char> = ('a'..='z')
                .chain('A'..='Z')
                .filter(|c| inputs.iter().flatten().filter(|x| *x == c).count() == 1)
                .collect();
            once.sort();
            once
        }
    };
    Ok((inputs, out))
}

/// `x` summed over the axes whose letters `keep` rejects, returning the letters left.
fn sum_out<'g>(
    x: Tensor<'g>,
    letters: &[char],
    keep: impl Fn(char) -> bool,
) -> Result<(Tensor<'g>, Vec<char>)> {
    let axes: Vec<isize> = (0..letters.len())
        .filter(|&k| !keep(letters[k]))
        .map(|k| k as isize)
        .collect();
    let left: Vec<char> = letters.iter().copied().filter(|&c| keep(c)).collect();
    if axes.is_empty() {
        return Ok((x, left));
    }
    Ok((x.sum_axes(&axes, false)?, left))
}

/// `x` with its axes (named by `from`) put in the order of `to`, a permutation of them.
fn arrange<'g>(x: Tensor<'g>, from: &[char], to: &[char]) -> Result<Tensor<'g>> {
    let perm: Vec<usize> = to
        .iter()
        .map(|c| {
            from.iter()
                .position(|f| f == c)
                .expect("invariant: a permutation")
        })
        .collect();
    if perm.iter().enumerate().all(|(k, &p)| k == p) {
        return Ok(x);
    }
    x.permute(&perm)
}

fn extent(x: &Tensor<'_>, letters: &[char], c: char) -> usize {
    let k = letters
        .iter()
        .position(|&l| l == c)
        .expect("invariant: a letter of x");
    x.shape()[k]
}

/// The subscripts of `spec` checked against operands of these shapes: their count, each
/// operand's rank, and the extents of each letter the two share.
fn checked(spec: &str, shapes: &[&[usize]]) -> Result<(Vec<Vec<char>>, Vec<char>)> {
    if !(1..=2).contains(&shapes.len()) {
        return Err(bad("one or two operands"));
    }
    let (inputs, out) = parse(spec, shapes.len())?;
    for (s, letters) in shapes.iter().zip(&inputs) {
        if s.len() != letters.len() {
            return Err(GraphError::ShapeMismatch {
                op: OP,
                lhs: s.to_vec(),
                rhs: vec![letters.len()],
            });
        }
    }
    if let [a, b] = shapes {
        let (sa, sb) = (&inputs[0], &inputs[1]);
        for (ka, c) in sa.iter().enumerate() {
            if let Some(kb) = sb.iter().position(|x| x == c) {
                if a[ka] != b[kb] {
                    return Err(GraphError::ShapeMismatch {
                        op: OP,
                        lhs: a.to_vec(),
                        rhs: b.to_vec(),
                    });
                }
            }
        }
    }
    Ok((inputs, out))
}

/// The shape [`Graph::einsum`] gives operands of these shapes, or the error it returns for
/// them (the same refusals, checked without a graph: what a program's shape rule asks).
///
/// ```
/// use arenagrad_graph::einsum_shape;
/// assert_eq!(einsum_shape("bij,bjk->bik", &[&[2, 3, 4], &[2, 4, 5]])?, [2, 3, 5]);
/// assert_eq!(einsum_shape("i,j", &[&[3], &[2]])?, [3, 2]);
/// assert!(einsum_shape("ij,jk->ik", &[&[2, 3], &[4, 5]]).is_err());
/// # Ok::<(), arenagrad_graph::GraphError>(())
/// ```
pub fn einsum_shape(spec: &str, shapes: &[&[usize]]) -> Result<Vec<usize>> {
    let (inputs, out) = checked(spec, shapes)?;
    Ok(out
        .iter()
        .map(|&c| {
            inputs
                .iter()
                .zip(shapes)
                .find_map(|(letters, s)| letters.iter().position(|&l| l == c).map(|k| s[k]))
                .expect("invariant: every output letter names an input axis")
        })
        .collect())
}

impl Graph {
    /// Einstein summation over one or two operands (PyTorch's `torch.einsum` for the forms
    /// that reduce to sums and one matrix product: `"ij,jk->ik"`, `"bhqd,bhkd->bhqk"`,
    /// `"i,i->"`, `"i,j->ij"`, `"ij->ji"`, `"ij->"`; without `->`, the output is the letters
    /// seen once, in alphabetical order). Each letter's extents must agree (1 does not
    /// broadcast); a letter repeated within one operand (a diagonal) and ellipses are refused.
    /// Built of permutes, reshapes, sums and a batched product, so the gradient comes with them.
    ///
    /// ```
    /// use arenagrad_graph::{DType, Graph};
    /// let g = Graph::new();
    /// let a = g.from_f64(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3], DType::F64)?;
    /// let b = g.from_f64(&[1.0, 0.0, 0.0, 1.0, 1.0, 1.0], &[3, 2], DType::F64)?;
    /// let y = g.einsum("ij,jk->ik", &[a, b])?;
    /// assert_eq!(y.to_vec::<f64>()?, a.matmul(b)?.to_vec::<f64>()?);
    /// assert_eq!(g.einsum("ij->j", &[a])?.to_vec::<f64>()?, [5.0, 7.0, 9.0]);
    /// # Ok::<(), arenagrad_graph::GraphError>(())
    /// ```
    pub fn einsum<'g>(&'g self, spec: &str, operands: &[Tensor<'g>]) -> Result<Tensor<'g>> {
        self.owns_all(OP, operands)?;
        let shapes = operands
            .iter()
            .map(|x| x.try_shape().map(|s| s.to_vec()))
            .collect::<Result<Vec<_>>>()?;
        let views: Vec<&[usize]> = shapes.iter().map(Vec::as_slice).collect();
        let (inputs, out) = checked(spec, &views)?;
        if operands.len() == 1 {
            let (x, left) = sum_out(operands[0], &inputs[0], |c| out.contains(&c))?;
            return arrange(x, &left, &out);
        }
        let (a, b) = (operands[0], operands[1]);
        let (sa, sb) = (&inputs[0], &inputs[1]);
        // A letter of one operand alone that the output drops is summed there first.
        let (a, sa) = sum_out(a, sa, |c| out.contains(&c) || sb.contains(&c))?;
        let (b, sb) = sum_out(b, sb, |c| out.contains(&c) || sa.contains(&c))?;
        let batch: Vec<char> = sa
            .iter()
            .copied()
            .filter(|c| sb.contains(c) && out.contains(c))
            .collect();
        let contracted: Vec<char> = sa
            .iter()
            .copied()
            .filter(|c| sb.contains(c) && !out.contains(c))
            .collect();
        let left: Vec<char> = sa.iter().copied().filter(|c| !sb.contains(c)).collect();
        let right: Vec<char> = sb.iter().copied().filter(|c| !sa.contains(c)).collect();
        let size = |x: &Tensor<'_>, s: &[char], of: &[char]| -> usize {
            of.iter().map(|&c| extent(x, s, c)).product()
        };
        let (nb, m, k, n) = (
            size(&a, &sa, &batch),
            size(&a, &sa, &left),
            size(&a, &sa, &contracted),
            size(&b, &sb, &right),
        );
        let order_a: Vec<char> = [&batch[..], &left, &contracted].concat();
        let order_b: Vec<char> = [&batch[..], &contracted, &right].concat();
        let a3 = arrange(a, &sa, &order_a)?.reshape(&[nb as isize, m as isize, k as isize])?;
        let b3 = arrange(b, &sb, &order_b)?.reshape(&[nb as isize, k as isize, n as isize])?;
        let mut dims: Vec<isize> = Vec::new();
        dims.extend(batch.iter().map(|&c| extent(&a, &sa, c) as isize));
        dims.extend(left.iter().map(|&c| extent(&a, &sa, c) as isize));
        dims.extend(right.iter().map(|&c| extent(&b, &sb, c) as isize));
        let y = a3.matmul(b3)?.reshape(&dims)?;
        let have: Vec<char> = [&batch[..], &left, &right].concat();
        arrange(y, &have, &out)
    }
}
