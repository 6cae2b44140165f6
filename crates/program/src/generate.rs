//! Well-typed random programs from plain data.
//!
//! A program is generated from a list of [`LeafChoice`]s and a list of [`OpChoice`]s — small
//! records of numbers — by [`well_typed`], which reads each choice against the statements made so
//! far and always produces a program that passes the shape rules. Anything that produces such
//! lists can generate programs: the proptest strategies of `arenagrad_program::strategy` (feature
//! `proptest`), and the fuzz targets, which read the records from the fuzzer's bytes
//! ([`decode`]). Because a choice names its operands relative to what exists, removing choices
//! (what shrinking does) still gives a valid program, and the output's unused statements are
//! dropped, so a shrunk failing program is small.

use super::ast::{binary_op, binary_ops, op_names, unary_op, unary_ops, Expr, Program, UnaryOp};
use super::table::{self, Draw, FreshKind, OpRow, Param};
use arenagrad_exec::{BinaryOp, DType, Domain, Positive};

/// Ops whose derivatives exist everywhere on the values generated (no kinks, no `detach`): what
/// a gradient check can use. The smooth public rows of the op tables, then the smooth rows of the
/// format's op table that random programs draw.
pub fn smooth_ops() -> Vec<&'static str> {
    let mut v: Vec<&'static str> = binary_ops()
        .filter(|b| b.is_smooth())
        .map(|b| b.name())
        .collect();
    v.extend(unary_ops().filter(|u| u.is_smooth()).map(|u| u.name()));
    v.extend(
        crate::table::OPS
            .iter()
            .filter(|r| r.smooth && r.gen.is_some())
            .map(|r| r.name),
    );
    v
}

/// Every non-leaf op of the format: [`op_names`] after its two leaf kinds.
pub fn all_ops() -> &'static [&'static str] {
    op_names().split_at(2).1
}

/// What generated programs may contain.
#[derive(Debug, Clone, PartialEq)]
pub struct GenConfig {
    /// Most dimensions of a leaf (ops may add one).
    pub max_rank: usize,
    /// Extents are drawn from `1..=max_dim`.
    pub max_dim: usize,
    /// Most elements of any tensor.
    pub max_elements: usize,
    /// The ops to draw from (names as the format spells them). An op that cannot apply to the
    /// operand drawn becomes `neg`.
    pub ops: Vec<&'static str>,
}

impl GenConfig {
    /// Smooth ops only ([`smooth_ops`]): programs whose gradients a finite-difference check can
    /// verify. Rank up to 3, extents up to 4, at most 64 elements per tensor.
    pub fn smooth() -> Self {
        GenConfig {
            max_rank: 3,
            max_dim: 4,
            max_elements: 64,
            ops: smooth_ops(),
        }
    }

    /// Every op ([`all_ops`]), same sizes as [`GenConfig::smooth`].
    pub fn all() -> Self {
        GenConfig {
            ops: all_ops().to_vec(),
            ..GenConfig::smooth()
        }
    }

    /// The same, also drawing the application's registered ops ([`crate::register_op`]): the
    /// smooth ones only when `smooth_only` (for gradient checks), else all of them.
    pub fn with_user_ops(mut self, smooth_only: bool) -> Self {
        for u in crate::user_ops() {
            if (u.is_smooth() || !smooth_only) && !self.ops.contains(&u.name()) {
                self.ops.push(u.name());
            }
        }
        self
    }
}

/// A leaf to make: its extents (each read as `1 + d % max_dim`, at most `max_rank` of them), its
/// kind and the seed of its values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeafChoice {
    /// Extents before reduction into range.
    pub dims: Vec<u8>,
    /// Bit 0: a `const` (else an `input`); bit 1: positive values (in [0.25, 2.25)), else values
    /// in (-2, 2) away from zero.
    pub kind: u8,
    /// Seed of the values (written into the program after a colon).
    pub seed: u64,
}

/// An op statement to make: which op, which operands (indices into what exists, taken modulo
/// its length) and four bytes of attributes (axes, constants, extents).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpChoice {
    /// Index into [`GenConfig::ops`] (modulo its length).
    pub op: u8,
    /// First operand.
    pub a: u8,
    /// Second operand (among the candidates that fit).
    pub b: u8,
    /// Attribute bytes.
    pub attrs: [u8; 4],
}

