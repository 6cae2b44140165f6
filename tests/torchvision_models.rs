//! ResNet-18 checked against torchvision's own `resnet18` in evaluation mode. The weights are
//! computed from a formula on both sides (47 MB need not ship), the state dict's names, shapes
//! and dtypes are torchvision's (`tests/data/torchvision/resnet18.json`), and the class scores
//! are what torchvision computed, made by
//!
//! ```text
//! python3 scripts/torchvision_reference.py tests/data/torchvision
//! ```

use std::path::{Path, PathBuf};

use arenagrad::nn::{Module, ResNet, Rng};
use arenagrad::{DType, Graph, HostTensor};
use safetensors::{Dtype, SafeTensors};

fn data(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/torchvision")
        .join(file)
}

/// The names, shapes and dtypes of torchvision's `resnet18().state_dict()`, in its order.
fn names() -> Vec<(String, Vec<usize>, String)> {
    let text = std::fs::read_to_string(data("resnet18.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let shape = e["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_u64().unwrap() as usize)
                .collect();
            (
                e["name"].as_str().unwrap().to_string(),
                shape,
                e["dtype"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// The formula's `u` in [-1, 1] for element `i` of tensor `t` (the script's `uniform`).
fn uniform(t: usize, i: u64) -> f64 {
    let mut h = (i
        .wrapping_mul(2654435761)
        .wrapping_add((t as u64 + 1) * 40503))
        & 0xFFFF_FFFF;
    h ^= h >> 15;
    h = h.wrapping_mul(2246822519) & 0xFFFF_FFFF;
    h ^= h >> 13;
    (h % 2001) as f64 / 1000.0 - 1.0
}

/// Tensor `t`'s values (the script's `value`), rounded once to f32.
fn value(t: usize, name: &str, shape: &[usize]) -> Vec<f32> {
    let n: usize = shape.iter().product();
    let last = name.rsplit('.').next().unwrap();
    (0..n as u64)
        .map(|i| {
            let u = uniform(t, i);
            let v = match last {
                "weight" if shape.len() > 1 => u * (6.0 / (n / shape[0]) as f64).sqrt(),
                "weight" => 0.5 + u / 4.0,
                "running_var" => 1.0 + u / 2.0,
                _ => u / 10.0,
            };
            v as f32
        })
        .collect()
}

/// torchvision's state dict as `safetensors.torch.save_file` writes it (int64 counters
/// included), in `dir`.
fn torchvision_file(dir: &Path) -> PathBuf {
    let mut tensors: Vec<(String, Vec<usize>, Dtype, Vec<u8>)> = Vec::new();
    for (t, (name, shape, dtype)) in names().into_iter().enumerate() {
        let (dt, bytes) = match dtype.as_str() {
            "float32" => (
                Dtype::F32,
                value(t, &name, &shape)
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect(),
            ),
            "int64" => (Dtype::I64, 100i64.to_le_bytes().to_vec()),
            other => panic!("{name}: dtype {other}"),
        };
        tensors.push((name, shape, dt, bytes));
    }
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .map(|(n, s, d, b)| {
            (
                n.clone(),
                safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap(),
            )
        })
        .collect();
    let path = dir.join("resnet18.safetensors");
    safetensors::serialize_to_file(views, None, &path).unwrap();
    path
}

fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("arenagrad-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The class scores equal torchvision's within 1e-4 for batches of 64×64 images, an odd size
/// (97×81) and ImageNet's 224×224.
#[test]
fn resnet18_matches_torchvision() {
    let dir = temp_dir("resnet18");
    let model = ResNet::from_torchvision(torchvision_file(&dir)).unwrap();
    let bytes = std::fs::read(data("resnet18_reference.safetensors")).unwrap();
    let r = SafeTensors::deserialize(&bytes).unwrap();
    let floats = |name: &str| -> (Vec<usize>, Vec<f32>) {
        let t = r.tensor(name).unwrap();
        let v = t
            .data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        (t.shape().to_vec(), v)
    };
    let g = Graph::new();
    for case in ["2x3x64x64", "1x3x97x81", "1x3x224x224"] {
        let (shape, x) = floats(&format!("input/{case}"));
        let (want_shape, want) = floats(&format!("logits/{case}"));
        let x = g.from_slice(&x, &shape).unwrap();
        let y = model.forward(&g, x).unwrap();
        assert_eq!(y.shape().as_slice(), want_shape.as_slice(), "{case}");
        let got = y.to_vec::<f32>().unwrap();
        let worst = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(worst <= 1e-4, "{case}: scores differ by up to {worst}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The model's state is torchvision's by name and shape (the counters aside); a transposed
/// classifier and a missing running variance are refused by name, and nothing changes.
#[test]
fn resnet18_state_is_torchvisions_and_refusals_name_the_key() {
    let mut model = ResNet::resnet18(1000, &mut Rng::seed(0)).unwrap();
    model.set_training(false);
    let ours: Vec<(String, Vec<usize>)> = model
        .named_state()
        .into_iter()
        .map(|(n, p, _)| (n, p.shape().to_vec()))
        .collect();
    let theirs: Vec<(String, Vec<usize>)> = names()
        .into_iter()
        .filter(|(n, _, _)| !n.ends_with("num_batches_tracked"))
        .map(|(n, s, _)| (n, s))
        .collect();
    assert_eq!(ours, theirs);
    let before = arenagrad::nn::checkpoint::state_dict(&model);
    let dir = temp_dir("resnet18-bad");
    let good = arenagrad::nn::checkpoint::read_tensors(torchvision_file(&dir));
    // Reading the file as it is gives the int64 counters as i64 tensors; the model's loader
    // leaves them out before decoding (it has no such buffers).
    let counters: Vec<_> = good
        .unwrap()
        .into_iter()
        .filter(|(n, _)| n.ends_with("num_batches_tracked"))
        .collect();
    assert!(!counters.is_empty());
    assert!(counters.iter().all(|(_, t)| t.dtype() == DType::I64));
    let mut tensors = arenagrad::nn::checkpoint::KeyMap::new()
        .drop("*num_batches_tracked")
        .read(dir.join("resnet18.safetensors"))
        .unwrap();
    let save = |t: &[(String, HostTensor)], name: &str| {
        let p = dir.join(name);
        arenagrad::nn::checkpoint::save_tensors(t.iter().map(|(n, t)| (n.as_str(), t)), &p)
            .unwrap();
        p
    };
    let at = tensors.iter().position(|(n, _)| n == "fc.weight").unwrap();
    tensors[at].1 = tensors[at].1.transposed().unwrap();
    let err = model
        .load_torchvision(save(&tensors, "shape.safetensors"))
        .unwrap_err();
    assert!(err.to_string().contains("fc.weight"), "{err}");
    tensors[at].1 = tensors[at].1.transposed().unwrap();
    tensors.retain(|(n, _)| n != "layer3.1.bn2.running_var");
    let err = model
        .load_torchvision(save(&tensors, "missing.safetensors"))
        .unwrap_err();
    assert!(
        err.to_string().contains("layer3.1.bn2.running_var"),
        "{err}"
    );
    assert_eq!(
        arenagrad::nn::checkpoint::state_dict(&model),
        before,
        "a refused load changed the model"
    );
    // Images that are not [batch, 3, h, w] are a typed error.
    let g = Graph::new();
    let x = g.zeros(&[1, 1, 32, 32], DType::F32).unwrap();
    let err = model.forward(&g, x).unwrap_err().to_string();
    assert!(err.contains("ResNet"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The model summary of ResNet-18 (10 classes) for a 64×64 image: every module torchvision
/// has with parameters or buffers, in its order, with the output shape PyTorch's forward hooks
/// report for it and its parameter count (listed from torchvision itself).
#[test]
fn resnet18_summary_matches_pytorch_hooks() {
    let mut model = ResNet::resnet18(10, &mut Rng::seed(0)).unwrap();
    model.set_training(false);
    let input = HostTensor::zeros(&[1, 3, 64, 64], DType::F32).unwrap();
    let s = arenagrad::nn::summary::summary(&model, &input).unwrap();
    let want: &[(&str, &[usize], usize)] = &[
        ("conv1", &[1, 64, 32, 32][..], 9408),
        ("bn1", &[1, 64, 32, 32][..], 128),
        ("layer1", &[1, 64, 16, 16][..], 147968),
        ("layer1.0", &[1, 64, 16, 16][..], 73984),
        ("layer1.0.conv1", &[1, 64, 16, 16][..], 36864),
        ("layer1.0.bn1", &[1, 64, 16, 16][..], 128),
        ("layer1.0.conv2", &[1, 64, 16, 16][..], 36864),
        ("layer1.0.bn2", &[1, 64, 16, 16][..], 128),
        ("layer1.1", &[1, 64, 16, 16][..], 73984),
        ("layer1.1.conv1", &[1, 64, 16, 16][..], 36864),
        ("layer1.1.bn1", &[1, 64, 16, 16][..], 128),
        ("layer1.1.conv2", &[1, 64, 16, 16][..], 36864),
        ("layer1.1.bn2", &[1, 64, 16, 16][..], 128),
        ("layer2", &[1, 128, 8, 8][..], 525568),
        ("layer2.0", &[1, 128, 8, 8][..], 230144),
        ("layer2.0.conv1", &[1, 128, 8, 8][..], 73728),
        ("layer2.0.bn1", &[1, 128, 8, 8][..], 256),
        ("layer2.0.conv2", &[1, 128, 8, 8][..], 147456),
        ("layer2.0.bn2", &[1, 128, 8, 8][..], 256),
        ("layer2.0.downsample", &[1, 128, 8, 8][..], 8448),
        ("layer2.0.downsample.0", &[1, 128, 8, 8][..], 8192),
        ("layer2.0.downsample.1", &[1, 128, 8, 8][..], 256),
        ("layer2.1", &[1, 128, 8, 8][..], 295424),
        ("layer2.1.conv1", &[1, 128, 8, 8][..], 147456),
        ("layer2.1.bn1", &[1, 128, 8, 8][..], 256),
        ("layer2.1.conv2", &[1, 128, 8, 8][..], 147456),
        ("layer2.1.bn2", &[1, 128, 8, 8][..], 256),
        ("layer3", &[1, 256, 4, 4][..], 2099712),
        ("layer3.0", &[1, 256, 4, 4][..], 919040),
        ("layer3.0.conv1", &[1, 256, 4, 4][..], 294912),
        ("layer3.0.bn1", &[1, 256, 4, 4][..], 512),
        ("layer3.0.conv2", &[1, 256, 4, 4][..], 589824),
        ("layer3.0.bn2", &[1, 256, 4, 4][..], 512),
        ("layer3.0.downsample", &[1, 256, 4, 4][..], 33280),
        ("layer3.0.downsample.0", &[1, 256, 4, 4][..], 32768),
        ("layer3.0.downsample.1", &[1, 256, 4, 4][..], 512),
        ("layer3.1", &[1, 256, 4, 4][..], 1180672),
        ("layer3.1.conv1", &[1, 256, 4, 4][..], 589824),
        ("layer3.1.bn1", &[1, 256, 4, 4][..], 512),
        ("layer3.1.conv2", &[1, 256, 4, 4][..], 589824),
        ("layer3.1.bn2", &[1, 256, 4, 4][..], 512),
        ("layer4", &[1, 512, 2, 2][..], 8393728),
        ("layer4.0", &[1, 512, 2, 2][..], 3673088),
        ("layer4.0.conv1", &[1, 512, 2, 2][..], 1179648),
        ("layer4.0.bn1", &[1, 512, 2, 2][..], 1024),
        ("layer4.0.conv2", &[1, 512, 2, 2][..], 2359296),
        ("layer4.0.bn2", &[1, 512, 2, 2][..], 1024),
        ("layer4.0.downsample", &[1, 512, 2, 2][..], 132096),
        ("layer4.0.downsample.0", &[1, 512, 2, 2][..], 131072),
        ("layer4.0.downsample.1", &[1, 512, 2, 2][..], 1024),
        ("layer4.1", &[1, 512, 2, 2][..], 4720640),
        ("layer4.1.conv1", &[1, 512, 2, 2][..], 2359296),
        ("layer4.1.bn1", &[1, 512, 2, 2][..], 1024),
        ("layer4.1.conv2", &[1, 512, 2, 2][..], 2359296),
        ("layer4.1.bn2", &[1, 512, 2, 2][..], 1024),
        ("fc", &[1, 10][..], 5130),
    ];
    let got: Vec<(&str, &[usize], usize)> = s
        .rows
        .iter()
        .map(|r| {
            (
                r.name.as_str(),
                r.output.as_deref().unwrap_or(&[]),
                r.params,
            )
        })
        .collect();
    assert_eq!(got, want);
    assert_eq!((s.total, s.trainable), (11_181_642, 11_181_642));
    assert_eq!(s.output, [1, 10]);
    let table = s.with_depth(1).to_string();
    assert!(table.contains("Total params: 11,181,642"), "{table}");
    assert!(
        table.lines().any(|l| l.trim_start().starts_with("layer4 ")),
        "{table}"
    );
    assert!(
        !table.contains("conv2"),
        "depth 1 shows no block's layers: {table}"
    );
}
