//! The text format's parser. It reads line by line with no recursion, slices only at character
//! boundaries, and allocates in proportion to the input, never to a number written in it; every
//! problem is a [`ProgramError::Parse`] (or [`ProgramError::TooLarge`] for a shape whose element
//! count overflows) naming the line and column.

use std::collections::HashMap;

use super::ast::{
    binary_op, is_valid_name, op_names, unary_op, Expr, Program, Stmt, StmtSpan, UnaryOp,
};
use super::error::ProgramError;
use super::table::{op_row, OpRow, Param, ParamKind, ParamSpec, Subscripts};
use arenagrad_exec::DType;

/// One token: its text and its 1-based column in characters.
#[derive(Clone, Copy)]
struct Tok<'a> {
    text: &'a str,
    col: usize,
}

/// Splits a line (comment already removed) into tokens: runs of non-space characters, with `=`
/// and `:` always tokens of their own.
fn tokenize(code: &str) -> Vec<Tok<'_>> {
    let mut toks = Vec::new();
    let mut start: Option<(usize, usize)> = None; // (byte, col) of the current run
    let mut col = 0usize;
    for (b, c) in code.char_indices() {
        col += 1;
        let special = c == '=' || c == ':';
        if c.is_whitespace() || special {
            if let Some((sb, sc)) = start.take() {
                if let Some(text) = code.get(sb..b) {
                    toks.push(Tok { text, col: sc });
                }
            }
            if special {
                if let Some(text) = code.get(b..b + c.len_utf8()) {
                    toks.push(Tok { text, col });
                }
            }
        } else if start.is_none() {
            start = Some((b, col));
        }
    }
    if let Some((sb, sc)) = start {
        if let Some(text) = code.get(sb..) {
            toks.push(Tok { text, col: sc });
        }
    }
    toks
}

/// A token as an error message shows it: escaped, and cut after 40 characters.
fn show(t: &str) -> String {
    let mut s: String = t.chars().take(40).flat_map(char::escape_debug).collect();
    if t.chars().nth(40).is_some() {
        s.push('…');
    }
    format!("`{s}`")
}

/// How each op is written, for error messages.
fn usage(op: &str) -> String {
    if let Some(row) = op_row(op) {
        return row.usage();
    }
    match op {
        "input" | "const" => {
            "NAME = input|const [D0 D1 ...] [: V0 V1 ...], or NAME = const i64|i32|u8|bool \
             [D0 D1 ...] : V0 V1 ..."
                .into()
        }
        _ if binary_op(op).is_some() => format!("{op} A B"),
        _ if unary_op(op).is_some_and(|u| u.param().is_some()) => format!("{op} A FLOAT"),
        _ => format!("{op} A"),
    }
}

struct Line<'a, 'n> {
    toks: Vec<Tok<'a>>,
    at: usize,
    line: usize,
    /// Column just past the last character of the line's code.
    end_col: usize,
    names: &'n HashMap<String, usize>,
    op: &'a str,
}

