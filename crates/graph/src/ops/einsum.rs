//! `einsum`, as diagonals, permutes, reshapes, broadcasts, sums and batched matrix products (one
//! for each operand after the first, left to right).

use crate::error::{GraphError, Result};
use crate::{Graph, Tensor};

const OP: &str = "einsum";

fn bad(what: &'static str) -> GraphError {
    GraphError::BadArgument { op: OP, what }
}

/// One operand's (or the output's) subscripts as written: its letters, and where among them an
/// ellipsis (`...`) stands, if it has one.
struct Written {
    letters: Vec<char>,
    ellipsis: Option<usize>,
}

/// The subscripts `s` of one operand or of the output: letters and at most one `...`.
fn written(s: &str) -> Result<Written> {
    let (letters, ellipsis) = match s.find('.') {
        None => (s.to_string(), None),
        Some(k) => {
            let rest = &s[k..];
            if !rest.starts_with("...") || rest[3..].contains('.') {
                return Err(bad(
                    "a `.` that is not part of one ellipsis (`...`, at most one per operand)",
                ));
            }
            (
                format!("{}{}", &s[..k], &rest[3..]),
                Some(s[..k].chars().count()),
            )
        }
    };
    let letters: Vec<char> = letters.chars().collect();
    if !letters.iter().all(|c| c.is_ascii_alphabetic()) {
        return Err(bad("subscripts are letters and one ellipsis (`...`)"));
    }
    Ok(Written { letters, ellipsis })
}

/// The label of the `k`-th of the dimensions the ellipses stand for (counted from the left of
/// their broadcast shape): a character no subscript can be.
fn ellipsis_label(k: usize) -> char {
    char::from_u32(0xE000 + k as u32)
        .expect("invariant: a private-use character for each ellipsis axis")
}

/// The subscripts of `spec` against operands of these shapes: each operand's labels, one per
/// axis (an ellipsis's axes labelled by where they fall in the ellipses' broadcast shape, right
/// aligned as numpy broadcasts), the output's labels, and each label's extent (a shared
/// label's extents broadcast: equal, or 1). Without `->`, the output is the ellipsis's axes,
/// then the letters seen once, in alphabetical order, as numpy's and PyTorch's.
fn checked(spec: &str, shapes: &[&[usize]]) -> Result<Parsed> {
    if shapes.is_empty() {
        return Err(bad("at least one operand"));
    }
    let spec: String = spec.chars().filter(|c| !c.is_whitespace()).collect();
    let (lhs, out) = match spec.split_once("->") {
        Some((l, r)) => (l, Some(r)),
        None => (spec.as_str(), None),
    };
    let written_in = lhs.split(',').map(written).collect::<Result<Vec<_>>>()?;
    if written_in.len() != shapes.len() {
        return Err(bad("the subscripts name a different number of operands"));
    }
    // How many axes each operand's ellipsis stands for; a rank that the letters do not match
    // (fewer axes than letters, or other than them without an ellipsis) is refused.
    let mut spans = Vec::with_capacity(shapes.len());
    for (w, s) in written_in.iter().zip(shapes) {
        let m = w.letters.len();
        let fits = match w.ellipsis {
            Some(_) => s.len() >= m,
            None => s.len() == m,
        };
        if !fits {
            return Err(GraphError::ShapeMismatch {
                op: OP,
                lhs: s.to_vec(),
                rhs: vec![m],
            });
        }
        spans.push(s.len() - m);
    }
    let e = spans.iter().copied().max().unwrap_or(0);
    let labelled = |w: &Written, span: usize| -> Vec<char> {
        match w.ellipsis {
            None => w.letters.clone(),
            Some(k) => {
                let mut v = w.letters[..k].to_vec();
                v.extend((e - span..e).map(ellipsis_label));
                v.extend_from_slice(&w.letters[k..]);
                v
            }
        }
    };
    let inputs: Vec<Vec<char>> = written_in
        .iter()
        .zip(&spans)
        .map(|(w, &span)| labelled(w, span))
        .collect();
    // A letter repeated within one operand (a diagonal) must have one extent there.
    for (labels, s) in inputs.iter().zip(shapes) {
        for (k, &c) in labels.iter().enumerate() {
            if labels[..k]
                .iter()
                .zip(s.iter())
                .any(|(&l, &d)| l == c && d != s[k])
            {
                return Err(GraphError::ShapeMismatch {
                    op: OP,
                    lhs: s.to_vec(),
                    rhs: s.to_vec(),
                });
            }
        }
    }
    // Each label's extent: where operands disagree, one of them is 1 and broadcasts.
    let mut extents: Vec<(char, usize)> = Vec::new();
    for (labels, s) in inputs.iter().zip(shapes) {
        for (&c, &d) in labels.iter().zip(s.iter()) {
            match extents.iter_mut().find(|(l, _)| *l == c) {
                None => extents.push((c, d)),
                Some((_, have)) if *have == d || d == 1 => {}
                Some((_, have)) if *have == 1 => *have = d,
                Some(_) => {
                    return Err(GraphError::ShapeMismatch {
                        op: OP,
                        lhs: shapes[0].to_vec(),
                        rhs: s.to_vec(),
                    })
                }
            }
        }
    }
    let out: Vec<char> = match out {
        Some(o) => {
            let w = written(o)?;
            let l = &w.letters;
            if (1..l.len()).any(|k| l[..k].contains(&l[k])) {
                return Err(bad("a letter repeated in the output"));
            }
            if l.iter()
                .any(|c| !written_in.iter().any(|i| i.letters.contains(c)))
            {
                return Err(bad("an output letter names no input axis"));
            }
            labelled(&w, e)
        }
        None => {
            let mut once: Vec<char> = ('a'..='z')
                .chain('A'..='Z')
                .filter(|c| inputs.iter().flatten().filter(|x| *x == c).count() == 1)
                .collect();
            once.sort();
            (0..e).map(ellipsis_label).chain(once).collect()
        }
    };
    Ok(Parsed {
        inputs,
        out,
        extents,
    })
}

