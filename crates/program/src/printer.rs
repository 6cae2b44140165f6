//! Printing a program in the text format. The printed form parses back to an equal program:
//! floats are written with Rust's shortest round-trip form (`{:?}`), which the parser reads back
//! bit for bit (including `-0.0`, `inf`, `-inf` and `NaN`).

use super::ast::{Expr, Program};

/// A float as the format writes it.
pub(crate) fn float(v: f64) -> String {
    format!("{v:?}")
}

/// The tokens of statement `i`: name, `=`, op, arguments.
pub(crate) fn tokens(p: &Program, i: usize) -> Vec<String> {
    let s = &p.stmts[i];
    let name = |k: usize| -> String {
        p.stmts
            .get(k)
            .map_or_else(|| format!("<{k}>"), |s| s.name.clone())
    };
    let mut t = vec![
        s.name.clone(),
        "=".to_string(),
        s.expr.op_name().to_string(),
    ];
    match &s.expr {
        Expr::Leaf {
            shape,
            values,
            dtype,
            ..
        } => {
            t.extend(dtype.map(|d| d.name().to_string()));
            t.extend(shape.iter().map(|d| d.to_string()));
            if let Some(v) = values {
                t.push(":".into());
                t.extend(v.iter().map(|&x| float(x)));
            }
        }
        Expr::Binary { lhs, rhs, .. } => {
            t.push(name(*lhs));
            t.push(name(*rhs));
        }
        Expr::Unary { x, op } => {
            t.push(name(*x));
            if let Some(p) = op.param() {
                t.push(float(p));
            }
        }
        Expr::User { args, .. } => t.extend(args.iter().map(|&k| name(k))),
        Expr::Op { op, args, params } => {
            let params = params.iter().map(|v| v.to_string());
            if op.params_first() {
                t.extend(params);
                t.extend(args.iter().map(|&k| name(k)));
            } else {
                t.extend(args.iter().map(|&k| name(k)));
                t.extend(params);
            }
        }
    }
    t
}

/// The text of statement `i`, without a newline.
pub(crate) fn statement(p: &Program, i: usize) -> String {
    tokens(p, i).join(" ")
}

/// One statement per line, no comments: the canonical form.
impl std::fmt::Display for Program {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for i in 0..self.stmts.len() {
            writeln!(f, "{}", statement(self, i))?;
        }
        Ok(())
    }
}

impl Program {
    /// Line and column of token `tok` of statement `i` (0: name, 1: `=`, 2: op, 3...:
    /// arguments). Falls back to the op's column, then to column 1.
    pub(crate) fn pos(&self, i: usize, tok: usize) -> (usize, usize) {
        if let Some(s) = self.spans.get(i) {
            let col = s
                .cols
                .get(tok)
                .or_else(|| s.cols.get(2))
                .copied()
                .unwrap_or(1);
            return (s.line, col);
        }
        // No source: the printed form has statement i on line i+1, tokens one space apart.
        let toks = tokens(self, i);
        let mut cols = Vec::with_capacity(toks.len());
        let mut col = 1;
        for t in &toks {
            cols.push(col);
            col += t.chars().count() + 1;
        }
        let col = cols.get(tok).or_else(|| cols.get(2)).copied().unwrap_or(1);
        (i + 1, col)
    }

    /// The position of argument `k` of statement `i`, for errors.
    pub(crate) fn arg_pos(&self, i: usize, k: usize) -> (usize, usize) {
        self.pos(i, 3 + k)
    }

    /// The position of the op of statement `i`, for errors.
    pub(crate) fn op_pos(&self, i: usize) -> (usize, usize) {
        self.pos(i, 2)
    }
}
