//! `DistributedSampler`: disjoint shares that cover the dataset, the same order on every rank,
//! a new order each epoch, PyTorch's padding and `drop_last`.

use arenagrad_dist::{DistError, DistributedSampler};
use arenagrad_graph::GraphError;

fn shares(len: usize, world: usize, epoch: u64) -> Vec<Vec<usize>> {
    (0..world)
        .map(|r| {
            DistributedSampler::for_rank(len, r, world, 3)
                .indices(epoch)
                .unwrap()
        })
        .collect()
}

#[test]
fn shares_are_disjoint_cover_the_dataset_and_agree_between_ranks() {
    for world in [1, 2, 3, 4] {
        let s = shares(120, world, 0);
        let mut all: Vec<usize> = s.concat();
        assert!(s.iter().all(|x| x.len() == 120 / world));
        all.sort_unstable();
        assert_eq!(all, (0..120).collect::<Vec<_>>(), "world {world}");
        // Every rank computes the same permutation: the same shares on a second computation.
        assert_eq!(s, shares(120, world, 0));
    }
    // Shuffled, and differently each epoch.
    assert_ne!(
        shares(120, 2, 0)[0],
        (0..120).step_by(2).collect::<Vec<_>>()
    );
    assert_ne!(shares(120, 2, 0), shares(120, 2, 1));
}

#[test]
fn an_uneven_dataset_is_padded_from_its_start_or_cut() {
    // 10 examples on 4 ranks: 3 each, the first two of the permutation read twice.
    let s = shares(10, 4, 5);
    assert!(s.iter().all(|x| x.len() == 3));
    let mut all = s.concat();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all, (0..10).collect::<Vec<_>>());
    let cut: Vec<Vec<usize>> = (0..4)
        .map(|r| {
            DistributedSampler::for_rank(10, r, 4, 3)
                .drop_last(true)
                .indices(5)
                .unwrap()
        })
        .collect();
    assert!(cut.iter().all(|x| x.len() == 2));
    let mut all = cut.concat();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), 8, "disjoint");
    // Unshuffled: rank r reads r, r + world, …
    let plain = DistributedSampler::for_rank(10, 1, 4, 0).shuffle(false);
    assert_eq!(plain.indices(0).unwrap(), [1, 5, 9]);
    // Fewer examples than ranks still gives every rank one.
    assert!(shares(2, 4, 0).iter().all(|x| x.len() == 1));
    assert!(shares(0, 4, 0).iter().all(Vec::is_empty));
}

#[test]
fn a_dataset_too_large_to_hold_is_a_typed_error_not_an_abort() {
    // 2^44 indices: 128 TiB, more than the address space holds; shuffled or not.
    for shuffle in [true, false] {
        let s = DistributedSampler::for_rank(1 << 44, 1, 2, 0).shuffle(shuffle);
        match s.indices(0) {
            Err(DistError::Graph(GraphError::OutOfMemory { op, shape, bytes })) => {
                assert_eq!(op, "DistributedSampler::indices");
                assert_eq!(shape, [1 << 44]);
                assert_eq!(bytes, 8 << 44);
            }
            other => panic!("shuffle {shuffle}: {:?}", other.map(|v| v.len())),
        }
    }
    // Padded to a multiple of the world, usize::MAX examples overflow.
    match DistributedSampler::for_rank(usize::MAX, 0, 2, 0).indices(0) {
        Err(DistError::Graph(GraphError::TooLarge { op, shape })) => {
            assert_eq!(op, "DistributedSampler::indices");
            assert_eq!(shape, [usize::MAX / 2 + 1, 2]);
        }
        other => panic!("{:?}", other.map(|v| v.len())),
    }
}
