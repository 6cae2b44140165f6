//! Evaluation metrics computed on the host.
//!
//! ```
//! use arenagrad_nn::{metrics, DType, Graph};
//! let g = Graph::new();
//! let logits = g.from_f64(&[0.1, 2.0, 3.0, -1.0, 0.0, 0.5], &[3, 2], DType::F32)?;
//! assert_eq!(metrics::argmax_rows(logits)?, vec![1, 0, 1]);
//! assert_eq!(metrics::accuracy(logits, &[1, 0, 0])?, 2.0 / 3.0);
//! # Ok::<(), arenagrad_nn::NnError>(())
//! ```

use arenagrad_graph::Tensor;

use crate::error::{input_shape, NnError, Result};

/// The index of the largest value in each row of a `[N, C]` tensor (the first one on ties;
/// NaN counts as largest).
pub fn argmax_rows(scores: Tensor<'_>) -> Result<Vec<usize>> {
    let s = scores.try_shape()?;
    if s.len() != 2 || s[1] == 0 {
        return Err(input_shape("argmax_rows", "[N, C] with C ≥ 1", &s));
    }
    Ok(scores.argmax_axis(1)?)
}

/// The fraction of rows of `[N, C]` scores whose argmax is the target class (0 for no rows).
pub fn accuracy(scores: Tensor<'_>, targets: &[usize]) -> Result<f64> {
    let right = correct(scores, targets)?;
    Ok(if targets.is_empty() {
        0.0
    } else {
        right as f64 / targets.len() as f64
    })
}

/// The number of rows of `[N, C]` scores whose argmax is the target class (to sum over batches).
pub fn correct(scores: Tensor<'_>, targets: &[usize]) -> Result<usize> {
    let pred = argmax_rows(scores)?;
    if pred.len() != targets.len() {
        return Err(NnError::TargetCount {
            op: "accuracy",
            predictions: pred.len(),
            targets: targets.len(),
        });
    }
    Ok(pred.iter().zip(targets).filter(|(p, t)| p == t).count())
}