fn splitmix(s: &mut u64) -> u64 {
    *s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *s;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// `n` values from `seed`: multiples of 1/128 (exact in binary, short in text), in (-2, 2) away
/// from zero, or in [0.25, 2.25) when `positive`.
pub fn values(seed: u64, n: usize, positive: bool) -> Vec<f64> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            let k = (splitmix(&mut s) >> 56) as f64; // 0..=255
            if positive {
                0.25 + k / 128.0
            } else {
                (2.0 * k - 255.0) / 128.0
            }
        })
        .collect()
}

/// `n` values strictly between 0 and 1 from `seed`: (k + 1)/258 for k in 0..=255, which stay
/// below 1 when rounded to bf16 or f16.
pub fn probabilities(seed: u64, n: usize) -> Vec<f64> {
    let mut s = seed;
    (0..n)
        .map(|_| ((splitmix(&mut s) >> 56) as f64 + 1.0) / 258.0)
        .collect()
}

/// `n` whole numbers in `0..bound` from `seed` (indices).
pub fn index_values(seed: u64, n: usize, bound: usize) -> Vec<f64> {
    let mut s = seed;
    let bound = bound.max(1) as u64;
    (0..n).map(|_| (splitmix(&mut s) % bound) as f64).collect()
}

fn numel(s: &[usize]) -> Option<usize> {
    s.iter().try_fold(1usize, |a, &d| a.checked_mul(d))
}

fn broadcast(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    arenagrad_exec::layout::broadcast_shapes(a, b)
}

struct Gen<'c> {
    cfg: &'c GenConfig,
    exprs: Vec<Expr>,
    /// Each value's shape, and whether its values are all positive.
    shapes: Vec<Vec<usize>>,
    pos: Vec<bool>,
    /// Whether each value is an integer `const` (indices), which only index operands take.
    typed: Vec<bool>,
}

const SCALES: [f64; 8] = [0.5, -0.5, 2.0, -2.0, 1.5, -1.25, 3.0, 0.25];
const SHIFTS: [f64; 6] = [1.0, -1.0, 0.5, -0.5, 2.0, 0.25];
const POWERS: [f64; 8] = [2.0, 3.0, 0.5, 1.5, -1.0, -0.5, 1.0, 2.5];

