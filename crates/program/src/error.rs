//! The error of parsing, checking and running a program.

use arenagrad_graph::GraphError;

/// What went wrong with a program, and where: every variant names the line and the column
/// (both 1-based, columns counted in characters) of the token at fault.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ProgramError {
    /// The text is not a program: a malformed statement, an unknown op or name, a bad number.
    Parse {
        /// Line, 1-based.
        line: usize,
        /// Column, 1-based, in characters.
        column: usize,
        /// What was expected and what was found.
        message: String,
    },
    /// A well-formed statement whose operands do not fit the op: shapes that do not broadcast,
    /// an axis out of range, a reshape that changes the element count.
    Shape {
        /// Line, 1-based.
        line: usize,
        /// Column, 1-based, in characters.
        column: usize,
        /// What was expected and what was found.
        message: String,
    },
    /// A tensor, or the program as a whole, is larger than the [`Limits`](super::Limits) allow.
    /// Reported before anything is allocated.
    TooLarge {
        /// Line, 1-based.
        line: usize,
        /// Column, 1-based, in characters.
        column: usize,
        /// Which limit, and by how much.
        message: String,
    },
    /// The engine refused a statement (or the backward pass from the output).
    Engine {
        /// Line, 1-based.
        line: usize,
        /// Column, 1-based, in characters.
        column: usize,
        /// The engine's error.
        source: GraphError,
    },
    /// The engine produced a tensor of another shape than the program's shape rules predict
    /// (for example because an [`OpImpl`](super::OpImpl) override changed it).
    Internal {
        /// Line, 1-based.
        line: usize,
        /// Column, 1-based, in characters.
        column: usize,
        /// What disagreed.
        message: String,
    },
}

impl ProgramError {
    /// The line of the statement at fault (1-based).
    pub fn line(&self) -> usize {
        match self {
            ProgramError::Parse { line, .. }
            | ProgramError::Shape { line, .. }
            | ProgramError::TooLarge { line, .. }
            | ProgramError::Engine { line, .. }
            | ProgramError::Internal { line, .. } => *line,
        }
    }

    /// The column of the token at fault (1-based, in characters).
    pub fn column(&self) -> usize {
        match self {
            ProgramError::Parse { column, .. }
            | ProgramError::Shape { column, .. }
            | ProgramError::TooLarge { column, .. }
            | ProgramError::Engine { column, .. }
            | ProgramError::Internal { column, .. } => *column,
        }
    }

    /// The message, without the position.
    pub fn message(&self) -> String {
        match self {
            ProgramError::Parse { message, .. }
            | ProgramError::Shape { message, .. }
            | ProgramError::TooLarge { message, .. }
            | ProgramError::Internal { message, .. } => message.clone(),
            ProgramError::Engine { source, .. } => source.to_string(),
        }
    }
}

impl std::fmt::Display for ProgramError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self {
            ProgramError::Parse { .. } => "parse error",
            ProgramError::Shape { .. } => "shape error",
            ProgramError::TooLarge { .. } => "too large",
            ProgramError::Engine { .. } => "engine error",
            ProgramError::Internal { .. } => "internal error",
        };
        write!(
            f,
            "line {}, column {}: {kind}: {}",
            self.line(),
            self.column(),
            self.message()
        )
    }
}

impl std::error::Error for ProgramError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ProgramError::Engine { source, .. } => Some(source),
            _ => None,
        }
    }
}