impl<'a> Line<'a, '_> {
    fn err(&self, column: usize, message: String) -> ProgramError {
        ProgramError::Parse {
            line: self.line,
            column,
            message,
        }
    }

    fn peek(&self) -> Option<Tok<'a>> {
        self.toks.get(self.at).copied()
    }

    fn at_end(&self) -> bool {
        self.at >= self.toks.len()
    }

    /// The next token, or an error saying `what` was expected at the end of the line.
    fn take(&mut self, what: &str) -> Result<Tok<'a>, ProgramError> {
        match self.peek() {
            Some(t) => {
                self.at += 1;
                Ok(t)
            }
            None => Err(self.err(
                self.end_col,
                format!(
                    "expected {what}, found end of line (`{}` is written `{}`)",
                    self.op,
                    usage(self.op)
                ),
            )),
        }
    }

    fn name(&mut self, what: &str) -> Result<usize, ProgramError> {
        let t = self.take(what)?;
        if !is_valid_name(t.text) {
            return Err(self.err(t.col, format!("expected {what}, found {}", show(t.text))));
        }
        match self.names.get(t.text) {
            Some(&i) => Ok(i),
            None => Err(self.err(
                t.col,
                format!(
                    "`{}` is not defined (a name must be defined on an earlier line)",
                    t.text
                ),
            )),
        }
    }

    fn int(&mut self, what: &str) -> Result<i64, ProgramError> {
        let t = self.take(what)?;
        parse_int(t.text).map_err(|m| self.err(t.col, format!("expected {what}, found {m}")))
    }

    fn uint(&mut self, what: &str) -> Result<usize, ProgramError> {
        let t = self.take(what)?;
        parse_uint(t.text).map_err(|m| self.err(t.col, format!("expected {what}, found {m}")))
    }

    fn float(&mut self, what: &str) -> Result<f64, ProgramError> {
        let t = self.take(what)?;
        parse_float(t.text)
            .ok_or_else(|| self.err(t.col, format!("expected {what}, found {}", show(t.text))))
    }

    /// A parameter of `spec`'s kind.
    fn param(&mut self, spec: ParamSpec) -> Result<Param, ProgramError> {
        let what = format!("{} ({})", spec.what, spec.kind.described());
        Ok(match spec.kind {
            ParamKind::Int => Param::Int(self.int(&what)?),
            ParamKind::Count => Param::Count(self.uint(&what)?),
            ParamKind::Float => Param::Float(self.float(&what)?),
            ParamKind::Subscripts => Param::Subscripts(self.subscripts(&what)?),
        })
    }

    fn subscripts(&mut self, what: &str) -> Result<Subscripts, ProgramError> {
        let t = self.take(what)?;
        Subscripts::new(t.text).ok_or_else(|| {
            self.err(
                t.col,
                format!(
                    "expected {what}, at most {} characters, found {}",
                    Subscripts::MAX_LEN,
                    show(t.text)
                ),
            )
        })
    }

    fn finish(&self) -> Result<(), ProgramError> {
        match self.peek() {
            None => Ok(()),
            Some(t) => Err(self.err(
                t.col,
                format!(
                    "expected end of line, found {} (`{}` is written `{}`)",
                    show(t.text),
                    self.op,
                    usage(self.op)
                ),
            )),
        }
    }
}

/// An integer token: `-?[0-9]+` within `i64`.
fn parse_int(t: &str) -> Result<i64, String> {
    let digits = t.strip_prefix('-').unwrap_or(t);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("{} (not an integer)", show(t)));
    }
    t.parse::<i64>()
        .map_err(|_| format!("{} (out of the 64-bit integer range)", show(t)))
}

/// A non-negative integer token: `[0-9]+` within `usize`.
fn parse_uint(t: &str) -> Result<usize, String> {
    if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
        return Err(if parse_int(t).is_ok() {
            show(t)
        } else {
            format!("{} (not a non-negative integer)", show(t))
        });
    }
    t.parse::<usize>()
        .map_err(|_| format!("{} (out of the {}-bit range)", show(t), usize::BITS))
}

/// A float token: anything Rust's `f64` parser accepts (`1`, `-0.5`, `1e-3`, `inf`, `NaN`).
fn parse_float(t: &str) -> Option<f64> {
    t.parse::<f64>().ok()
}

/// The position of the first invalid byte, as (line, column).
fn utf8_error_pos(bytes: &[u8], valid_up_to: usize) -> (usize, usize) {
    let prefix = bytes.get(..valid_up_to).unwrap_or(&[]);
    let text = std::str::from_utf8(prefix).unwrap_or("");
    let line = text.matches('\n').count() + 1;
    let last = text.rsplit('\n').next().unwrap_or("");
    (line, last.chars().count() + 1)
}

pub(crate) fn parse_bytes(bytes: &[u8]) -> Result<Program, ProgramError> {
    match std::str::from_utf8(bytes) {
        Ok(s) => parse(s),
        Err(e) => {
            let (line, column) = utf8_error_pos(bytes, e.valid_up_to());
            Err(ProgramError::Parse {
                line,
                column,
                message: "expected UTF-8 text, found an invalid byte sequence".into(),
            })
        }
    }
}