impl Gen<'_> {
    fn fits(&self, shape: &[usize]) -> bool {
        shape.len() <= self.cfg.max_rank + 1
            && numel(shape).is_some_and(|n| n <= self.cfg.max_elements)
    }

    fn push(&mut self, e: Expr, shape: Vec<usize>, pos: bool) -> usize {
        self.typed
            .push(matches!(e, Expr::Leaf { dtype: Some(_), .. }));
        self.exprs.push(e);
        self.shapes.push(shape);
        self.pos.push(pos);
        self.shapes.len() - 1
    }

    fn leaf(&mut self, c: &LeafChoice) -> usize {
        let max_dim = self.cfg.max_dim.max(1);
        let mut shape: Vec<usize> = c
            .dims
            .iter()
            .take(self.cfg.max_rank)
            .map(|&d| 1 + usize::from(d) % max_dim)
            .collect();
        // Shrink extents until the leaf fits.
        let mut k = 0;
        while numel(&shape).is_none_or(|n| n > self.cfg.max_elements) && !shape.is_empty() {
            let j = k % shape.len();
            shape[j] = (shape[j] / 2).max(1);
            k += 1;
            if k > 64 * shape.len() {
                shape.clear();
            }
        }
        let positive = c.kind & 2 != 0;
        let n = numel(&shape).unwrap_or(1);
        let e = Expr::Leaf {
            requires_grad: c.kind & 1 == 0,
            shape: shape.clone(),
            values: Some(values(c.seed, n, positive)),
            dtype: None,
        };
        self.push(e, shape, positive)
    }

    /// `neg a`: what a choice becomes when its op cannot apply.
    fn fallback(&mut self, a: usize) -> usize {
        let shape = self.shapes[a].clone();
        self.push(
            Expr::Unary {
                op: UnaryOp::Neg,
                x: a,
            },
            shape,
            false,
        )
    }

    /// A registered op on `a` and, for each further operand, the earlier value the choice's
    /// selectors pick among those the op's shape rule accepts (or one of `a`'s shape).
    fn user_op(&mut self, u: &crate::UserOp, a: usize, c: &OpChoice) -> usize {
        let n = self.shapes.len();
        let mut args = vec![a];
        for k in 1..u.arity() {
            let sel = c.attrs[(k - 1) % 4].wrapping_add(c.b);
            let cands: Vec<usize> = (0..n)
                .filter(|&j| !self.typed[j])
                .filter(|&j| {
                    let mut shapes: Vec<&[usize]> =
                        args.iter().map(|&i| self.shapes[i].as_slice()).collect();
                    shapes.push(&self.shapes[j]);
                    // A partial list: accept what a full list of this shape would.
                    while shapes.len() < u.arity() {
                        shapes.push(&self.shapes[j]);
                    }
                    u.out_shape(&shapes).is_some()
                })
                .collect();
            match Self::pick(&cands, sel) {
                Some(j) => args.push(j),
                None => return self.fallback(a),
            }
        }
        let shapes: Vec<&[usize]> = args.iter().map(|&i| self.shapes[i].as_slice()).collect();
        match u.out_shape(&shapes) {
            Some(shape) if self.fits(&shape) => {
                self.push(Expr::User { op: u.name(), args }, shape, false)
            }
            _ => self.fallback(a),
        }
    }

    fn pick(cands: &[usize], sel: u8) -> Option<usize> {
        if cands.is_empty() {
            None
        } else {
            Some(cands[usize::from(sel) % cands.len()])
        }
    }

    fn op(&mut self, c: &OpChoice) -> usize {
        let n = self.shapes.len();
        // Mostly the newest value, so that the ops form chains, each feeding the next, which the
        // output reads (an operand drawn from all values alike left most ops off the output's
        // path, dropped: 1.4 statements per program of up to six); else any value, so that
        // values are shared too.
        let mut a = if c.a & 3 != 0 {
            n - 1
        } else {
            usize::from(c.a >> 2) % n
        };
        if self.typed[a] {
            // Integer indices feed only the ops that read them: the newest floating value
            // instead (the first leaves are floating).
            a = (0..n).rev().find(|&j| !self.typed[j]).unwrap_or(0);
        }
        let name = if self.cfg.ops.is_empty() {
            "neg"
        } else {
            self.cfg.ops[usize::from(c.op) % self.cfg.ops.len()]
        };
        let positives: Vec<usize> = (0..n).filter(|&i| self.pos[i] && !self.typed[i]).collect();
        let t0 = c.attrs[0];
        let pa = self.pos[a];
        if let Some(k) = binary_op(name) {
            let (da, db) = k.domain();
            if da == Domain::Positive && !pa {
                match Self::pick(&positives, c.a) {
                    Some(p) => a = p,
                    None => return self.fallback(a),
                }
            }
            let sa = self.shapes[a].clone();
            // A power's exponent is a leaf (values within ±2.25): an exponent computed from the
            // program (a sum of 64 values) makes powers like x^100, whose gradients finite
            // differences cannot check, nor f32 hold.
            let exponent = k == BinaryOp::Pow;
            let cands: Vec<usize> = (0..n)
                .filter(|&j| {
                    !self.typed[j]
                        && (db != Domain::Positive || self.pos[j])
                        && (!exponent || matches!(self.exprs[j], Expr::Leaf { .. }))
                        && broadcast(&sa, &self.shapes[j]).is_some_and(|s| self.fits(&s))
                })
                .collect();
            let Some(b) = Self::pick(&cands, c.b) else {
                return self.fallback(a);
            };
            let shape = broadcast(&sa, &self.shapes[b]).unwrap_or_default();
            let (pa, pb) = (self.pos[a], self.pos[b]);
            let pos = match k.positive() {
                Positive::Never => false,
                Positive::Always => true,
                Positive::IfInput => pa && pb,
                Positive::IfEither => pa || pb,
            };
            return self.push(
                Expr::Binary {
                    op: k,
                    lhs: a,
                    rhs: b,
                },
                shape,
                pos,
            );
        }
        if let Some(k) = unary_op(name) {
            let k = match k {
                UnaryOp::Scale(_) => k.with_param(SCALES[usize::from(t0) % SCALES.len()]),
                UnaryOp::Shift(_) => k.with_param(SHIFTS[usize::from(t0) % SHIFTS.len()]),
                UnaryOp::Powf(_) => k.with_param(POWERS[usize::from(t0) % POWERS.len()]),
                _ => k,
            };
            if k.domain() == Domain::Positive && !pa {
                match Self::pick(&positives, c.b) {
                    Some(p) => a = p,
                    None => return self.fallback(a),
                }
            }
            let pa = self.pos[a];
            let pos = match k.positive() {
                Positive::Never => false,
                Positive::Always => true,
                Positive::IfInput | Positive::IfEither => pa,
            };
            let shape = self.shapes[a].clone();
            return self.push(Expr::Unary { op: k, x: a }, shape, pos);
        }
        if let Some(u) = crate::user_op(name) {
            return self.user_op(&u, a, c);
        }
        match crate::table::op_row(name) {
            Some(row) => self.row(row, a, c),
            None => self.fallback(a),
        }
    }

    /// A row of the op table, drawn as the row says; `neg a` where it cannot apply or its
    /// result would not fit.
    fn row(&mut self, row: &'static OpRow, a: usize, c: &OpChoice) -> usize {
        let fits = |s: &[usize]| self.fits(s);
        let mut draw = Draw::new(
            (&self.shapes, &self.pos, &self.typed),
            (a, c.b, c.attrs),
            self.cfg.max_dim,
            &fits,
        );
        let drawn = match row.gen {
            Some(table::Gen::Params(gen)) => {
                gen(&self.shapes[a], c.attrs).map(|params| (vec![a; row.arity.min()], params))
            }
            Some(table::Gen::Operands(gen)) => gen(&mut draw),
            None => None,
        };
        let fresh = draw.fresh().to_vec();
        let Some((args, params)) = drawn else {
            return self.fallback(a);
        };
        let params: Vec<Param> = params
            .iter()
            .enumerate()
            .map(|(k, &v)| {
                let kind = row
                    .param_spec(k)
                    .map_or(crate::table::ParamKind::Float, |s| s.kind);
                Param::of_kind(kind, v)
            })
            .collect();
        let shapes: Vec<&[usize]> = args.iter().map(|&i| draw.shape(i)).collect();
        let ok = !args.is_empty() && row.accepts(args.len(), &params).is_ok();
        let shape = match ok.then(|| (row.shape)(&shapes, &params)) {
            Some(Ok(shape)) if draw.fits(&shape) => shape,
            _ => return self.fallback(a),
        };
        let pa = self.pos[a];
        for (k, f) in fresh.into_iter().enumerate() {
            // The operand this leaf becomes (its index is the next value's).
            let takes = args
                .iter()
                .position(|&x| x == self.shapes.len())
                .map_or(&[][..], |j| row.integer_dtypes(j));
            // A fresh leaf to take part (a matrix to multiply by, a gather's indices): values
            // from the choice.
            let [t0, t1, t2, t3] = c.attrs;
            let seed = u64::from_le_bytes([t0, t1, t2, t3, c.a, c.b, c.op, 1 + k as u8]);
            let n = numel(&f.shape).unwrap_or(0);
            let (e, pos) = match f.kind {
                FreshKind::Input => (
                    Expr::Leaf {
                        requires_grad: true,
                        shape: f.shape.clone(),
                        values: Some(values(seed, n, pa)),
                        dtype: None,
                    },
                    pa,
                ),
                FreshKind::Probabilities => (
                    Expr::Leaf {
                        requires_grad: true,
                        shape: f.shape.clone(),
                        values: Some(probabilities(seed, n)),
                        dtype: None,
                    },
                    true,
                ),
                FreshKind::Indices(bound) => (
                    Expr::Leaf {
                        requires_grad: false,
                        shape: f.shape.clone(),
                        values: Some(index_values(seed, n, bound)),
                        // Of the run's float dtype, or of a dtype PyTorch's op takes there
                        // (u8 where the indices fit it).
                        dtype: match c.attrs[3] >> 6 {
                            0 => None,
                            t => takes
                                .get(usize::from(t - 1) % takes.len().max(1))
                                .copied()
                                .filter(|&d| d != DType::U8 || bound <= 256),
                        },
                    },
                    false,
                ),
            };
            self.push(e, f.shape, pos);
        }
        let pos = match row.positive {
            Positive::Never => false,
            Positive::Always => true,
            Positive::IfInput => args.iter().all(|&i| self.pos[i]),
            Positive::IfEither => args.iter().any(|&i| self.pos[i]),
        };
        self.push(
            Expr::Op {
                op: row,
                args,
                params,
            },
            shape,
            pos,
        )
    }
}

