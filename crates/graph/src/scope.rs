//! Nested scopes inside one iteration: bounded memory for loops that never reset.
//!
//! PyTorch frees a tensor when its last reference goes; the arena frees an iteration at its
//! reset. A loop that stays inside one iteration — generating tokens under `no_grad`, evaluating
//! a validation set — would grow without bound. [`Graph::scope`] runs a closure and then rolls
//! the iteration back to where it was, as a bump allocator rolls back to a mark: every node and
//! host buffer made inside is freed at once (device buffers go back to their cache), and the
//! closure's result is carried out by copying ([`Keep`]).

use crate::error::{GraphError, Result};
use crate::store::StoreMark;
use crate::{Device, Graph, HostTensor, Tensor};
use arenagrad_alloc::ArenaMark;

/// What a scope's closure may return: values kept by copying across the rollback. Tensors
/// come out as constants (leaves without history) on the device they were on; plain values
/// as they are.
pub trait Keep<'g>: Sized {
    /// The value while the scope rolls back (holding nothing of the scope's memory).
    type Saved;
    /// Copies what must survive out of the scope's memory.
    fn save(self) -> Result<Self::Saved>;
    /// Brings it back into the enclosing scope.
    fn restore(saved: Self::Saved, g: &'g Graph) -> Result<Self>;
}

impl<'g> Keep<'g> for Tensor<'g> {
    type Saved = (HostTensor, Device);
    fn save(self) -> Result<Self::Saved> {
        Ok((self.to_host()?, self.device()))
    }
    fn restore((h, dev): Self::Saved, g: &'g Graph) -> Result<Self> {
        g.from_host(&h)?.to_device(dev)
    }
}

macro_rules! keep_plain {
    ($($t:ty),*) => {$(
        impl<'g> Keep<'g> for $t {
            type Saved = $t;
            fn save(self) -> Result<$t> {
                Ok(self)
            }
            fn restore(saved: $t, _g: &'g Graph) -> Result<$t> {
                Ok(saved)
            }
        }
    )*};
}
keep_plain!((), bool, usize, u64, i64, f32, f64, u32, String, HostTensor);

impl<'g, A: Keep<'g>> Keep<'g> for Vec<A> {
    type Saved = Vec<A::Saved>;
    fn save(self) -> Result<Self::Saved> {
        self.into_iter().map(A::save).collect()
    }
    fn restore(saved: Self::Saved, g: &'g Graph) -> Result<Self> {
        saved.into_iter().map(|s| A::restore(s, g)).collect()
    }
}

impl<'g, A: Keep<'g>> Keep<'g> for Option<A> {
    type Saved = Option<A::Saved>;
    fn save(self) -> Result<Self::Saved> {
        self.map(A::save).transpose()
    }
    fn restore(saved: Self::Saved, g: &'g Graph) -> Result<Self> {
        saved.map(|s| A::restore(s, g)).transpose()
    }
}

macro_rules! keep_tuple {
    ($($n:tt $t:ident),+) => {
        impl<'g, $($t: Keep<'g>),+> Keep<'g> for ($($t,)+) {
            type Saved = ($($t::Saved,)+);
            fn save(self) -> Result<Self::Saved> {
                Ok(($(self.$n.save()?,)+))
            }
            fn restore(saved: Self::Saved, g: &'g Graph) -> Result<Self> {
                Ok(($($t::restore(saved.$n, g)?,)+))
            }
        }
    };
}
keep_tuple!(0 A, 1 B);
keep_tuple!(0 A, 1 B, 2 C);
keep_tuple!(0 A, 1 B, 2 C, 3 D);

/// Where an iteration stands: its nodes, tape and host arena.
struct Mark {
    nodes: StoreMark,
    tape: usize,
    temp_log: usize,
    hooks: usize,
    param_leaves: usize,
    arena: ArenaMark,
}

