//! Checkpoints: bit-exact round trips, typed errors for mismatched, truncated and corrupted files,
//! and saves that fail midway leaving the previous checkpoint intact.

use std::io::Write;
use std::path::Path;

use arenagrad_nn::{
    checkpoint, BatchNorm1d, BatchNormConfig, DType, Graph, HostData, HostDataMut, HostTensor,
    Linear, LinearConfig, Module, NnError, ReLU, Rng, Sequential,
};

fn model(seed: u64, hidden: usize) -> Sequential {
    let mut rng = Rng::seed(seed);
    Sequential::new()
        .add(Linear::new(3, hidden, &mut rng).unwrap())
        .add(BatchNorm1d::new(hidden).unwrap())
        .add(ReLU)
        .add(
            Linear::with_config(
                hidden,
                2,
                LinearConfig {
                    dtype: DType::F64,
                    ..Default::default()
                },
                &mut rng,
            )
            .unwrap(),
        )
}

/// Every value's bits, by name.
fn bits(m: &dyn Module) -> Vec<(String, Vec<u64>)> {
    m.named_state()
        .into_iter()
        .map(|(n, p, _)| {
            let b = match p.value().data() {
                HostData::F32(v) => v.iter().map(|x| u64::from(x.to_bits())).collect(),
                HostData::F64(v) => v.iter().map(|x| x.to_bits()).collect(),
                HostData::BF16(v) => v.iter().map(|x| u64::from(x.to_bits())).collect(),
                HostData::F16(v) => v.iter().map(|x| u64::from(x.to_bits())).collect(),
                other => other.to_le_bytes().into_iter().map(u64::from).collect(),
            };
            (n, b)
        })
        .collect()
}

/// Runs a training-mode forward so the BatchNorm's running statistics move off their defaults.
fn touch_running_stats(m: &Sequential) {
    let g = Graph::new();
    let x = g.randn(&[4, 3], DType::F32).unwrap();
    // The first two layers are f32.
    let h = m.get(0).unwrap().forward(&g, x).unwrap();
    m.get(1).unwrap().forward(&g, h).unwrap();
}

#[test]
fn round_trip_is_bit_exact() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.safetensors");
    let a = model(1, 4);
    touch_running_stats(&a);
    // Values a text format would mangle.
    let special = [f32::NAN, f32::INFINITY, -0.0, f32::MIN_POSITIVE / 8.0];
    let mut w = a.get(0).unwrap().named_parameters()[0].1.value();
    if let HostDataMut::F32(v) = w.data_mut() {
        v[..4].copy_from_slice(&special);
    }
    a.get(0).unwrap().named_parameters()[0]
        .1
        .set_value(w)
        .unwrap();
    checkpoint::save(&a, &path).unwrap();
    let b = model(2, 4);
    assert_ne!(bits(&a), bits(&b));
    checkpoint::load(&b, &path).unwrap();
    assert_eq!(bits(&a), bits(&b));
    let names: Vec<String> = checkpoint::load_tensors(&path)
        .unwrap()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(
        names,
        [
            "0.bias",
            "0.weight",
            "1.bias",
            "1.running_mean",
            "1.running_var",
            "1.weight",
            "3.bias",
            "3.weight"
        ]
    );
    // Saving again over the file works, and so does loading it a second time.
    checkpoint::save(&b, &path).unwrap();
    checkpoint::load(&a, &path).unwrap();
    assert_eq!(bits(&a), bits(&b));
}