/// Builds a well-typed program from choices: the leaves first (at least one is made, a scalar
/// input, when `leaves` is empty), then one statement per op choice. Statements the output (the
/// last statement) does not depend on are dropped; names are `x0, x1, ...` for inputs,
/// `c0, c1, ...` for consts and `t0, t1, ...` for ops. Leaf values are written in the program.
pub fn well_typed(leaves: &[LeafChoice], ops: &[OpChoice], cfg: &GenConfig) -> Program {
    let mut g = Gen {
        cfg,
        exprs: Vec::new(),
        shapes: Vec::new(),
        pos: Vec::new(),
        typed: Vec::new(),
    };
    if leaves.is_empty() {
        g.leaf(&LeafChoice {
            dims: Vec::new(),
            kind: 0,
            seed: 0,
        });
    }
    for l in leaves {
        g.leaf(l);
    }
    for c in ops {
        g.op(c);
    }
    assemble(g.exprs)
}

/// Keeps the statements the last one depends on, renumbers operands, names everything.
fn assemble(exprs: Vec<Expr>) -> Program {
    let n = exprs.len();
    let mut live = vec![false; n];
    if n > 0 {
        live[n - 1] = true;
    }
    for i in (0..n).rev() {
        if live[i] {
            for o in exprs[i].operands() {
                if o < n {
                    live[o] = true;
                }
            }
        }
    }
    let mut new_index = vec![usize::MAX; n];
    let mut p = Program::new();
    let (mut xi, mut ci, mut ti) = (0, 0, 0);
    for (i, mut e) in exprs.into_iter().enumerate() {
        if !live[i] {
            continue;
        }
        remap(&mut e, &new_index);
        let name = match &e {
            Expr::Leaf {
                requires_grad: true,
                ..
            } => {
                xi += 1;
                format!("x{}", xi - 1)
            }
            Expr::Leaf { .. } => {
                ci += 1;
                format!("c{}", ci - 1)
            }
            _ => {
                ti += 1;
                format!("t{}", ti - 1)
            }
        };
        if let Ok(k) = p.push(&name, e) {
            new_index[i] = k;
        }
    }
    p
}