pub(crate) fn parse(text: &str) -> Result<Program, ProgramError> {
    let mut prog = Program::new();
    let mut names: HashMap<String, usize> = HashMap::new();
    let mut lines_of: Vec<usize> = Vec::new();
    for (k, raw) in text.split('\n').enumerate() {
        let line = k + 1;
        let code = match raw.find('#') {
            Some(i) => raw.get(..i).unwrap_or(""),
            None => raw,
        };
        let toks = tokenize(code);
        if toks.is_empty() {
            continue;
        }
        let end_col = code.trim_end().chars().count() + 1;
        let (stmt, cols) = statement(toks, line, end_col, &names, &lines_of)?;
        names.insert(stmt.name.clone(), prog.stmts.len());
        lines_of.push(line);
        prog.stmts.push(stmt);
        prog.spans.push(StmtSpan { line, cols });
    }
    if prog.stmts.is_empty() {
        return Err(ProgramError::Parse {
            line: 1,
            column: 1,
            message: "expected at least one statement `NAME = OP ARG...`, found none".into(),
        });
    }
    Ok(prog)
}

fn statement(
    toks: Vec<Tok<'_>>,
    line: usize,
    end_col: usize,
    names: &HashMap<String, usize>,
    lines_of: &[usize],
) -> Result<(Stmt, Vec<usize>), ProgramError> {
    let cols: Vec<usize> = toks.iter().map(|t| t.col).collect();
    let err = |column: usize, message: String| ProgramError::Parse {
        line,
        column,
        message,
    };
    let Some(&name_tok) = toks.first() else {
        return Err(err(1, "expected a statement".into()));
    };
    if !is_valid_name(name_tok.text) {
        return Err(err(
            name_tok.col,
            format!(
                "expected a statement `NAME = OP ARG...` with NAME matching [a-z_][a-z0-9_]*, \
                 found {}",
                show(name_tok.text)
            ),
        ));
    }
    if let Some(&prev) = names.get(name_tok.text) {
        let at = lines_of.get(prev).copied().unwrap_or(0);
        return Err(err(
            name_tok.col,
            format!(
                "`{}` is already defined on line {at}; each name is defined once",
                name_tok.text
            ),
        ));
    }
    match toks.get(1) {
        Some(t) if t.text == "=" => {}
        Some(t) => {
            return Err(err(
                t.col,
                format!(
                    "expected `=` after `{}`, found {}",
                    name_tok.text,
                    show(t.text)
                ),
            ))
        }
        None => {
            return Err(err(
                end_col,
                format!("expected `=` after `{}`, found end of line", name_tok.text),
            ))
        }
    }
    let op_tok = match toks.get(2) {
        Some(t) => *t,
        None => {
            return Err(err(
                end_col,
                "expected an op after `=`, found end of line".into(),
            ))
        }
    };
    let known = op_names().iter().find(|&&o| o == op_tok.text).copied();
    let op = match known.or_else(|| crate::user_op(op_tok.text).map(|u| u.name())) {
        Some(o) => o,
        None => {
            return Err(err(
                op_tok.col,
                format!(
                    "expected an op, found {}; the ops are: {}",
                    show(op_tok.text),
                    op_names().join(", ")
                ),
            ))
        }
    };
    let mut l = Line {
        toks,
        at: 3,
        line,
        end_col,
        names,
        op,
    };
    let expr = args(&mut l, op, op_tok.col)?;
    l.finish()?;
    Ok((
        Stmt {
            name: name_tok.text.to_string(),
            expr,
        },
        cols,
    ))
}

fn args(l: &mut Line<'_, '_>, op: &str, op_col: usize) -> Result<Expr, ProgramError> {
    if let Some(op) = binary_op(op) {
        let lhs = l.name("the first operand (a name)")?;
        let rhs = l.name("the second operand (a name)")?;
        return Ok(Expr::Binary { op, lhs, rhs });
    }
    if let Some(op) = unary_op(op) {
        let x = l.name("the operand (a name)")?;
        let op = match op.param() {
            None => op,
            Some(_) => {
                let what = match op {
                    UnaryOp::Powf(_) => "the exponent (a number)",
                    _ => "the constant (a number)",
                };
                op.with_param(l.float(what)?)
            }
        };
        return Ok(Expr::Unary { op, x });
    }
    if let Some(row) = op_row(op) {
        return row_args(l, row);
    }
    // A registered op (never a name of the format's: `register_op` refuses those).
    if let Some(u) = crate::user_op(op) {
        let args = (0..u.arity())
            .map(|_| l.name("an operand (a name)"))
            .collect::<Result<Vec<_>, _>>()?;
        return Ok(Expr::User { op: u.name(), args });
    }
    if op == "input" || op == "const" {
        return leaf(l, op == "input");
    }
    Err(l.err(op_col, format!("expected an op, found {}", show(op))))
}