#[test]
fn mismatched_names_and_shapes_are_listed_and_nothing_changes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.safetensors");
    checkpoint::save(&model(1, 4), &path).unwrap();
    let wide = model(2, 5);
    let before = bits(&wide);
    let e = checkpoint::load(&wide, &path).unwrap_err();
    let NnError::StateMismatch { mismatch, .. } = &e else {
        panic!("{e}")
    };
    assert!(mismatch.missing.is_empty() && mismatch.unexpected.is_empty());
    let names: Vec<&str> = mismatch.shapes.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "0.weight",
            "0.bias",
            "1.weight",
            "1.bias",
            "1.running_mean",
            "1.running_var",
            "3.weight"
        ]
    );
    assert_eq!(mismatch.shapes[0].expected, vec![5, 3]);
    assert_eq!(mismatch.shapes[0].found, vec![4, 3]);
    let msg = e.to_string();
    assert!(
        msg.contains("0.weight: module has shape [5, 3], checkpoint has [4, 3]"),
        "{msg}"
    );
    assert_eq!(bits(&wide), before, "a refused load changes nothing");

    // Another architecture: missing and unexpected names.
    let mut rng = Rng::seed(3);
    let other = Sequential::new()
        .add(Linear::new(3, 4, &mut rng).unwrap())
        .add(ReLU)
        .add(Linear::new(4, 7, &mut rng).unwrap());
    let e = checkpoint::load(&other, &path).unwrap_err();
    let NnError::StateMismatch { mismatch, .. } = &e else {
        panic!("{e}")
    };
    assert_eq!(mismatch.missing, ["2.weight", "2.bias"]);
    assert_eq!(
        mismatch.unexpected,
        [
            "1.bias",
            "1.running_mean",
            "1.running_var",
            "1.weight",
            "3.bias",
            "3.weight"
        ]
    );
    // Non-strict: loads what fits and reports the rest.
    let report = checkpoint::load_with(&other, &path, false).unwrap();
    assert_eq!(report.missing, ["2.weight", "2.bias"]);
    assert_eq!(report.unexpected.len(), 6);
    assert_eq!(
        other.get(0).unwrap().named_parameters()[0].1.value(),
        model(1, 4).get(0).unwrap().named_parameters()[0].1.value()
    );
}

#[test]
fn dtypes_convert_on_load() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.safetensors");
    let f64_layer = Linear::with_config(
        2,
        2,
        LinearConfig {
            dtype: DType::F64,
            ..Default::default()
        },
        &mut Rng::seed(0),
    )
    .unwrap();
    checkpoint::save(&f64_layer, &path).unwrap();
    let f32_layer = Linear::new(2, 2, &mut Rng::seed(9)).unwrap();
    checkpoint::load(&f32_layer, &path).unwrap();
    assert_eq!(f32_layer.weight().dtype(), DType::F32);
    let want: Vec<f32> = f64_layer
        .weight()
        .value()
        .to_f64_vec()
        .iter()
        .map(|&v| v as f32)
        .collect();
    assert_eq!(f32_layer.weight().value().data(), &HostData::F32(want));
}

fn header_len(bytes: &[u8]) -> usize {
    8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize
}

#[test]
fn truncated_files_are_typed_errors_at_every_offset() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.safetensors");
    let a = model(1, 2);
    checkpoint::save(&a, &path).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let header = header_len(&bytes);
    assert!(header > 100 && header < bytes.len());
    let cut = dir.path().join("cut.safetensors");
    // Every offset of the header, and every offset of the data after it.
    for len in 0..bytes.len() {
        std::fs::write(&cut, &bytes[..len]).unwrap();
        let b = model(2, 2);
        let before = bits(&b);
        match checkpoint::load(&b, &cut) {
            Err(NnError::Safetensors { path, .. }) => assert_eq!(path, cut),
            other => panic!("truncated at {len}: {other:?}"),
        }
        assert_eq!(bits(&b), before);
    }
    checkpoint::load(&model(2, 2), &path).unwrap();
}

