//! The spatial layers against PyTorch's own (`nn.Conv1d`, depthwise `nn.Conv2d`,
//! `nn.ConvTranspose1d`, `nn.ConvTranspose2d`, `nn.GroupNorm`, `nn.InstanceNorm2d`,
//! `nn.AdaptiveAvgPool2d`, `nn.Upsample` by size and by fractional factors, on images and
//! sound): a state dict PyTorch 2.15 saved loads by its names, strictly, and each layer then
//! computes PyTorch's values and gradients; fresh layers draw from PyTorch's bounds.
//! `tests/data/spatial` is made by
//!
//! ```text
//! python3 scripts/torch_spatial_modules.py tests/data/spatial
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use arenagrad::nn::checkpoint::{load_state_dict, load_tensors};
use arenagrad::nn::spatial::{
    interpolate1d_scale, interpolate_scale, AdaptiveAvgPool2d, Conv1d, ConvTranspose1d,
    ConvTranspose1dConfig, ConvTranspose2d, ConvTransposeConfig, GroupNorm, InstanceNorm2d,
    Interpolation, Resize, Upsample,
};
use arenagrad::nn::{Conv2d, Conv2dConfig, Module, Rng};
use arenagrad::{DType, Graph, HostTensor, Tensor};

fn data(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/spatial")
        .join(file)
}

/// The layers under PyTorch's attribute names, built with other options' defaults where
/// PyTorch's script sets them, and random weights (the checkpoint replaces them).
#[derive(Module)]
struct Net {
    conv1d: Conv1d,
    convt1d: ConvTranspose1d,
    convt1d_plain: ConvTranspose1d,
    convt2d: ConvTranspose2d,
    depthwise: Conv2d,
    depthwise_x2: Conv2d,
    gn: GroupNorm,
    inorm: InstanceNorm2d,
    pool: AdaptiveAvgPool2d,
    up_nearest: Upsample,
    up_bilinear: Upsample,
    up_corners: Upsample,
    up_sound_nearest: Upsample,
    up_sound_linear: Upsample,
}

impl Net {
    /// Not a network: the layers are each checked on their own input.
    fn forward<'g>(&self, g: &'g Graph, x: Tensor<'g>) -> arenagrad::nn::Result<Tensor<'g>> {
        self.gn.forward(g, x)
    }

    fn new(rng: &mut Rng) -> Net {
        let bilinear = Interpolation::Bilinear {
            align_corners: false,
        };
        Net {
            conv1d: Conv1d::with_options(4, 6, 3, (2, 1, 2, 2), true, rng).unwrap(),
            convt1d: ConvTranspose1d::new(
                6,
                4,
                4,
                ConvTranspose1dConfig {
                    stride: 3,
                    padding: 1,
                    output_padding: 2,
                    groups: 2,
                    ..Default::default()
                },
                rng,
            )
            .unwrap(),
            convt1d_plain: ConvTranspose1d::new(
                3,
                5,
                2,
                ConvTranspose1dConfig {
                    stride: 2,
                    bias: false,
                    ..Default::default()
                },
                rng,
            )
            .unwrap(),
            convt2d: ConvTranspose2d::new(
                4,
                6,
                (3, 2),
                ConvTransposeConfig {
                    stride: (2, 1),
                    padding: (1, 0),
                    output_padding: (1, 0),
                    dilation: (1, 2),
                    groups: 2,
                    bias: true,
                },
                rng,
            )
            .unwrap(),
            depthwise: Conv2d::with_config(
                6,
                6,
                (3, 3),
                Conv2dConfig {
                    padding: (1, 1),
                    groups: 6,
                    ..Default::default()
                },
                rng,
            )
            .unwrap(),
            depthwise_x2: Conv2d::with_config(
                4,
                8,
                (3, 2),
                Conv2dConfig {
                    stride: (2, 1),
                    padding: (1, 0),
                    dilation: (1, 2),
                    groups: 4,
                    ..Default::default()
                },
                rng,
            )
            .unwrap(),
            gn: GroupNorm::new(2, 6).unwrap(),
            inorm: InstanceNorm2d::new(3).unwrap(),
            pool: AdaptiveAvgPool2d((2, 3)),
            up_nearest: Upsample::scale(1.5, Interpolation::Nearest),
            up_bilinear: Upsample {
                to: Resize::Scale(0.6, 1.75),
                mode: bilinear,
            },
            up_corners: Upsample::size(
                (9, 4),
                Interpolation::Bilinear {
                    align_corners: true,
                },
            ),
            up_sound_nearest: Upsample::scale(2.5, Interpolation::Nearest),
            up_sound_linear: Upsample::length(
                23,
                Interpolation::Linear {
                    align_corners: false,
                },
            ),
        }
    }