/// A statement of the op table: the operands and the parameters in the order the row writes
/// them, a variadic tail up to the end of the line.
fn row_args(l: &mut Line<'_, '_>, row: &'static OpRow) -> Result<Expr, ProgramError> {
    let mut params = Vec::with_capacity(row.params.len());
    let mut args = Vec::with_capacity(row.arity.min());
    if row.params_first() {
        for &spec in row.params {
            params.push(l.param(spec)?);
        }
    }
    for k in 0..row.arity.min() {
        args.push(l.name(&format!("{} (a name)", row.operand_what(k)))?);
    }
    if row.params_first() {
        while !l.at_end() {
            args.push(l.name("an operand (a name)")?);
        }
    } else {
        for &spec in row.params {
            params.push(l.param(spec)?);
        }
        if let Some(spec) = row.rest {
            while !l.at_end() {
                params.push(l.param(spec)?);
            }
        }
    }
    Ok(Expr::Op {
        op: row,
        args,
        params,
    })
}

fn leaf(l: &mut Line<'_, '_>, requires_grad: bool) -> Result<Expr, ProgramError> {
    // An integer or boolean dtype names itself first (`const i64 2 : 0 1`); a dimension is a
    // number, so the two cannot be confused.
    let dtype = match l.peek() {
        Some(t) if t.text.starts_with(|c: char| c.is_ascii_alphabetic()) => {
            l.at += 1;
            match DType::parse(t.text) {
                Some(d) => Some((d, t.col)),
                None => {
                    return Err(l.err(
                        t.col,
                        format!(
                            "expected a dimension or a dtype (i64, i32, u8, bool), found {}",
                            show(t.text)
                        ),
                    ))
                }
            }
        }
        _ => None,
    };
    let mut shape = Vec::new();
    let mut numel: Option<usize> = Some(1);
    while let Some(t) = l.peek() {
        if t.text == ":" {
            break;
        }
        let d = l.uint("a dimension (a non-negative integer) or `:`")?;
        numel = numel.and_then(|n| n.checked_mul(d));
        if numel.is_none() {
            return Err(ProgramError::TooLarge {
                line: l.line,
                column: t.col,
                message: format!(
                    "the shape's element count overflows a {}-bit integer",
                    usize::BITS
                ),
            });
        }
        shape.push(d);
    }
    let values = match l.peek() {
        Some(colon) if colon.text == ":" => {
            l.at += 1;
            let n = numel.unwrap_or(0);
            let mut v = Vec::new();
            while let Some(t) = l.peek() {
                if v.len() == n {
                    return Err(l.err(
                        t.col,
                        format!(
                            "expected end of line: shape {shape:?} holds {n} value{}, and {n} \
                             {} given",
                            if n == 1 { "" } else { "s" },
                            if n == 1 { "is" } else { "are" }
                        ),
                    ));
                }
                v.push(l.float("a value (a number)")?);
            }
            if v.len() != n {
                return Err(l.err(
                    l.end_col,
                    format!(
                        "expected {n} value{} for shape {shape:?}, found {}",
                        if n == 1 { "" } else { "s" },
                        v.len()
                    ),
                ));
            }
            Some(v)
        }
        _ => None,
    };
    if let Some((d, col)) = dtype {
        if let Some(problem) =
            crate::ast::leaf_dtype_problem(requires_grad, Some(d), values.as_deref())
        {
            return Err(l.err(col, problem));
        }
    }
    Ok(Expr::Leaf {
        requires_grad,
        shape,
        values,
        dtype: dtype.map(|(d, _)| d),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_and_columns() {
        let t = tokenize("x=input 2 é:1");
        let v: Vec<(&str, usize)> = t.iter().map(|t| (t.text, t.col)).collect();
        assert_eq!(
            v,
            vec![
                ("x", 1),
                ("=", 2),
                ("input", 3),
                ("2", 9),
                ("é", 11),
                (":", 12),
                ("1", 13)
            ]
        );
    }

    #[test]
    fn invalid_utf8_is_located() {
        let e = parse_bytes(b"x = input 2\ny = \xff").unwrap_err();
        assert_eq!((e.line(), e.column()), (2, 5));
    }
}
