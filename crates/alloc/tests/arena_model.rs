//! The host arena against a model of what it promises: random sequences of allocations (owned
//! and shared, small and large), writes, reads, extra owners, recycling, nested marks and
//! rollbacks (to open marks, forgotten ones and ones already rolled back to) and resets. After
//! every step each buffer the model calls live reads back exactly the values last written to it
//! (so no two live buffers share memory), each one it calls dead is a stale-handle error, a read
//! as the wrong type is a type error, a write to a shared buffer is refused, and the arena's
//! counts of live buffers and bytes agree with the model.

use std::sync::Arc;

use arenagrad_alloc::{AllocError, Arena, ArenaMark, BufId};
use proptest::prelude::*;

/// One step of a random program over the arena. Indices pick among the handles (or marks) made
/// so far, modulo their count, so every index is meaningful whatever came before.
#[derive(Debug, Clone)]
enum Step {
    /// A new owned buffer of `len` values: zeros, a copy of a slice, or from a function.
    Alloc {
        len: usize,
        how: u8,
    },
    /// A new read-only buffer over memory the caller owns.
    Shared {
        len: usize,
    },
    /// Overwrite buffer `k` whole.
    Write {
        k: usize,
    },
    /// `out[i] = a[i] + b[i]` through one split borrow (out among the inputs is refused).
    Add {
        out: usize,
        a: usize,
        b: usize,
    },
    /// Read buffer `k` as the wrong element type.
    WrongType {
        k: usize,
    },
    /// A second owner for buffer `k` (a view).
    Retain {
        k: usize,
    },
    /// One owner of buffer `k` lets go.
    Recycle {
        k: usize,
    },
    Mark,
    /// Roll back to the `k`-th mark ever made (open, forgotten or already rolled back to).
    Rollback {
        k: usize,
    },
    Reset,
}

fn step() -> impl Strategy<Value = Step> {
    // Under Miri the large buffers stay a few hundred values: it checks every byte read.
    let large = if cfg!(miri) {
        300usize..400
    } else {
        4000usize..9000
    };
    let len = prop_oneof![0usize..20, 20usize..700, large];
    prop_oneof![
        6 => (len.clone(), 0u8..3).prop_map(|(len, how)| Step::Alloc { len, how }),
        1 => (0usize..40).prop_map(|len| Step::Shared { len }),
        3 => any::<usize>().prop_map(|k| Step::Write { k }),
        2 => (any::<usize>(), any::<usize>(), any::<usize>())
            .prop_map(|(out, a, b)| Step::Add { out, a, b }),
        1 => any::<usize>().prop_map(|k| Step::WrongType { k }),
        1 => any::<usize>().prop_map(|k| Step::Retain { k }),
        3 => any::<usize>().prop_map(|k| Step::Recycle { k }),
        2 => Just(Step::Mark),
        2 => any::<usize>().prop_map(|k| Step::Rollback { k }),
        1 => Just(Step::Reset),
    ]
}

/// What the model knows of one handle ever handed out.
struct Buf {
    id: BufId,
    /// The values it must hold while live.
    values: Vec<f32>,
    /// Owners left; 0: dead (recycled, rolled back or reset).
    holders: u32,
    shared: bool,
    /// Its bytes as the arena counts them (owned buffers only).
    bytes: usize,
}

/// What the model knows of one mark ever made.
struct MarkModel {
    mark: ArenaMark,
    /// Handles made before it (its rollback kills the ones after).
    bufs_before: usize,
}

#[derive(Default)]
struct Model {
    bufs: Vec<Buf>,
    marks: Vec<MarkModel>,
    /// Indices into `marks` of the open ones, outermost first.
    open: Vec<usize>,
    /// A counter that makes every write's values new.
    stamp: f32,
}

/// The bytes the arena reserves for `len` `f32`s: at least one byte, rounded up to 16 up to 48
/// bytes and to 64-byte lines above.
fn bytes_of(len: usize) -> usize {
    let raw = (len * 4).max(1);
    if raw <= 48 {
        raw.div_ceil(16) * 16
    } else {
        raw.div_ceil(64) * 64
    }
}

