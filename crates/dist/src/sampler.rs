//! [`DistributedSampler`]: each rank's share of a dataset, PyTorch's rules.

use arenagrad_graph::{GraphError, Rng};

use crate::comm::Communicator;
use crate::error::Result;

/// Which examples each rank reads in an epoch: one permutation of the dataset (seeded by
/// `seed + epoch`, so every rank computes the same one without talking), dealt round-robin —
/// rank `r` takes positions `r, r + world, r + 2·world, …`. The shares are disjoint and, with
/// `drop_last` off, cover the dataset: when it does not divide evenly the permutation is padded
/// with its own first elements so that every rank has the same number of examples (and runs
/// the same number of steps). PyTorch's `DistributedSampler`.
#[derive(Debug, Clone)]
pub struct DistributedSampler {
    len: usize,
    rank: usize,
    world: usize,
    seed: u64,
    shuffle: bool,
    drop_last: bool,
}

impl DistributedSampler {
    /// This rank's sampler over a dataset of `len` examples, shuffled, padded.
    pub fn new(len: usize, comm: &dyn Communicator, seed: u64) -> DistributedSampler {
        DistributedSampler::for_rank(len, comm.rank(), comm.world_size(), seed)
    }

    /// The sampler of rank `rank` of `world` (`rank < world`; a rank outside is taken as the
    /// last).
    pub fn for_rank(len: usize, rank: usize, world: usize, seed: u64) -> DistributedSampler {
        let world = world.max(1);
        DistributedSampler {
            len,
            rank: rank.min(world - 1),
            world,
            seed,
            shuffle: true,
            drop_last: false,
        }
    }

    /// Keep the dataset's order (no permutation).
    pub fn shuffle(mut self, shuffle: bool) -> Self {
        self.shuffle = shuffle;
        self
    }

    /// Drop the tail that does not divide evenly instead of padding.
    pub fn drop_last(mut self, drop_last: bool) -> Self {
        self.drop_last = drop_last;
        self
    }

    /// The number of examples each rank reads per epoch.
    pub fn num_samples(&self) -> usize {
        if self.drop_last {
            self.len / self.world
        } else {
            self.len.div_ceil(self.world)
        }
    }

    /// This rank's example indices for `epoch`, in the order to read them. A dataset whose
    /// order the host cannot hold is [`GraphError::OutOfMemory`] (one whose padded length
    /// overflows, [`GraphError::TooLarge`]), not an abort.
    pub fn indices(&self, epoch: u64) -> Result<Vec<usize>> {
        const OP: &str = "DistributedSampler::indices";
        let share = self.num_samples();
        let total = share
            .checked_mul(self.world)
            .ok_or_else(|| GraphError::TooLarge {
                op: OP,
                shape: vec![share, self.world],
            })?;
        if self.len == 0 {
            return Ok(Vec::new());
        }
        // Room for the padded permutation, then for this rank's share of it, reserved before
        // anything is drawn.
        let mut order = try_vec(OP, self.len, total.max(self.len))?;
        let mut mine = try_vec(OP, self.len, share)?;
        order.extend(0..self.len);
        if self.shuffle {
            // The same draws as `Rng::permutation`.
            Rng::seed(self.seed.wrapping_add(epoch)).shuffle(&mut order);
        }
        // Pad by repeating the permutation from its start (more than once for a dataset smaller
        // than the world), or cut the tail.
        let mut k = 0;
        while order.len() < total {
            order.push(order[k]);
            k += 1;
        }
        order.truncate(total);
        mine.extend(order.into_iter().skip(self.rank).step_by(self.world));
        Ok(mine)
    }
}

/// An empty vector with room for `n` indices (of a dataset of `len`), reserved fallibly.
fn try_vec(op: &'static str, len: usize, n: usize) -> Result<Vec<usize>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n)
        .map_err(|_| GraphError::OutOfMemory {
            op,
            shape: vec![len],
            bytes: n.saturating_mul(std::mem::size_of::<usize>()),
        })?;
    Ok(v)
}