impl Graph {
    /// Runs `f` in a nested scope of the iteration, with recording off (as under
    /// [`Graph::no_grad`]), then frees everything it made — nodes, host buffers, device
    /// buffers — at once, as a bump allocator rolls back to a mark. What `f` returns is copied
    /// out first and back in after ([`Keep`]): a tensor comes back as a constant of the
    /// enclosing scope. Tensors made inside and kept by other means go stale (using one is a
    /// [`crate::GraphError::StaleTensor`] error, never a read of freed memory). Tensors of the
    /// enclosing scope are untouched and usable inside. A leaf of the enclosing scope set to
    /// require grad inside keeps the flag after it, and receives its gradient from a later
    /// backward, as PyTorch's `requires_grad_()` under `no_grad` does.
    ///
    /// The loop this is for — generation, evaluation — then runs in flat memory without a
    /// reset per step (host buffers reuse the arena's region from the second iteration on,
    /// once a reset has sized it):
    ///
    /// ```
    /// use arenagrad_graph::{DType, Graph};
    /// let mut g = Graph::new();
    /// let w = g.randn(&[64, 64], DType::F32)?;
    /// let mut x = g.randn(&[1, 64], DType::F32)?;
    /// let start = g.stats().arena.bytes_in_use;
    /// for _ in 0..100 {
    ///     x = g.scope(|_| x.matmul(w)?.tanh()?.matmul(w)?.tanh())?;
    /// }
    /// // One kept [1, 64] tensor per step: the intermediates are gone.
    /// assert!(g.stats().arena.bytes_in_use < start + 100 * 2 * 64 * 4);
    /// # Ok::<(), arenagrad_graph::GraphError>(())
    /// ```
    pub fn scope<'g, R: Keep<'g>>(&'g self, f: impl FnOnce(&'g Graph) -> Result<R>) -> Result<R> {
        self.try_scope(f)
    }

    /// [`Graph::scope`] for a closure with an error type of its own (one a [`GraphError`]
    /// converts into, such as a layer library's).
    pub fn try_scope<'g, R: Keep<'g>, E: From<GraphError>>(
        &'g self,
        f: impl FnOnce(&'g Graph) -> std::result::Result<R, E>,
    ) -> std::result::Result<R, E> {
        let mark = self.mark_scope();
        let saved = {
            let _ng = self.no_grad();
            f(self).and_then(|r| r.save().map_err(E::from))
        };
        self.rollback_scope(mark);
        Ok(R::restore(saved?, self)?)
    }

    fn mark_scope(&self) -> Mark {
        let mut i = self.inner();
        Mark {
            nodes: i.nodes.mark(),
            tape: i.tape.len(),
            temp_log: i.temp_log.len(),
            hooks: i.hooks.len(),
            param_leaves: i.param_leaves.len(),
            arena: i.arena.mark(),
        }
    }

    fn rollback_scope(&self, mark: Mark) {
        let mut guard = self.inner();
        let i = &mut *guard;
        // Device buffers go back to their cache one by one (the host arena rolls back whole).
        let on_device: Vec<(Device, arenagrad_alloc::BufId)> = i
            .nodes
            .live_since(mark.nodes)
            .filter(|n| n.device() != Device::Cpu)
            .map(|n| (n.device(), n.buf))
            .collect();
        for (dev, buf) in on_device {
            // A buffer already let go (a view's) is no error here: the scope ends either way.
            let _ = i.release_buf(dev, buf);
        }
        let extra: Vec<_> = i.tape.drain(mark.tape.min(i.tape.len())..).collect();
        i.temp_log.truncate(mark.temp_log);
        // Hooks registered inside go with the scope (on its nodes, or on older ones).
        i.hooks.truncate(mark.hooks);
        i.param_leaves.truncate(mark.param_leaves);
        i.nodes.rollback(mark.nodes);
        i.arena.rollback(mark.arena);
        // What the tape gained inside and outlives the scope: leaves of the enclosing scope set
        // to require grad inside it. They go back on the tape, in the order they went on, so
        // their flag and their gradient agree (PyTorch's `requires_grad_()` under `no_grad`
        // sticks, and backward fills `.grad`). Dropping them from the tape with the flag left on
        // lost their gradient without a word; turning the flag off behind the user's back, or
        // refusing the call, would surprise a user who wrote PyTorch's code.
        for id in extra {
            let pos = i.tape.len() as u32;
            if let Some(n) = i.nodes.get_mut(id) {
                if n.requires_grad {
                    n.tape_pos = pos;
                    i.tape.push(id);
                } else {
                    n.tape_pos = crate::graph::NO_POS;
                }
            }
        }
    }
}