impl Model {
    fn fresh(&mut self, len: usize) -> Vec<f32> {
        self.stamp += 1.0;
        let s = self.stamp;
        (0..len).map(|i| s * 1000.0 + i as f32).collect()
    }

    fn pick(&self, k: usize) -> Option<usize> {
        (!self.bufs.is_empty()).then(|| k % self.bufs.len())
    }

    fn live(&self) -> impl Iterator<Item = &Buf> {
        self.bufs.iter().filter(|b| b.holders > 0)
    }

    fn kill_from(&mut self, first: usize) {
        for b in &mut self.bufs[first..] {
            b.holders = 0;
        }
    }
}

fn is_stale(e: &AllocError) -> bool {
    matches!(e, AllocError::StaleBuffer { .. })
}

fn run(steps: &[Step]) -> Result<(), TestCaseError> {
    let mut arena = Arena::new();
    let mut m = Model::default();
    for (at, s) in steps.iter().enumerate() {
        match *s {
            Step::Alloc { len, how } => {
                let (id, values) = match how {
                    0 => (arena.alloc_zeroed::<f32>(len).unwrap(), vec![0.0; len]),
                    1 => {
                        let v = m.fresh(len);
                        (arena.alloc_from_slice(&v).unwrap(), v)
                    }
                    _ => {
                        let v = m.fresh(len);
                        (arena.alloc_with(len, |i| v[i]).unwrap(), v)
                    }
                };
                m.bufs.push(Buf {
                    id,
                    values,
                    holders: 1,
                    shared: false,
                    bytes: bytes_of(len),
                });
                prop_assert_eq!(arena.len_of(id).unwrap(), len);
            }
            Step::Shared { len } => {
                let v = m.fresh(len);
                let owner = Arc::new(v.clone());
                let id = arena
                    .alloc_shared(owner, |v: &Vec<f32>| v.as_slice())
                    .unwrap();
                m.bufs.push(Buf {
                    id,
                    values: v,
                    holders: 1,
                    shared: true,
                    bytes: 0,
                });
            }
            Step::Write { k } => {
                let Some(k) = m.pick(k) else { continue };
                let v = m.fresh(m.bufs[k].values.len());
                let b = &mut m.bufs[k];
                match arena.slice_mut::<f32>(b.id) {
                    Ok(out) => {
                        prop_assert!(b.holders > 0 && !b.shared, "step {at}: wrote {:?}", b.id);
                        out.copy_from_slice(&v);
                        b.values = v;
                    }
                    Err(AllocError::ReadOnly { .. }) => prop_assert!(b.shared && b.holders > 0),
                    Err(e) => prop_assert!(is_stale(&e) && b.holders == 0, "step {at}: {e}"),
                }
            }
            Step::Add { out, a, b } => {
                let (Some(o), Some(a), Some(b)) = (m.pick(out), m.pick(a), m.pick(b)) else {
                    continue;
                };
                let ok = [o, a, b].iter().all(|&i| m.bufs[i].holders > 0)
                    && !m.bufs[o].shared
                    && o != a
                    && o != b;
                let ids = [m.bufs[a].id, m.bufs[b].id];
                match arena.split_mut::<f32, 2>(m.bufs[o].id, ids) {
                    Ok((out, [x, y])) => {
                        prop_assert!(ok, "step {at}: split {o} from [{a}, {b}]");
                        for ((o, x), y) in out.iter_mut().zip(x).zip(y) {
                            *o = x + y;
                        }
                        let n = m.bufs[o].values.len();
                        let sum: Vec<f32> = (0..n)
                            .map(
                                |i| match (m.bufs[a].values.get(i), m.bufs[b].values.get(i)) {
                                    (Some(x), Some(y)) => x + y,
                                    _ => m.bufs[o].values[i],
                                },
                            )
                            .collect();
                        m.bufs[o].values = sum;
                    }
                    Err(e) => prop_assert!(!ok, "step {at}: {e}"),
                }
            }
            Step::WrongType { k } => {
                let Some(k) = m.pick(k) else { continue };
                let b = &m.bufs[k];
                let e = arena.slice::<f64>(b.id).unwrap_err();
                if b.holders > 0 {
                    prop_assert!(matches!(e, AllocError::WrongType { .. }), "step {at}: {e}");
                } else {
                    prop_assert!(is_stale(&e), "step {at}: {e}");
                }
            }
            Step::Retain { k } => {
                let Some(k) = m.pick(k) else { continue };
                let b = &mut m.bufs[k];
                match arena.retain(b.id) {
                    Ok(()) => {
                        prop_assert!(b.holders > 0);
                        b.holders += 1;
                    }
                    Err(e) => prop_assert!(is_stale(&e) && b.holders == 0, "step {at}: {e}"),
                }
            }
            Step::Recycle { k } => {
                let Some(k) = m.pick(k) else { continue };
                let b = &mut m.bufs[k];
                match arena.recycle(b.id) {
                    Ok(()) => {
                        prop_assert!(b.holders > 0);
                        b.holders -= 1;
                    }
                    Err(e) => prop_assert!(is_stale(&e) && b.holders == 0, "step {at}: {e}"),
                }
            }
            Step::Mark => {
                let mark = arena.mark();
                m.open.push(m.marks.len());
                m.marks.push(MarkModel {
                    mark,
                    bufs_before: m.bufs.len(),
                });
            }
            Step::Rollback { k } => {
                if m.marks.is_empty() {
                    continue;
                }
                let k = k % m.marks.len();
                arena.rollback(m.marks[k].mark);
                if let Some(depth) = m.open.iter().position(|&o| o == k) {
                    m.open.truncate(depth);
                    let first = m.marks[k].bufs_before;
                    m.kill_from(first);
                }
            }
            Step::Reset => {
                arena.reset();
                m.open.clear();
                m.kill_from(0);
            }
        }
        // Every handle reads back what the model says, or is stale where the model says dead.
        for (i, b) in m.bufs.iter().enumerate() {
            match arena.slice::<f32>(b.id) {
                Ok(v) => {
                    prop_assert!(b.holders > 0, "step {at}: buffer {i} dead but readable");
                    prop_assert!(v == b.values.as_slice(), "step {at}: buffer {i} changed");
                }
                Err(e) => prop_assert!(
                    is_stale(&e) && b.holders == 0,
                    "step {at}: buffer {i} (holders {}): {e}",
                    b.holders
                ),
            }
        }
        let stats = arena.stats();
        prop_assert_eq!(stats.live_buffers, m.live().count(), "step {}", at);
        let bytes: usize = m.live().filter(|b| !b.shared).map(|b| b.bytes).sum();
        prop_assert_eq!(stats.bytes_in_use, bytes, "step {}", at);
    }
    Ok(())
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: if cfg!(miri) { 2 } else { 256 },
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn the_arena_does_what_its_model_says(
        steps in prop::collection::vec(step(), 1..if cfg!(miri) { 24 } else { 160 }),
    ) {
        run(&steps)?;
    }
}

/// The case that found a real defect: a mark forgotten by a rollback to an earlier one, then
/// rolled back to after a newer mark took its depth, rolled back the newer scope (freeing
/// buffers its owner still used).
#[test]
fn a_forgotten_mark_leaves_the_newer_mark_at_its_depth_alone() {
    use Step::*;
    run(&[
        Mark,
        Mark,
        Rollback { k: 0 },
        Mark,
        Mark,
        Alloc { len: 3, how: 1 },
        Rollback { k: 1 },
    ])
    .unwrap();
    // And a mark already rolled back to, used again after a newer mark took its depth.
    run(&[
        Mark,
        Rollback { k: 0 },
        Mark,
        Alloc { len: 5, how: 2 },
        Rollback { k: 0 },
    ])
    .unwrap();
}
