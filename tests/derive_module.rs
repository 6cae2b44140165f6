//! `#[derive(Module)]` through the umbrella crate (`arenagrad::nn::Module`): names, slots and
//! the training mode for every kind of field, generic and tuple structs, and checkpoints that
//! round-trip through the derived names.

use arenagrad::nn::{
    BatchNorm2d, Dropout, Graph, Linear, Module, Parameter, Result, Rng, Slot, Tensor,
};
use arenagrad::{DType, HostTensor};

fn names(m: &impl Module) -> Vec<(String, Slot)> {
    m.named_state()
        .into_iter()
        .map(|(n, _, s)| (n, s))
        .collect()
}

fn param(n: usize) -> Parameter {
    Parameter::new("p", HostTensor::new(vec![1.0f32; n], &[n]).unwrap())
}

/// Every kind of field: lists, arrays, boxed slices, options (some and none), boxed trait
/// objects, parameters and buffers, renamed and skipped fields, plain values.
#[derive(Module)]
struct Everything {
    first: Linear,
    stack: Vec<Linear>,
    pair: [Linear; 2],
    boxed: Box<[Linear]>,
    present: Option<Linear>,
    absent: Option<Linear>,
    dynamic: Box<dyn Module>,
    scale: Parameter,
    #[module(buffer)]
    count: Parameter,
    maybe: Option<Parameter>,
    many: Vec<Parameter>,
    #[module(rename = "LayerNorm")]
    norm: BatchNorm2d,
    #[module(skip)]
    _cache: Vec<Linear>,
    width: usize,
    rate: f64,
    dtype: DType,
    training: bool,
}

impl Everything {
    fn forward<'g>(&self, g: &'g Graph, x: Tensor<'g>) -> Result<Tensor<'g>> {
        self.first.forward(g, x)
    }
}

#[test]
fn every_kind_of_field_is_named_as_pytorch_would() {
    let mut rng = Rng::seed(0);
    let lin = |rng: &mut Rng| Linear::new(2, 2, rng).unwrap();
    let mut m = Everything {
        first: lin(&mut rng),
        stack: vec![lin(&mut rng), lin(&mut rng)],
        pair: [lin(&mut rng), lin(&mut rng)],
        boxed: vec![lin(&mut rng)].into_boxed_slice(),
        present: Some(lin(&mut rng)),
        absent: None,
        dynamic: Box::new(lin(&mut rng)),
        scale: param(2),
        count: param(1),
        maybe: Some(param(3)),
        many: vec![param(1), param(1)],
        norm: BatchNorm2d::new(2).unwrap(),
        _cache: vec![lin(&mut rng)],
        width: 2,
        rate: 0.5,
        dtype: DType::F32,
        training: true,
    };
    let got: Vec<String> = names(&m)
        .into_iter()
        .map(|(n, s)| match s {
            Slot::Parameter => n,
            Slot::Buffer => format!("{n} (buffer)"),
        })
        .collect();
    let lin_names = |p: &str| [format!("{p}.weight"), format!("{p}.bias")];
    let mut want: Vec<String> = Vec::new();
    for p in [
        "first", "stack.0", "stack.1", "pair.0", "pair.1", "boxed.0", "present", "dynamic",
    ] {
        want.extend(lin_names(p));
    }
    want.extend(
        [
            "scale",
            "count (buffer)",
            "maybe",
            "many.0",
            "many.1",
            "LayerNorm.weight",
            "LayerNorm.bias",
            "LayerNorm.running_mean (buffer)",
            "LayerNorm.running_var (buffer)",
        ]
        .map(String::from),
    );
    assert_eq!(got, want);
    // The mode reaches the children and the training field.
    m.eval();
    assert!(!m.training);
    assert!(!m.norm.is_training());
    m.train();
    assert!(m.training && m.norm.is_training());
    let g = Graph::new();
    let y = m.forward(&g, g.ones(&[1, 2], DType::F32).unwrap()).unwrap();
    assert_eq!(y.shape().as_slice(), &[1, 2]);
    assert_eq!((m.width, m.rate, m.dtype), (2, 0.5, DType::F32));
}

/// A generic wrapper, a tuple struct (fields named `0`, `1`), a forward named by attribute, and
/// a checkpoint saved and loaded by the derived names.
#[derive(Module)]
#[module(forward = "Self::run")]
struct Pair<M: Module>(M, Dropout);

impl<M: Module> Pair<M> {
    fn run<'g>(&self, g: &'g Graph, x: Tensor<'g>) -> Result<Tensor<'g>> {
        self.1.forward(g, self.0.forward(g, x)?)
    }
}

#[derive(Module)]
struct Outer {
    inner: Pair<Linear>,
    blocks: Vec<Pair<Linear>>,
}

impl Outer {
    fn forward<'g>(&self, g: &'g Graph, x: Tensor<'g>) -> Result<Tensor<'g>> {
        let mut x = self.inner.forward(g, x)?;
        for b in &self.blocks {
            x = b.forward(g, x)?;
        }
        Ok(x)
    }
}

fn outer(seed: u64) -> Outer {
    let mut rng = Rng::seed(seed);
    let pair = |rng: &mut Rng| Pair(Linear::new(3, 3, rng).unwrap(), Dropout::new(0.5).unwrap());
    Outer {
        inner: pair(&mut rng),
        blocks: vec![pair(&mut rng), pair(&mut rng)],
    }
}

#[test]
fn generic_and_tuple_structs_round_trip_through_checkpoints() {
    let mut a = outer(1);
    let got: Vec<String> = names(&a).into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        got,
        [
            "inner.0.weight",
            "inner.0.bias",
            "blocks.0.0.weight",
            "blocks.0.0.bias",
            "blocks.1.0.weight",
            "blocks.1.0.bias"
        ]
    );
    let mut b = outer(2);
    a.eval();
    b.eval();
    let g = Graph::new();
    let x = g.randn(&[2, 3], DType::F32).unwrap();
    let (ya, yb) = (
        a.forward(&g, x).unwrap().to_vec::<f32>().unwrap(),
        b.forward(&g, x).unwrap().to_vec::<f32>().unwrap(),
    );
    assert_ne!(ya, yb);
    // In evaluation mode every dropout (deep in the list) is off: two forwards agree.
    assert_eq!(ya, a.forward(&g, x).unwrap().to_vec::<f32>().unwrap());
    let dir = std::env::temp_dir().join(format!("arenagrad-derive-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("outer.safetensors");
    arenagrad::nn::checkpoint::save(&a, &path).unwrap();
    arenagrad::nn::checkpoint::load(&b, &path).unwrap();
    assert_eq!(ya, b.forward(&g, x).unwrap().to_vec::<f32>().unwrap());
    std::fs::remove_dir_all(&dir).unwrap();
}