/// What [`checked`] makes of the subscripts.
struct Parsed {
    inputs: Vec<Vec<char>>,
    out: Vec<char>,
    extents: Vec<(char, usize)>,
}

impl Parsed {
    fn extent(&self, c: char) -> usize {
        self.extents
            .iter()
            .find(|(l, _)| *l == c)
            .map(|&(_, d)| d)
            .expect("invariant: every label has an extent")
    }
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

/// `x` with axis `k` (of extent 1) broadcast to `full`.
fn widen<'g>(x: Tensor<'g>, k: usize, full: usize) -> Result<Tensor<'g>> {
    let mut shape = x.try_shape()?.to_vec();
    shape[k] = full;
    x.broadcast_to(&shape)
}

/// `x` without its axis labelled `c`: summed along it, or (`unit`, an axis of extent 1)
/// reshaped away.
fn drop_label<'g>(
    x: Tensor<'g>,
    letters: &[char],
    c: char,
    unit: bool,
) -> Result<(Tensor<'g>, Vec<char>)> {
    if !unit {
        return sum_out(x, letters, |l| l != c);
    }
    let shape: Vec<isize> = x
        .try_shape()?
        .iter()
        .zip(letters)
        .filter(|(_, &l)| l != c)
        .map(|(&d, _)| d as isize)
        .collect();
    let left = letters.iter().copied().filter(|&l| l != c).collect();
    Ok((x.reshape(&shape)?, left))
}

fn extent(x: &Tensor<'_>, letters: &[char], c: char) -> usize {
    let k = letters
        .iter()
        .position(|&l| l == c)
        .expect("invariant: a letter of x");
    x.shape()[k]
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
    let p = checked(spec, shapes)?;
    Ok(p.out.iter().map(|&c| p.extent(c)).collect())
}