#[test]
fn corrupted_files_are_typed_errors_never_wrong_values() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.safetensors");
    let a = model(1, 2);
    checkpoint::save(&a, &path).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let header = header_len(&bytes);
    let bad = dir.path().join("bad.safetensors");
    let mut errors = 0;
    let mut checksum_errors = 0;
    for pos in 0..bytes.len() {
        for bit in 0..8 {
            let mut c = bytes.clone();
            c[pos] ^= 1 << bit;
            let b = model(2, 2);
            let before = bits(&b);
            // The in-memory path of `load` (the file path is only a label).
            let loaded = checkpoint::tensors_from_bytes(&c, &bad)
                .and_then(|t| checkpoint::load_state_dict(&b, t, true, &bad));
            match loaded.map(|_| ()) {
                Ok(()) => assert_eq!(
                    bits(&b),
                    bits(&a),
                    "byte {pos} bit {bit}: loaded, but not the saved values"
                ),
                Err(e) => {
                    errors += 1;
                    if matches!(e, NnError::Checksum { .. }) {
                        checksum_errors += 1;
                    }
                    assert!(
                        matches!(
                            e,
                            NnError::Safetensors { .. }
                                | NnError::Checksum { .. }
                                | NnError::Metadata { .. }
                                | NnError::StateMismatch { .. }
                                | NnError::UnsupportedDType { .. }
                        ),
                        "byte {pos} bit {bit}: {e}"
                    );
                    assert_eq!(bits(&b), before, "a failed load changed the module");
                }
            }
        }
    }
    // The file path reads the same bytes the same way.
    let mut c = bytes.clone();
    c[header + 3] ^= 4;
    std::fs::write(&bad, &c).unwrap();
    assert!(matches!(
        checkpoint::load(&model(2, 2), &bad),
        Err(NnError::Checksum { .. })
    ));
    // Every flipped data bit is caught by the checksum.
    assert!(
        checksum_errors >= (bytes.len() - header) * 8,
        "{checksum_errors}"
    );
    assert!(errors > bytes.len() * 6, "{errors}");
}

/// A writer that fails (as a full disk does) after `budget` bytes.
struct FailingWriter<W> {
    inner: W,
    budget: usize,
}

impl<W: Write> Write for FailingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.budget == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::StorageFull,
                "no space left on device",
            ));
        }
        let n = buf.len().min(self.budget);
        let n = self.inner.write(&buf[..n])?;
        self.budget -= n;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

fn dir_entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn a_save_that_fails_midway_keeps_the_old_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.safetensors");
    let old = model(1, 4);
    checkpoint::save(&old, &path).unwrap();
    let old_bytes = std::fs::read(&path).unwrap();
    let new = model(2, 4);
    let total = checkpoint::tensors_to_bytes(
        checkpoint::state_dict(&new)
            .iter()
            .map(|(n, t)| (n.as_str(), t)),
    )
    .unwrap()
    .len();
    for budget in [0, 1, 8, total / 2, total - 1] {
        let e = checkpoint::save_with_writer(&new, &path, |f| FailingWriter { inner: f, budget })
            .unwrap_err();
        match &e {
            NnError::Io { source, .. } => {
                assert_eq!(source.kind(), std::io::ErrorKind::StorageFull)
            }
            other => panic!("{other}"),
        }
        assert_eq!(std::fs::read(&path).unwrap(), old_bytes, "budget {budget}");
        let probe = model(3, 4);
        checkpoint::load(&probe, &path).unwrap();
        assert_eq!(bits(&probe), bits(&old));
        assert_eq!(
            dir_entries(dir.path()),
            ["m.safetensors"],
            "temporary file left behind"
        );
    }
    // With enough room the same call replaces the file.
    checkpoint::save_with_writer(&new, &path, |f| FailingWriter {
        inner: f,
        budget: total,
    })
    .unwrap();
    let probe = model(3, 4);
    checkpoint::load(&probe, &path).unwrap();
    assert_eq!(bits(&probe), bits(&new));
}

#[test]
fn a_crash_mid_save_leaves_only_a_stray_temporary() {
    // A process killed mid-save leaves its temporary file; the checkpoint itself is untouched and
    // later saves are unaffected.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.safetensors");
    let old = model(1, 4);
    checkpoint::save(&old, &path).unwrap();
    let stray = dir.path().join(".m.safetensors.tmp-1-0");
    std::fs::write(&stray, b"partial").unwrap();
    let probe = model(2, 4);
    checkpoint::load(&probe, &path).unwrap();
    assert_eq!(bits(&probe), bits(&old));
    checkpoint::save(&model(5, 4), &path).unwrap();
    checkpoint::load(&probe, &path).unwrap();
    assert_eq!(bits(&probe), bits(&model(5, 4)));
}

