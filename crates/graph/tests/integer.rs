//! Integer and boolean tensors: storage, casts, PyTorch's promotion, comparisons giving `bool`,
//! index tensors, and no gradient through any of them. Expected values are PyTorch 2's (printed
//! by `torch` for the same inputs, quoted beside each case).

use arenagrad_graph::{Bool, DType, Graph, GraphError, HostTensor};

#[test]
fn dtypes_name_parse_and_promote_as_pytorch() {
    for d in DType::ALL {
        assert_eq!(DType::parse(d.name()), Some(d));
    }
    assert_eq!(DType::parse("long"), Some(DType::I64));
    assert_eq!(DType::parse("uint8"), Some(DType::U8));
    assert_eq!(DType::I32.promote(DType::I64), DType::I64);
    assert_eq!(DType::U8.promote(DType::I32), DType::I32);
    assert_eq!(DType::Bool.promote(DType::U8), DType::U8);
    assert_eq!(DType::I64.promote(DType::BF16), DType::BF16);
    assert_eq!(DType::F64.promote(DType::Bool), DType::F64);
    assert!(DType::INTEGERS.iter().all(|d| d.is_integer()));
    assert!(DType::FLOATS.iter().all(|d| d.is_float()));
}

#[test]
fn integer_arithmetic_follows_pytorch() {
    let g = Graph::new();
    // a = torch.tensor([5, -7, 3], dtype=torch.int32); b = torch.tensor([2, 2, 2])
    let a = g.from_slice(&[5i32, -7, 3], &[3]).unwrap();
    let b = g.from_slice(&[2i64, 2, 2], &[3]).unwrap();
    let sum = a.add(b).unwrap();
    assert_eq!(sum.dtype(), DType::I64);
    assert_eq!(sum.to_vec::<i64>().unwrap(), [7, -5, 5]);
    assert_eq!(a.mul(b).unwrap().to_vec::<i64>().unwrap(), [10, -14, 6]);
    assert_eq!(a.maximum(b).unwrap().to_vec::<i64>().unwrap(), [5, 2, 3]);
    // a / b is true division, in float32.
    let q = a.div(b).unwrap();
    assert_eq!(q.dtype(), DType::F32);
    assert_eq!(q.to_vec::<f32>().unwrap(), [2.5, -3.5, 1.5]);
    // uint8 wraps: 250 + 10 = 4.
    let u = g.from_slice(&[250u8], &[1]).unwrap();
    let ten = g.from_slice(&[10u8], &[1]).unwrap();
    assert_eq!(u.add(ten).unwrap().to_vec::<u8>().unwrap(), [4]);
    // bool + bool is or, bool * bool is and; bool - bool is refused.
    let t = g
        .from_slice(&[Bool::TRUE, Bool::FALSE, Bool::TRUE], &[3])
        .unwrap();
    let f = g
        .from_slice(&[Bool::TRUE, Bool::TRUE, Bool::FALSE], &[3])
        .unwrap();
    let or = t.add(f).unwrap();
    assert_eq!(or.dtype(), DType::Bool);
    assert_eq!(or.to_vec_f64().unwrap(), [1.0, 1.0, 1.0]);
    assert_eq!(t.mul(f).unwrap().to_vec_f64().unwrap(), [1.0, 0.0, 0.0]);
    assert!(matches!(
        t.sub(f),
        Err(GraphError::UnsupportedDType { op: "sub", .. })
    ));
    // Unary: abs, neg and sign keep the dtype; exp gives float32.
    let n = g.from_slice(&[-3i64, 4], &[2]).unwrap();
    assert_eq!(n.abs().unwrap().to_vec::<i64>().unwrap(), [3, 4]);
    assert_eq!(n.neg().unwrap().to_vec::<i64>().unwrap(), [3, -4]);
    assert_eq!(
        n.unary(arenagrad_graph::UnaryOp::Sign)
            .unwrap()
            .to_vec::<i64>()
            .unwrap(),
        [-1, 1]
    );
    assert_eq!(n.exp().unwrap().dtype(), DType::F32);
    assert_eq!(n.scale(3.0).unwrap().dtype(), DType::I64);
    assert_eq!(n.scale(2.5).unwrap().dtype(), DType::F32);
    // With a float: the float's dtype. torch.tensor([1, 2]) + torch.tensor([0.5, 0.25])
    let i = g.from_slice(&[1i64, 2], &[2]).unwrap();
    let x = g.from_slice(&[0.5f32, 0.25], &[2]).unwrap();
    let y = i.add(x).unwrap();
    assert_eq!(y.dtype(), DType::F32);
    assert_eq!(y.to_vec::<f32>().unwrap(), [1.5, 2.25]);
}

