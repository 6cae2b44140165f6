//! NCCL in a world of one (this process, GPU 0): the code path of a multi-GPU run. Skips with
//! its reason without a GPU, the driver or NCCL, unless `ARENAGRAD_TEST_CUDA=1` (a GPU machine),
//! where not starting is a failure.

mod common;

use std::sync::Arc;

use arenagrad_dist::{Communicator, DataParallel, DdpConfig, NcclConfig, ProcessGroup, Reduce};
use arenagrad_graph::testing::{skip_or_fail, TEST_CUDA};
use arenagrad_graph::HostData;
use arenagrad_nn::optim::Optimizer;
use arenagrad_nn::Graph;
use common::*;

fn group() -> Option<ProcessGroup> {
    match ProcessGroup::nccl_single(NcclConfig::default()) {
        Ok(pg) => Some(pg),
        Err(e) => {
            skip_or_fail(TEST_CUDA, format_args!("NCCL does not start: {e}"));
            None
        }
    }
}

#[test]
fn a_world_of_one_over_nccl_reduces_and_trains_as_the_bare_module() {
    let Some(pg) = group() else { return };
    assert_eq!((pg.rank(), pg.world_size(), pg.backend()), (0, 1, "nccl"));
    let v = HostData::F32(vec![1.5, -2.0, 3.25]);
    for op in [Reduce::Sum, Reduce::Mean, Reduce::Max, Reduce::Min] {
        assert_eq!(pg.all_reduce(v.clone(), op).unwrap(), v, "{op:?}");
    }
    let w = HostData::F64(vec![0.1, 0.2]);
    assert_eq!(pg.broadcast(w.clone(), 0).unwrap(), w);
    assert!(pg.broadcast(w, 1).is_err());
    pg.barrier().unwrap();

    let bare = bare(5);
    let model = DataParallel::new(cnn(), Arc::new(pg), DdpConfig::default()).unwrap();
    let mut opt = sgd(&model);
    let mut g = Graph::with_threads(1);
    for step in 0..5 {
        opt.zero_grad();
        backward(&model, &mut g, step, 0..32);
        let stats = model.step(&mut opt).unwrap();
        assert_eq!(stats.started_in_backward, stats.buckets);
    }
    assert_same(&weights(&model), &bare, "wrapped vs bare");
}