impl Graph {
    /// Einstein summation, PyTorch's `torch.einsum`: `"ij,jk->ik"`, `"bhqd,bhkd->bhqk"`,
    /// `"i,i->"`, `"i,j->ij"`, `"ij->ji"`, `"ii"` (a trace), `"ii->i"` (a diagonal),
    /// `"...ij,...jk->...ik"`, `"bn,anm,bm->ba"`. As in PyTorch, an ellipsis (`...`, one per
    /// operand) stands for the axes no letter names, the operands' ellipses broadcast against
    /// each other (right-aligned), and the output drops (sums) them when its subscripts leave
    /// the ellipsis out; a label's extents across operands must agree or be 1, which
    /// broadcasts; a letter repeated within one operand takes its diagonal (its extents there
    /// equal); without `->`, the output is the ellipsis's axes, then the letters seen once, in
    /// alphabetical order. The operands are contracted left to right, each step one batched
    /// matrix product that keeps the labels the output or a later operand needs (PyTorch
    /// contracts left to right too unless `opt_einsum` picks an order), so the work is the
    /// sum of those products. Built of slices, permutes, reshapes, broadcasts, sums and batched
    /// products, so the gradient (and the second) comes with them.
    ///
    /// ```
    /// use arenagrad_graph::{DType, Graph};
    /// let g = Graph::new();
    /// let a = g.from_f64(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3], DType::F64)?;
    /// let b = g.from_f64(&[1.0, 0.0, 0.0, 1.0, 1.0, 1.0], &[3, 2], DType::F64)?;
    /// let y = g.einsum("ij,jk->ik", &[a, b])?;
    /// assert_eq!(y.to_vec::<f64>()?, a.matmul(b)?.to_vec::<f64>()?);
    /// assert_eq!(g.einsum("ij->j", &[a])?.to_vec::<f64>()?, [5.0, 7.0, 9.0]);
    /// // A batch of one broadcast against the other operand's: [1, 2, 3] · [3, 2] → [1, 2, 2].
    /// let a1 = a.reshape(&[1, 2, 3])?;
    /// assert_eq!(g.einsum("...ij,jk->...ik", &[a1, b])?.shape().to_vec(), [1, 2, 2]);
    /// # Ok::<(), arenagrad_graph::GraphError>(())
    /// ```
    pub fn einsum<'g>(&'g self, spec: &str, operands: &[Tensor<'g>]) -> Result<Tensor<'g>> {
        self.owns_all(OP, operands)?;
        let shapes = operands
            .iter()
            .map(|x| x.try_shape().map(|s| s.to_vec()))
            .collect::<Result<Vec<_>>>()?;
        let views: Vec<&[usize]> = shapes.iter().map(Vec::as_slice).collect();
        let parsed = checked(spec, &views)?;
        let out = &parsed.out;
        // Each operand with its diagonals taken (a letter repeated in it appears once after).
        let mut terms = operands
            .iter()
            .zip(&parsed.inputs)
            .map(|(&x, labels)| diagonals(x, labels))
            .collect::<Result<Vec<_>>>()?
            .into_iter();
        let (mut acc, mut labels) = terms.next().expect("invariant: at least one operand");
        // The operands contracted left to right, each product keeping the labels that the
        // output or a later operand still needs.
        let rest: Vec<(Tensor<'g>, Vec<char>)> = terms.collect();
        if rest.is_empty() {
            let (x, left) = sum_out(acc, &labels, |c| out.contains(&c))?;
            return arrange(x, &left, out);
        }
        for (i, (b, lb)) in rest.iter().enumerate() {
            let later = &rest[i + 1..];
            let keep = |c: char| out.contains(&c) || later.iter().any(|(_, l)| l.contains(&c));
            (acc, labels) = pair(&parsed, (acc, labels), (*b, lb.clone()), keep)?;
        }
        arrange(acc, &labels, out)
    }
}

/// `x` (its axes labelled `labels`) with the diagonal taken for every label that repeats, so
/// that each appears once, last in the order.
fn diagonals<'g>(x: Tensor<'g>, labels: &[char]) -> Result<(Tensor<'g>, Vec<char>)> {
    let (mut x, mut labels) = (x, labels.to_vec());
    while let Some(q) = (1..labels.len()).find(|&q| labels[..q].contains(&labels[q])) {
        let p = labels[..q]
            .iter()
            .position(|&l| l == labels[q])
            .expect("invariant: a repeated label");
        let c = labels[q];
        // Axes p and q moved last and flattened: the diagonal is every (d + 1)-th element.
        let d = x.try_shape()?[p];
        let perm: Vec<usize> = (0..labels.len())
            .filter(|&k| k != p && k != q)
            .chain([p, q])
            .collect();
        let moved = if perm.iter().enumerate().all(|(k, &v)| k == v) {
            x
        } else {
            x.permute(&perm)?
        };
        let mut flat: Vec<isize> = moved.try_shape()?[..perm.len() - 2]
            .iter()
            .map(|&e| e as isize)
            .collect();
        flat.push((d * d) as isize);
        x = moved.reshape(&flat)?.slice_step(-1, 0, d * d, d + 1)?;
        // The labels in the moved order, the pair now one axis.
        labels = perm[..perm.len() - 2].iter().map(|&k| labels[k]).collect();
        labels.push(c);
    }
    Ok((x, labels))
}

/// The product of two terms (each a tensor and its labels, every label once), summed over the
/// labels `keep` rejects: as one batched matrix product, with the labels of the result.
fn pair<'g>(
    parsed: &Parsed,
    (a, sa): (Tensor<'g>, Vec<char>),
    (b, sb): (Tensor<'g>, Vec<char>),
    keep: impl Fn(char) -> bool,
) -> Result<(Tensor<'g>, Vec<char>)> {
    // A label of one term alone that the result drops is summed there first.
    let (mut a, mut sa) = sum_out(a, &sa, |c| keep(c) || sb.contains(&c))?;
    let (mut b, mut sb) = sum_out(b, &sb, |c| keep(c) || sa.contains(&c))?;
    // A shared label of extent 1 on one side broadcasts: kept, that side is expanded along it;
    // summed over, the other side is summed along it first (Σ_j x_j·y = y·Σ_j x_j) and the
    // label leaves both.
    for c in sa.clone() {
        let Some(kb) = sb.iter().position(|&l| l == c) else {
            continue;
        };
        let ka = sa
            .iter()
            .position(|&l| l == c)
            .expect("invariant: a label of a");
        let (ea, eb) = (a.try_shape()?[ka], b.try_shape()?[kb]);
        if ea == eb {
            continue;
        }
        if keep(c) {
            let full = parsed.extent(c);
            if ea == 1 {
                a = widen(a, ka, full)?;
            } else {
                b = widen(b, kb, full)?;
            }
        } else {
            (a, sa) = drop_label(a, &sa, c, ea == 1)?;
            (b, sb) = drop_label(b, &sb, c, eb == 1)?;
        }
    }
    let batch: Vec<char> = sa
        .iter()
        .copied()
        .filter(|&c| sb.contains(&c) && keep(c))
        .collect();
    let contracted: Vec<char> = sa
        .iter()
        .copied()
        .filter(|&c| sb.contains(&c) && !keep(c))
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
    Ok((y, [&batch[..], &left, &right].concat()))
}