#[test]
fn reductions_of_integers() {
    let g = Graph::new();
    let t = g
        .from_slice(&[Bool::TRUE, Bool::FALSE, Bool::TRUE], &[3])
        .unwrap();
    let n = t.sum().unwrap();
    assert_eq!(n.dtype(), DType::I64);
    assert_eq!(n.to_vec::<i64>().unwrap(), [2]);
    let u = g.from_slice(&[3u8, 250, 7], &[3]).unwrap();
    assert_eq!(u.max().unwrap().to_vec::<u8>().unwrap(), [250]);
    // Through −x this would wrap: 3.
    assert_eq!(u.min().unwrap().to_vec::<u8>().unwrap(), [3]);
    // mean of integers is refused, as PyTorch refuses it.
    assert!(matches!(
        u.mean(),
        Err(GraphError::UnsupportedDType { op: "mean", .. })
    ));
}

#[test]
fn casts_truncate_wrap_and_test_nonzero_as_pytorch() {
    let g = Graph::new();
    let x = g.from_slice(&[-1.7f32, 2.9, -0.5], &[3]).unwrap();
    assert_eq!(
        x.to_dtype(DType::I64).unwrap().to_vec::<i64>().unwrap(),
        [-1, 2, 0]
    );
    let z = g.from_slice(&[0.0f32, -0.0, 0.1, f32::NAN], &[4]).unwrap();
    let b = z.to_dtype(DType::Bool).unwrap();
    assert_eq!(b.to_vec_f64().unwrap(), [0.0, 0.0, 1.0, 1.0]);
    let w = g.from_slice(&[-1.0f32, 300.0], &[2]).unwrap();
    assert_eq!(
        w.to_dtype(DType::U8).unwrap().to_vec::<u8>().unwrap(),
        [255, 44]
    );
    // int64 beyond f32's exact range survives a cast to f64 and back.
    let big = g.from_slice(&[16_777_217i64], &[1]).unwrap();
    let back = big
        .to_dtype(DType::F64)
        .unwrap()
        .to_dtype(DType::I64)
        .unwrap();
    assert_eq!(back.to_vec::<i64>().unwrap(), [16_777_217]);
    // i64 → i32 wraps.
    let wide = g.from_slice(&[(1i64 << 32) + 5], &[1]).unwrap();
    assert_eq!(
        wide.to_dtype(DType::I32).unwrap().to_vec::<i32>().unwrap(),
        [5]
    );
}

#[test]
fn comparisons_give_bool_and_compare_integers_exactly() {
    let g = Graph::new();
    // torch.tensor([16777217]) > torch.tensor([16777216]): True (f32 would call them equal).
    let a = g.from_slice(&[16_777_217i64], &[1]).unwrap();
    let b = g.from_slice(&[16_777_216i64], &[1]).unwrap();
    let gt = a.gt(b).unwrap();
    assert_eq!(gt.dtype(), DType::Bool);
    assert_eq!(gt.to_vec::<Bool>().unwrap(), [Bool::TRUE]);
    // A mask from floats selects, multiplies and fills.
    let x = g.leaf(&[-1.0, 2.0, 3.0], &[3], DType::F64).unwrap();
    let zero = g.scalar(0.0, DType::F64).unwrap();
    let pos = x.gt(zero).unwrap();
    assert_eq!(pos.dtype(), DType::Bool);
    assert!(!pos.requires_grad());
    let y = x.mul(pos).unwrap();
    assert_eq!(y.dtype(), DType::F64);
    y.sum().unwrap().backward().unwrap();
    assert_eq!(
        x.grad().unwrap().unwrap().to_vec::<f64>().unwrap(),
        [0.0, 1.0, 1.0]
    );
    let filled = x.masked_fill(pos, -5.0).unwrap();
    assert_eq!(filled.to_vec::<f64>().unwrap(), [-1.0, -5.0, -5.0]);
    // where(bool, i64, i64) stays i64: torch.where(tensor([True, False]), [1, 2], [7, 8]).
    let c = g.from_slice(&[Bool::TRUE, Bool::FALSE], &[2]).unwrap();
    let p = g.from_slice(&[1i64, 2], &[2]).unwrap();
    let q = g.from_slice(&[7i64, 8], &[2]).unwrap();
    let w = g.where_cond(c, p, q).unwrap();
    assert_eq!(w.dtype(), DType::I64);
    assert_eq!(w.to_vec::<i64>().unwrap(), [1, 8]);
}

