//! Graphviz DOT output: one node per statement (its text and shape), one edge per operand;
//! nodes that need grad are filled, inputs are ellipses, the output has a double border.

use super::ast::{Expr, Program};
use super::error::ProgramError;
use super::infer::{check, Limits};
use super::printer;

fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// Shortens a leaf's statement text: values are not drawn.
fn label_text(p: &Program, i: usize) -> String {
    let mut t = printer::tokens(p, i);
    if let Expr::Leaf {
        values: Some(v), ..
    } = &p.stmts[i].expr
    {
        if let Some(colon) = t.iter().position(|s| s == ":") {
            t.truncate(colon);
            t.push(format!(": <{} values>", v.len()));
        }
    }
    t.join(" ")
}

impl Program {
    /// The program's graph in Graphviz DOT. Shapes come from the shape rules (nothing runs), so
    /// an ill-shaped program is an error here too.
    pub fn to_dot(&self, limits: &Limits) -> Result<String, ProgramError> {
        let infos = check(self, limits)?;
        let mut out = String::new();
        out.push_str("digraph program {\n");
        out.push_str("  rankdir=TB;\n");
        out.push_str("  node [shape=box, fontname=\"monospace\", fontsize=10];\n");
        out.push_str("  edge [fontname=\"monospace\", fontsize=9];\n");
        let last = self.stmts.len().saturating_sub(1);
        for (i, s) in self.stmts.iter().enumerate() {
            let info = &infos[i];
            let mut attrs = vec![format!(
                "label=\"{}\\n{:?}{}\"",
                escape(&label_text(self, i)),
                info.shape,
                if info.requires_grad {
                    "\\nrequires_grad"
                } else {
                    ""
                }
            )];
            if s.expr.is_leaf() {
                attrs.push("shape=ellipse".into());
            }
            if info.requires_grad {
                attrs.push("style=filled".into());
                attrs.push(
                    if s.expr.is_input() {
                        "fillcolor=\"#f4b183\""
                    } else {
                        "fillcolor=\"#fbe5d6\""
                    }
                    .into(),
                );
            }
            if i == last {
                attrs.push("peripheries=2".into());
            }
            out.push_str(&format!(
                "  \"{}\" [{}];\n",
                escape(&s.name),
                attrs.join(", ")
            ));
        }
        for s in &self.stmts {
            let ops = s.expr.operands();
            let many = ops.len() > 1;
            for (k, &o) in ops.iter().enumerate() {
                let label = if many {
                    format!(" [label=\"{k}\"]")
                } else {
                    String::new()
                };
                out.push_str(&format!(
                    "  \"{}\" -> \"{}\"{label};\n",
                    escape(&self.stmts[o].name),
                    escape(&s.name)
                ));
            }
        }
        out.push_str("}\n");
        Ok(out)
    }
}