/// Rewrites operand indices through `map`.
pub(crate) fn remap(e: &mut Expr, map: &[usize]) {
    for i in e.operands_mut() {
        *i = map.get(*i).copied().unwrap_or(usize::MAX);
    }
}

/// Reads bytes as choices, for fuzzing: one byte for the number of leaves (1 to 3); per leaf a
/// rank byte, that many extent bytes, a kind byte and two seed bytes; then op choices of seven
/// bytes each (op, a, b, four attributes), at most `max_ops`. Missing bytes read as zero.
pub fn decode(bytes: &[u8], max_rank: usize, max_ops: usize) -> (Vec<LeafChoice>, Vec<OpChoice>) {
    let mut r = ByteReader::new(bytes);
    let n_leaves = 1 + usize::from(r.u8()) % 3;
    let mut leaves = Vec::with_capacity(n_leaves);
    for _ in 0..n_leaves {
        let rank = usize::from(r.u8()) % (max_rank + 1);
        let dims = (0..rank).map(|_| r.u8()).collect();
        let kind = r.u8();
        let seed = u64::from(r.u8()) | (u64::from(r.u8()) << 8);
        leaves.push(LeafChoice { dims, kind, seed });
    }
    let mut ops = Vec::new();
    while !r.is_empty() && ops.len() < max_ops {
        ops.push(OpChoice {
            op: r.u8(),
            a: r.u8(),
            b: r.u8(),
            attrs: [r.u8(), r.u8(), r.u8(), r.u8()],
        });
    }
    (leaves, ops)
}

/// Reads bytes one at a time; zeros once they run out.
#[derive(Debug, Clone)]
pub struct ByteReader<'a> {
    data: &'a [u8],
    at: usize,
}

impl<'a> ByteReader<'a> {
    /// A reader at the start of `data`.
    pub fn new(data: &'a [u8]) -> Self {
        ByteReader { data, at: 0 }
    }
    /// The next byte, or 0.
    pub fn u8(&mut self) -> u8 {
        let b = self.data.get(self.at).copied().unwrap_or(0);
        self.at = self.at.saturating_add(1);
        b
    }
    /// The next two bytes, little-endian.
    pub fn u16(&mut self) -> u16 {
        u16::from(self.u8()) | (u16::from(self.u8()) << 8)
    }
    /// Whether every byte has been read.
    pub fn is_empty(&self) -> bool {
        self.at >= self.data.len()
    }
}