#[test]
fn io_errors_and_foreign_files() {
    let dir = tempfile::tempdir().unwrap();
    let m = model(1, 2);
    let missing = dir.path().join("nope.safetensors");
    assert!(matches!(
        checkpoint::load(&m, &missing),
        Err(NnError::Io { path, .. }) if path == missing
    ));
    assert!(matches!(
        checkpoint::save(&m, dir.path().join("no/such/dir/m.safetensors")),
        Err(NnError::Io { .. })
    ));
    // A file written by another tool: no checksum, and an integer tensor, which loads as i64.
    let ints: Vec<u8> = [1i64, 2].iter().flat_map(|v| v.to_le_bytes()).collect();
    let view =
        safetensors::tensor::TensorView::new(safetensors::Dtype::I64, vec![2], &ints).unwrap();
    let foreign = dir.path().join("foreign.safetensors");
    safetensors::serialize_to_file([("steps", view)], None, &foreign).unwrap();
    let loaded = checkpoint::load_tensors(&foreign).unwrap();
    assert_eq!(loaded[0].1.as_slice::<i64>(), Some(&[1i64, 2][..]));
    // A dtype the engine lacks (int16) is refused, naming the tensor.
    let shorts: Vec<u8> = [1i16, 2].iter().flat_map(|v| v.to_le_bytes()).collect();
    let view =
        safetensors::tensor::TensorView::new(safetensors::Dtype::I16, vec![2], &shorts).unwrap();
    safetensors::serialize_to_file([("steps", view)], None, &foreign).unwrap();
    assert!(matches!(
        checkpoint::load_tensors(&foreign),
        Err(NnError::UnsupportedDType { name, .. }) if name == "steps"
    ));
    let floats: Vec<u8> = [0.5f32, 1.5].iter().flat_map(|v| v.to_le_bytes()).collect();
    let view =
        safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![2], &floats).unwrap();
    safetensors::serialize_to_file([("x", view)], None, &foreign).unwrap();
    let t = checkpoint::load_tensors(&foreign).unwrap();
    assert_eq!(t[0].1, HostTensor::new(vec![0.5f32, 1.5], &[2]).unwrap());
    // Tensors that are not a module's.
    let plain = dir.path().join("plain.safetensors");
    let h = HostTensor::new(vec![1.0f64, 2.0, 3.0], &[3]).unwrap();
    checkpoint::save_tensors([("a", &h)], &plain).unwrap();
    assert_eq!(
        checkpoint::load_tensors(&plain).unwrap(),
        vec![("a".to_string(), h)]
    );
}

#[test]
fn batchnorm_running_stats_survive_a_round_trip_and_drive_eval() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bn.safetensors");
    let cfg = BatchNormConfig {
        dtype: DType::F64,
        ..Default::default()
    };
    let a = BatchNorm1d::with_config(2, cfg).unwrap();
    let g = Graph::new();
    let x = g
        .from_f64(&[1.0, 10.0, 3.0, 30.0, 2.0, 0.0], &[3, 2], DType::F64)
        .unwrap();
    a.forward(&g, x).unwrap();
    checkpoint::save(&a, &path).unwrap();
    let mut b = BatchNorm1d::with_config(2, cfg).unwrap();
    checkpoint::load(&b, &path).unwrap();
    let mut a = a;
    a.eval();
    b.eval();
    assert_eq!(
        a.forward(&g, x).unwrap().to_vec::<f64>().unwrap(),
        b.forward(&g, x).unwrap().to_vec::<f64>().unwrap()
    );
}

/// A safetensors file whose header is `header` (padded to 8 bytes) over `data`.
fn file_with_header(header: &str, data: &[u8]) -> Vec<u8> {
    let mut h = header.as_bytes().to_vec();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&h);
    out.extend_from_slice(data);
    out
}