#[test]
fn integer_tensors_carry_no_gradient() {
    let g = Graph::new();
    assert!(matches!(
        g.leaf(&[1.0, 2.0], &[2], DType::I64),
        Err(GraphError::NoGradDType {
            dtype: DType::I64,
            ..
        })
    ));
    // A cast to an integer dtype detaches, as in PyTorch.
    let x = g.leaf(&[1.5, 2.5], &[2], DType::F32).unwrap();
    let i = x.to_dtype(DType::I32).unwrap();
    assert!(!i.requires_grad());
    assert!(i.backward().is_err());
}

#[test]
fn index_tensors_drive_gather_index_select_and_one_hot() {
    let g = Graph::new();
    let x = g
        .leaf(&[1.0, 5.0, 5.0, 2.0, 0.0, -1.0], &[2, 3], DType::F64)
        .unwrap();
    // torch.tensor([[1., 5., 5.], [2., 0., -1.]]).argmax(1) → [1, 0]
    let am = x.argmax_dim(1, false).unwrap();
    assert_eq!(am.dtype(), DType::I64);
    assert_eq!(am.shape().to_vec(), [2]);
    assert_eq!(am.to_vec::<i64>().unwrap(), [1, 0]);
    assert_eq!(x.argmin_dim(1, true).unwrap().shape().to_vec(), [2, 1]);
    // gather by an index tensor, with its gradient.
    let idx = g.from_slice(&[2i64, 0], &[2, 1]).unwrap();
    let picked = x.gather_by(1, idx).unwrap();
    assert_eq!(picked.to_vec::<f64>().unwrap(), [5.0, 2.0]);
    picked.sum().unwrap().backward().unwrap();
    assert_eq!(
        x.grad().unwrap().unwrap().to_vec::<f64>().unwrap(),
        [0.0, 0.0, 1.0, 1.0, 0.0, 0.0]
    );
    let rows = g.from_slice(&[1i32, 1, 0], &[3]).unwrap();
    assert_eq!(x.index_select_by(0, rows).unwrap().shape().to_vec(), [3, 3]);
    // F.one_hot(torch.tensor([2, 0]), 3)
    let labels = g.from_slice(&[2u8, 0], &[2]).unwrap();
    let oh = labels.one_hot(3).unwrap();
    assert_eq!(oh.dtype(), DType::I64);
    assert_eq!(oh.to_vec::<i64>().unwrap(), [0, 0, 1, 1, 0, 0]);
    // Refusals: negative, out of range, floating and bool indices.
    let neg = g.from_slice(&[-1i64], &[1]).unwrap();
    assert!(matches!(
        x.index_select_by(0, neg),
        Err(GraphError::BadArgument {
            op: "index_select",
            ..
        })
    ));
    let far = g.from_slice(&[7i64], &[1]).unwrap();
    assert!(matches!(
        x.index_select_by(0, far),
        Err(GraphError::IndexOutOfRange { index: 7, .. })
    ));
    let fl = g.from_slice(&[0.0f32], &[1]).unwrap();
    assert!(matches!(
        x.index_select_by(0, fl),
        Err(GraphError::UnsupportedDType {
            op: "index_select",
            dtype: DType::F32
        })
    ));
    // arange in i64.
    let r = g.arange(0.0, 5.0, 2.0, DType::I64).unwrap();
    assert_eq!(r.to_vec::<i64>().unwrap(), [0, 2, 4]);
}

#[test]
fn integer_tensors_print_as_pytorch() {
    let t = HostTensor::new(vec![1i64, -20, 300], &[1, 3]).unwrap();
    assert_eq!(t.to_string(), "tensor([[  1, -20, 300]])");
    let b = HostTensor::new(vec![Bool::TRUE, Bool::FALSE], &[2]).unwrap();
    assert_eq!(b.to_string(), "tensor([ True, False])");
    let i = HostTensor::new(vec![1i32, 2], &[2]).unwrap();
    assert_eq!(i.to_string(), "tensor([1, 2], dtype=i32)");
    let u = HostTensor::new(vec![1u8, 2], &[2]).unwrap();
    assert_eq!(u.to_string(), "tensor([1, 2], dtype=u8)");
}