    fn layers(&self) -> [(&'static str, &dyn Module); 14] {
        [
            ("conv1d", &self.conv1d),
            ("convt1d", &self.convt1d),
            ("convt1d_plain", &self.convt1d_plain),
            ("convt2d", &self.convt2d),
            ("depthwise", &self.depthwise),
            ("depthwise_x2", &self.depthwise_x2),
            ("gn", &self.gn),
            ("inorm", &self.inorm),
            ("pool", &self.pool),
            ("up_nearest", &self.up_nearest),
            ("up_bilinear", &self.up_bilinear),
            ("up_corners", &self.up_corners),
            ("up_sound_nearest", &self.up_sound_nearest),
            ("up_sound_linear", &self.up_sound_linear),
        ]
    }
}

struct Reference(BTreeMap<String, HostTensor>);

impl Reference {
    fn open() -> Self {
        Reference(
            load_tensors(data("reference.safetensors"))
                .unwrap()
                .into_iter()
                .collect(),
        )
    }

    fn get(&self, name: &str) -> &HostTensor {
        self.0
            .get(name)
            .unwrap_or_else(|| panic!("{name} not in the reference"))
    }

    /// Runs `f` on `case`'s input (in `dtype`), checks its output and the gradients of
    /// `Σ w·y` for the input and `params` against PyTorch's, within `tol` relative to
    /// `max(1, |want|)`.
    fn check(
        &self,
        case: &str,
        dtype: DType,
        tol: f64,
        f: &dyn for<'g> Fn(&'g Graph, Tensor<'g>) -> Tensor<'g>,
        params: &[(String, arenagrad::nn::Parameter)],
    ) {
        let g = Graph::new();
        let input = self.get(&format!("{case}/input"));
        let x = g
            .leaf(&input.data().to_f64_vec(), input.shape(), dtype)
            .unwrap();
        let y = f(&g, x);
        let want = self.get(&format!("{case}/output"));
        assert_eq!(y.shape().as_slice(), want.shape(), "{case}: output shape");
        close(
            &format!("{case} output"),
            &y.to_vec_f64().unwrap(),
            &want.data().to_f64_vec(),
            tol,
        );
        let w = self.get(&format!("{case}/w"));
        let w = g
            .from_f64(&w.data().to_f64_vec(), w.shape(), dtype)
            .unwrap();
        y.mul(w).unwrap().sum().unwrap().backward().unwrap();
        close(
            &format!("{case} grad input"),
            &x.grad().unwrap().unwrap().to_vec_f64().unwrap(),
            &self.get(&format!("{case}/grad/input")).data().to_f64_vec(),
            tol,
        );
        for (name, p) in params {
            let got = p
                .grad()
                .unwrap_or_else(|| panic!("{case} {name}: no gradient"));
            close(
                &format!("{case} grad {name}"),
                &got.data().to_f64_vec(),
                &self.get(&format!("{case}/grad/{name}")).data().to_f64_vec(),
                tol,
            );
        }
        let grads = self
            .0
            .keys()
            .filter(|k| k.starts_with(&format!("{case}/grad/")))
            .count();
        assert_eq!(grads, params.len() + 1, "{case}: every gradient checked");
    }
}

fn close(what: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (k, (a, b)) in got.iter().zip(want).enumerate() {
        assert!(
            (a - b).abs() <= tol * b.abs().max(1.0),
            "{what}[{k}]: {a} vs PyTorch's {b}"
        );
    }
}

/// PyTorch's state dict loads by its names with nothing missing or left over, and each layer
/// then computes PyTorch's outputs and gradients (f32, 1e-5).
#[test]
fn pytorch_state_dict_loads_and_the_layers_compute_pytorchs_values() {
    let net = Net::new(&mut Rng::seed(1));
    let file = load_tensors(data("modules.safetensors")).unwrap();
    let mut own: Vec<String> = net.named_state().into_iter().map(|(n, _, _)| n).collect();
    let mut theirs: Vec<String> = file.iter().map(|(n, _)| n.clone()).collect();
    own.sort();
    theirs.sort();
    assert_eq!(own, theirs, "the state dict's names are PyTorch's");
    let report = load_state_dict(&net, file, true, &data("modules.safetensors")).unwrap();
    assert!(report.missing.is_empty() && report.unexpected.is_empty());
    let r = Reference::open();
    for (case, layer) in net.layers() {
        r.check(
            case,
            DType::F32,
            1e-5,
            &|g, x| layer.forward(g, x).unwrap(),
            &layer.named_parameters(),
        );
    }
}

/// `F.interpolate` by fractional factors in f64, up and down, nearest and bilinear (both
/// corner rules, an axis whose size the factor keeps), against PyTorch's to 1e-12.
#[test]
fn interpolation_by_factors_is_pytorchs_in_f64() {
    let r = Reference::open();
    let cases: [(&str, (f64, f64), Interpolation); 6] = [
        ("nearest_up", (1.5, 2.3), Interpolation::Nearest),
        ("nearest_down", (0.7, 0.45), Interpolation::Nearest),
        (
            "bilinear_up",
            (1.7, 1.25),
            Interpolation::Bilinear {
                align_corners: false,
            },
        ),
        (
            "bilinear_down",
            (0.35, 0.8),
            Interpolation::Bilinear {
                align_corners: false,
            },
        ),
        (
            "bilinear_corners",
            (1.5, 2.5),
            Interpolation::Bilinear {
                align_corners: true,
            },
        ),
        (
            "bilinear_same_height",
            (1.1, 1.5),
            Interpolation::Bilinear {
                align_corners: false,
            },
        ),
    ];
    for (case, factors, mode) in cases {
        r.check(
            &format!("f64/{case}"),
            DType::F64,
            1e-12,
            &|_, x| interpolate_scale(x, factors, mode).unwrap(),
            &[],
        );
    }
    // Sound, `[N, C, L]`: PyTorch's 1-D kernels (nearest by its generic rule at every size:
    // a factor of 1.1 that keeps 5 entries reads 0, 0, 1, 2, 3; linear copies a kept length).
    let linear = |align_corners| Interpolation::Linear { align_corners };
    let sound: [(&str, f64, Interpolation); 6] = [
        ("sound_nearest_up", 2.3, Interpolation::Nearest),
        ("sound_nearest_down", 0.45, Interpolation::Nearest),
        ("sound_linear_up", 1.7, linear(false)),
        ("sound_linear_down", 0.45, linear(false)),
        ("sound_linear_corners", 2.5, linear(true)),
        ("sound_linear_kept", 1.1, linear(false)),
    ];
    for (case, factor, mode) in sound {
        r.check(
            &format!("f64/{case}"),
            DType::F64,
            1e-12,
            &|_, x| interpolate1d_scale(x, factor, mode).unwrap(),
            &[],
        );
    }
    // A kept length by 1.1: PyTorch's forward reads 0, 0, 1, 2, 3, its backward (the other
    // rule) credits 0, 1, 2, 3, 4; ours is the gradient of the forward.
    let case = "f64/sound_nearest_kept";
    let g = Graph::new();
    let input = r.get(&format!("{case}/input"));
    let x = g
        .leaf(&input.data().to_f64_vec(), &[1, 1, 5], DType::F64)
        .unwrap();
    let y = interpolate1d_scale(x, 1.1, Interpolation::Nearest).unwrap();
    let want = r.get(&format!("{case}/output")).data().to_f64_vec();
    close(case, &y.to_vec_f64().unwrap(), &want, 0.0);
    let w = r.get(&format!("{case}/w")).data().to_f64_vec();
    let wt = g.from_f64(&w, &[1, 1, 5], DType::F64).unwrap();
    y.mul(wt).unwrap().sum().unwrap().backward().unwrap();
    let grad = x.grad().unwrap().unwrap().to_vec_f64().unwrap();
    close(case, &grad, &[w[0] + w[1], w[2], w[3], w[4], 0.0], 1e-15);
}

/// Fresh layers draw weights and biases uniformly within `±1/√fan_in`, the fan read from the
/// weight's PyTorch layout (`[in, out/groups, k…]` for the transposed ones): ours and PyTorch's
/// own draws (in the reference) both lie within the bound and come near it.
#[test]
fn fresh_layers_draw_within_pytorchs_bounds() {
    let r = Reference::open();
    let mut rng = Rng::seed(7);
    let t1 = ConvTranspose1dConfig {
        groups: 2,
        ..Default::default()
    };
    let t2 = ConvTransposeConfig {
        groups: 4,
        ..Default::default()
    };
    let layers: [(&str, Box<dyn Module>, usize); 3] = [
        (
            "conv1d",
            Box::new(Conv1d::with_options(8, 12, 5, (1, 0, 1, 4), true, &mut rng).unwrap()),
            2 * 5,
        ),
        (
            "convt1d",
            Box::new(ConvTranspose1d::new(16, 32, 5, t1, &mut rng).unwrap()),
            16 * 5,
        ),
        (
            "convt2d",
            Box::new(ConvTranspose2d::new(8, 12, (3, 2), t2, &mut rng).unwrap()),
            3 * 3 * 2,
        ),
    ];
    for (name, layer, fan_in) in layers {
        let bound = 1.0 / (fan_in as f64).sqrt();
        for (p, param) in layer.named_parameters() {
            let theirs = r.get(&format!("init/{name}/{p}"));
            let ours = param.value();
            assert_eq!(ours.shape(), theirs.shape(), "{name}.{p}: shape");
            for (who, v) in [
                ("ours", ours.data().to_f64_vec()),
                ("PyTorch's", theirs.data().to_f64_vec()),
            ] {
                let max = v.iter().fold(0.0f64, |m, x| m.max(x.abs()));
                // A bias of 12 values reaches 0.6 of its bound with probability 1 − 0.6¹².
                let near = if v.len() >= 100 { 0.95 } else { 0.6 };
                assert!(
                    max <= bound && max >= near * bound,
                    "{name}.{p} ({who}): max |v| {max} against the bound {bound}"
                );
            }
        }
    }
}

/// An `Upsample` by factors takes PyTorch's sizes, `⌊n·s⌋`; bad factors and sizes are typed
/// errors naming the op, and a non-image input is refused.
#[test]
fn upsample_sizes_and_refusals() {
    let g = Graph::new();
    let x = g.zeros(&[1, 2, 5, 7], DType::F32).unwrap();
    let shape = |m: Upsample| m.forward(&g, x).map(|y| y.shape().to_vec());
    assert_eq!(
        shape(Upsample::scale(1.5, Interpolation::Nearest)).unwrap(),
        [1, 2, 7, 10]
    );
    assert_eq!(
        shape(Upsample {
            to: Resize::Scale(0.2, 3.0),
            mode: Interpolation::Nearest,
        })
        .unwrap(),
        [1, 2, 1, 21]
    );
    for bad in [0.0, -1.0, f64::NAN, f64::INFINITY, 0.1, 1e300, 1e18] {
        let err = shape(Upsample::scale(bad, Interpolation::Nearest))
            .unwrap_err()
            .to_string();
        assert!(err.contains("interpolate"), "{bad}: {err}");
    }
    for size in [(0, 3), (1 << 40, 1 << 40)] {
        let err = shape(Upsample::size(size, Interpolation::Nearest))
            .unwrap_err()
            .to_string();
        assert!(err.contains("interpolate"), "{size:?}: {err}");
    }
    for shape in [vec![2, 5], vec![1, 2, 3, 5, 7]] {
        let other = g.zeros(&shape, DType::F32).unwrap();
        let err = Upsample::scale(2.0, Interpolation::Nearest)
            .forward(&g, other)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("interpolate") && err.contains(&format!("{shape:?}")),
            "{err}"
        );
    }
    // Sound takes a length or one factor, images a size or two factors; linear is for sound
    // and bilinear for images, as PyTorch's modes are.
    let sound = g.zeros(&[2, 5, 7], DType::F32).unwrap();
    let linear = Interpolation::Linear {
        align_corners: false,
    };
    let bilinear = Interpolation::Bilinear {
        align_corners: false,
    };
    let on = |m: Upsample, x| m.forward(&g, x).map(|y| y.shape().to_vec());
    assert_eq!(on(Upsample::scale(2.0, linear), sound).unwrap(), [2, 5, 14]);
    assert_eq!(on(Upsample::length(3, linear), sound).unwrap(), [2, 5, 3]);
    for (m, x, words) in [
        (Upsample::size((3, 4), linear), sound, "Size"),
        (Upsample::length(3, Interpolation::Nearest), x, "Length"),
        (
            Upsample {
                to: Resize::Scale(2.0, 3.0),
                mode: linear,
            },
            sound,
            "Scale",
        ),
        (Upsample::scale(2.0, bilinear), sound, "bilinear"),
        (Upsample::scale(2.0, linear), x, "linear"),
        (Upsample::length(0, linear), sound, "interpolate"),
        (Upsample::scale(0.1, linear), sound, "interpolate"),
        (Upsample::scale(f64::NAN, linear), sound, "finite"),
    ] {
        let err = on(m, x).unwrap_err().to_string();
        assert!(err.contains(words), "{m:?}: {err}");
    }
    // Integer inputs: nearest picks entries as PyTorch's does; linear and bilinear, which
    // weigh them, are refused (PyTorch refuses linear on integer sound).
    let bytes = g.from_slice(&[0u8, 100, 200], &[1, 1, 3]).unwrap();
    let up = Upsample::length(5, Interpolation::Nearest)
        .forward(&g, bytes)
        .unwrap();
    assert_eq!(up.to_vec::<u8>().unwrap(), [0, 0, 100, 100, 200]);
    let image = bytes.reshape(&[1, 1, 1, 3]).unwrap();
    for (m, x) in [
        (Upsample::length(5, linear), bytes),
        (Upsample::size((1, 5), bilinear), image),
    ] {
        let err = on(m, x).unwrap_err().to_string();
        assert!(
            err.contains("interpolate") && err.contains("u8"),
            "{m:?}: {err}"
        );
    }
}
