//! Errors of communication and data-parallel training.

use arenagrad_graph::GraphError;
use arenagrad_nn::NnError;

/// What can go wrong between ranks.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DistError {
    /// A collective did not complete in time: a peer rank died, hangs, or never called it.
    #[error(
        "{op} on rank {rank} of {world}: no answer from the other ranks within {secs:.1} s; \
         a peer rank may have died or stopped taking part"
    )]
    Timeout {
        /// The collective.
        op: &'static str,
        /// This process's rank.
        rank: usize,
        /// The number of ranks.
        world: usize,
        /// How long it waited.
        secs: f64,
    },
    /// An earlier failure left the communicator unusable (its transport may still be inside
    /// the collective that failed).
    #[error("{op}: the communicator is unusable after an earlier failure: {first}")]
    Poisoned {
        /// The operation refused.
        op: &'static str,
        /// The first failure.
        first: String,
    },
    /// The transport (MPI, NCCL) failed or could not start.
    #[error("{op}: {what}")]
    Backend {
        /// The operation.
        op: &'static str,
        /// The transport's words.
        what: String,
    },
    /// An argument no rank could use (a root beyond the world, a buffer of the wrong size).
    #[error("{op}: {what}")]
    BadArgument {
        /// The operation.
        op: &'static str,
        /// What is wrong.
        what: String,
    },
    /// The ranks disagree where they must agree (different models, say).
    #[error("{op}: the ranks disagree: {what}")]
    Mismatch {
        /// The operation.
        op: &'static str,
        /// What differs.
        what: String,
    },
    /// A module, optimiser or checkpoint failed.
    #[error(transparent)]
    Nn(#[from] NnError),
    /// A tensor operation failed.
    #[error(transparent)]
    Graph(#[from] GraphError),
}

/// A `Result` with [`DistError`].
pub type Result<T, E = DistError> = std::result::Result<T, E>;
