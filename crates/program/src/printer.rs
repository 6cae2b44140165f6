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
        Expr::Leaf { shape, values, .. } => {
            t.extend(shape.iter().map(|d| d.to_string()));
            if let Some(v) = values {
                t.push(":".into());
                t.extend(v.iter().map(|&x| float(x)));
            }
        }
        Expr::Binary { lhs, rhs, .. } | Expr::Matmul { lhs, rhs } => {
            t.push(name(*lhs));
            t.push(name(*rhs));
        }
        Expr::Unary { x, op } => {
            t.push(name(*x));
            if let Some(p) = op.param() {
                t.push(float(p));
            }
        }
        Expr::Detach { x } => t.push(name(*x)),
        Expr::Reduce { x, axes, .. } => {
            t.push(name(*x));
            t.extend(axes.iter().map(|a| a.to_string()));
        }
        Expr::Max { x, axis } | Expr::Softmax { x, axis, .. } => {
            t.push(name(*x));
            t.push(axis.to_string());
        }
        Expr::Transpose { x, d0, d1 } => {
            t.push(name(*x));
            t.push(d0.to_string());
            t.push(d1.to_string());
        }
        Expr::Permute { x, perm: v } | Expr::Reshape { x, shape: v } => {
            t.push(name(*x));
            t.extend(v.iter().map(|a| a.to_string()));
        }
        Expr::Broadcast { x, shape } => {
            t.push(name(*x));
            t.extend(shape.iter().map(|a| a.to_string()));
        }
        Expr::User { args, .. } => t.extend(args.iter().map(|&k| name(k))),
        Expr::Op { op, args, params } => {
            t.extend(args.iter().map(|&k| name(k)));
            for (&v, (_, kind)) in params.iter().zip(op.params) {
                t.push(match kind {
                    crate::table::ParamKind::Float => float(v),
                    crate::table::ParamKind::Int => format!("{}", v as i64),
                    crate::table::ParamKind::Count => format!("{}", v as u64),
                });
            }
        }
        Expr::Concat { axis, xs } => {
            t.push(axis.to_string());
            t.extend(xs.iter().map(|&k| name(k)));
        }
        Expr::Slice {
            x,
            axis,
            start,
            end,
        } => {
            t.push(name(*x));
            t.push(axis.to_string());
            t.push(start.to_string());
            t.push(end.to_string());
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
