//! Host tensors keep their shape and data in agreement, and host allocations the machine cannot
//! make are typed errors, not aborts — with nothing the caller owns changed.

use arenagrad_nn::{
    BatchNorm1d, BatchNormConfig, Conv2d, DType, Embedding, GraphError, HostData, HostDataMut,
    HostTensor, Linear, NnError, Parameter, Rng,
};

/// More than any machine this runs on can reserve (4 TB of f32).
const HUGE: [usize; 3] = [100_000, 100_000, 100];

fn is_oom(e: &NnError) -> bool {
    matches!(e, NnError::Graph(GraphError::OutOfMemory { .. }))
}

#[test]
fn host_zeros_beyond_memory_is_an_error() {
    let r = HostTensor::zeros(&HUGE, DType::F32);
    match r {
        Err(GraphError::OutOfMemory { op, shape, bytes }) => {
            assert_eq!(op, "HostTensor::zeros");
            assert_eq!(shape, HUGE.to_vec());
            assert_eq!(bytes, 4_000_000_000_000);
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        HostTensor::full(&HUGE, 1.0, DType::F64),
        Err(GraphError::OutOfMemory { .. })
    ));
}

#[test]
fn layers_beyond_memory_are_errors() {
    let mut rng = Rng::seed(0);
    let r = Linear::new(1 << 20, 1 << 20, &mut rng);
    assert!(r.as_ref().is_err_and(is_oom), "{:?}", r.err());
    let r = Conv2d::new(1 << 16, 1 << 16, (64, 64), &mut rng);
    assert!(r.as_ref().is_err_and(is_oom), "{:?}", r.err());
    let r = Embedding::new(1 << 30, 1 << 12, &mut rng);
    assert!(r.as_ref().is_err_and(is_oom), "{:?}", r.err());
    let r = BatchNorm1d::with_config(1 << 42, BatchNormConfig::default());
    assert!(r.as_ref().is_err_and(is_oom), "{:?}", r.err());
    // The generator is left usable, and a layer that fits still builds.
    assert!(Linear::new(4, 3, &mut rng).is_ok());
}

#[test]
fn shape_and_data_cannot_disagree() {
    assert!(matches!(
        HostTensor::new(vec![1.0f32, 2.0], &[5]),
        Err(GraphError::DataLength {
            expected: 5,
            got: 2,
            ..
        })
    ));
    assert!(matches!(
        HostTensor::from_data(HostData::F64(vec![1.0; 3]), &[2, 2]),
        Err(GraphError::DataLength { .. })
    ));
    let mut t = HostTensor::new(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2]).unwrap();
    if let HostDataMut::F32(v) = t.data_mut() {
        v[0] = 9.0;
    }
    assert_eq!(t.numel(), 4);
    assert_eq!(t.shape(), &[2, 2]);
    assert_eq!(t.as_slice::<f32>().unwrap()[0], 9.0);
}

#[test]
fn a_parameter_keeps_its_shape_through_every_door() {
    let p = Parameter::new("w", HostTensor::zeros(&[256, 256], DType::F32).unwrap());
    let before = p.value();
    // set_value with another shape or dtype is refused, and the value stays.
    let one = HostTensor::new(vec![1.0f32], &[1]).unwrap();
    assert!(matches!(
        p.set_value(one),
        Err(GraphError::ShapeMismatch { .. })
    ));
    let f64s = HostTensor::zeros(&[256, 256], DType::F64).unwrap();
    assert!(matches!(
        p.set_value(f64s),
        Err(GraphError::DTypeMismatch { .. })
    ));
    assert_eq!(p.value(), before);
    // update lends the elements as a slice: values change, the length cannot.
    p.update(|v, _| {
        if let HostDataMut::F32(v) = v {
            v.fill(0.5);
        }
    });
    assert_eq!(p.numel(), 256 * 256);
    assert_eq!(p.value().numel(), 256 * 256);
    // And ops over it work.
    let g = arenagrad_nn::Graph::new();
    let w = g.param(&p).unwrap();
    let y = w
        .matmul(w)
        .unwrap()
        .exp()
        .unwrap()
        .add(w)
        .unwrap()
        .sum()
        .unwrap();
    y.backward().unwrap();
    assert_eq!(p.grad().unwrap().shape(), &[256, 256]);
}