#[test]
fn a_header_listing_a_name_twice_is_refused() {
    let entry = r#"{"dtype":"F32","shape":[1],"data_offsets":[0,4]}"#;
    let data = 1.5f32.to_le_bytes();
    let path = Path::new("dup.safetensors");
    // Once: fine. Twice, spelled alike or through an escape: refused.
    let ok = file_with_header(&format!(r#"{{"w":{entry}}}"#), &data);
    assert_eq!(checkpoint::tensors_from_bytes(&ok, path).unwrap().len(), 1);
    for twice in [
        format!(r#"{{"w":{entry},"w":{entry}}}"#),
        format!(r#"{{"w":{entry}, "\u0077":{entry}}}"#),
        format!(r#"{{"__metadata__":{{"a":"b"}},"w":{entry},"__metadata__":{{"a":"c"}}}}"#),
    ] {
        let bytes = file_with_header(&twice, &data);
        let e = checkpoint::tensors_from_bytes(&bytes, path).unwrap_err();
        assert!(
            matches!(&e, NnError::Metadata { reason, .. } if reason.contains("more than once")),
            "{twice}: {e}"
        );
    }
    // Nested objects may repeat their keys' names across entries.
    let two = r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}"#;
    let bytes = file_with_header(two, &[data, data].concat());
    assert_eq!(
        checkpoint::tensors_from_bytes(&bytes, path).unwrap().len(),
        2
    );
}

/// Saving to a symbolic link writes the file it points to; the link stays a link.
#[cfg(unix)]
#[test]
fn saving_through_a_symlink_writes_its_target() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("real.safetensors");
    let link = dir.path().join("latest.safetensors");
    std::os::unix::fs::symlink("real.safetensors", &link).unwrap();
    let a = model(3, 4);
    checkpoint::save(&a, &link).unwrap();
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert!(target.is_file());
    let b = model(4, 4);
    checkpoint::load(&b, &target).unwrap();
    assert_eq!(bits(&a), bits(&b));
    // A second save through the link replaces the target again.
    let c = model(5, 4);
    checkpoint::save(&c, &link).unwrap();
    checkpoint::load(&b, &link).unwrap();
    assert_eq!(bits(&b), bits(&c));
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    // A loop of links is an error, and leaves no temporary behind.
    let l1 = dir.path().join("l1");
    let l2 = dir.path().join("l2");
    std::os::unix::fs::symlink("l2", &l1).unwrap();
    std::os::unix::fs::symlink("l1", &l2).unwrap();
    assert!(matches!(checkpoint::save(&a, &l1), Err(NnError::Io { .. })));
    let stray: Vec<_> = dir_entries(dir.path())
        .into_iter()
        .filter(|n| n.contains(".tmp-"))
        .collect();
    assert!(stray.is_empty(), "{stray:?}");
}

/// Tensors large enough to be decoded by several threads in parts (a million elements and
/// more, of odd lengths so the parts are uneven) come back bit for bit, beside small ones.
#[test]
fn large_tensors_decode_in_parallel_parts_bit_for_bit() {
    use arenagrad_nn::checkpoint::{load_tensors, save_tensors};
    let n32 = 1_234_567;
    let n64 = 777_777;
    let f32s: Vec<f32> = (0..n32)
        .map(|i| (i as f32).sin() * 1e3 + i as f32)
        .collect();
    let f64s: Vec<f64> = (0..n64)
        .map(|i| (i as f64).cos() / (1.0 + i as f64))
        .collect();
    let a = arenagrad_nn::HostTensor::new(f32s.clone(), &[n32]).unwrap();
    let b = arenagrad_nn::HostTensor::new(f64s.clone(), &[n64]).unwrap();
    let c = arenagrad_nn::HostTensor::new(vec![1.5f32, -2.0], &[2]).unwrap();
    let dir = std::env::temp_dir().join(format!("arenagrad-bigdecode-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("big.safetensors");
    save_tensors([("a", &a), ("b", &b), ("c", &c)], &path).unwrap();
    let back = load_tensors(&path).unwrap();
    assert_eq!(back[0].1.as_slice::<f32>().unwrap(), f32s.as_slice());
    assert_eq!(back[1].1.as_slice::<f64>().unwrap(), f64s.as_slice());
    assert_eq!(back[2].1, c);
    std::fs::remove_dir_all(&dir).unwrap();
}
