//! Integer tensors at the nn layer: class targets as `i64` tensors (PyTorch's `target`, with
//! Hugging Face's −100 padding ignored), and integer and boolean tensors through safetensors.

use std::path::Path;

use arenagrad_graph::{Bool, DType, Graph, HostData, HostTensor};
use arenagrad_nn::checkpoint::{tensors_from_bytes, tensors_to_bytes};
use arenagrad_nn::loss::{self, CrossEntropyOptions, Reduction};
use arenagrad_nn::NnError;

const LOGITS: [f64; 9] = [0.5, -1.0, 2.0, 0.1, 0.2, 0.3, 1.5, 0.0, -0.5];

#[test]
fn cross_entropy_takes_an_i64_target_tensor_with_minus_100_ignored() {
    let g = Graph::new();
    let x = g.leaf(&LOGITS, &[3, 3], DType::F64).unwrap();
    let t = g.from_slice(&[2i64, -100, 0], &[3]).unwrap();
    let opts = CrossEntropyOptions {
        ignore_index: Some(-100),
        ..Default::default()
    };
    // F.cross_entropy(x, torch.tensor([2, -100, 0])) in float64: 0.27383350444315185, and
    // 0.5476670088863037 with reduction='sum'.
    let mean = loss::cross_entropy_by(x, t, opts).unwrap().item().unwrap();
    assert!((mean - 0.273_833_504_443_151_85).abs() < 1e-12, "{mean}");
    let sum = loss::cross_entropy_by(
        x,
        t,
        CrossEntropyOptions {
            reduction: Reduction::Sum,
            ..opts
        },
    )
    .unwrap()
    .item()
    .unwrap();
    assert!((sum - 0.547_667_008_886_303_7).abs() < 1e-12, "{sum}");
    // The same targets as a slice give the same loss (without the ignored row).
    let rows = x.index_select(0, &[0, 2]).unwrap();
    let plain = loss::cross_entropy(rows, &[2, 0]).unwrap().item().unwrap();
    assert!((plain - mean).abs() < 1e-15);
    // Without ignore_index, −100 is no class: a typed error naming the op.
    assert!(matches!(
        loss::cross_entropy_by(x, t, CrossEntropyOptions::default()),
        Err(NnError::NotAnIndex {
            op: "cross_entropy",
            position: 1,
            ..
        })
    ));
    // A float target tensor is refused.
    let ft = g.from_slice(&[2.0f64, 1.0, 0.0], &[3]).unwrap();
    assert!(loss::cross_entropy_by(x, ft, opts).is_err());
    let u8t = g.from_slice(&[2u8, 1, 0], &[3]).unwrap();
    let nll = loss::nll_loss_by(x.log_softmax(-1).unwrap(), u8t, Reduction::Mean).unwrap();
    let want = loss::nll_loss(x.log_softmax(-1).unwrap(), &[2, 1, 0]).unwrap();
    assert_eq!(nll.item().unwrap(), want.item().unwrap());
}

#[test]
fn integer_and_bool_tensors_round_trip_through_safetensors() {
    let ids = HostTensor::new(vec![-3i64, 0, 1 << 40], &[3]).unwrap();
    let small = HostTensor::new(vec![7i32, -8], &[2, 1]).unwrap();
    let pixels = HostTensor::new(vec![0u8, 128, 255, 9], &[2, 2]).unwrap();
    let mask = HostTensor::new(vec![Bool::TRUE, Bool::FALSE], &[2]).unwrap();
    let bytes = tensors_to_bytes([
        ("ids", &ids),
        ("small", &small),
        ("pixels", &pixels),
        ("mask", &mask),
    ])
    .unwrap();
    let back = tensors_from_bytes(&bytes, Path::new("<memory>")).unwrap();
    let find = |n: &str| back.iter().find(|(k, _)| k == n).unwrap().1.clone();
    assert_eq!(find("ids"), ids);
    assert_eq!(find("small"), small);
    assert_eq!(find("pixels"), pixels);
    assert_eq!(find("mask"), mask);
    assert!(matches!(find("mask").data(), HostData::Bool(_)));
    // And onto a graph, as index tensors.
    let g = Graph::new();
    let t = g.from_host(&find("ids")).unwrap();
    assert_eq!(t.dtype(), DType::I64);
    assert_eq!(t.to_vec::<i64>().unwrap(), [-3, 0, 1 << 40]);
}
