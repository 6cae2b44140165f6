//! IDX files (plain and gzipped) and seeded mini-batches.

use arenagrad_nn::data::{encode_idx, parse_idx, read_idx, write_idx, Dataset, IdxArray, IdxData};
use arenagrad_nn::{HostData, NnError, Rng};

/// `n` synthetic 4×3 images whose pixels encode their index, and labels `i % 10`.
fn synthetic(n: usize) -> (IdxArray, IdxArray) {
    let px: Vec<u8> = (0..n * 12).map(|k| ((k / 12) * 7 + k % 12) as u8).collect();
    (
        IdxArray {
            dims: vec![n, 4, 3],
            data: IdxData::U8(px),
        },
        IdxArray {
            dims: vec![n],
            data: IdxData::U8((0..n).map(|i| (i % 10) as u8).collect()),
        },
    )
}

#[test]
fn idx_round_trips_plain_and_gzipped_for_every_type() {
    let dir = tempfile::tempdir().unwrap();
    let arrays = [
        IdxData::U8(vec![0, 1, 255, 7, 8, 9]),
        IdxData::I8(vec![-128, 1, 127, 0, -1, 5]),
        IdxData::I16(vec![-30000, 1, 2, 3, 4, 30000]),
        IdxData::I32(vec![i32::MIN, -1, 0, 1, 2, i32::MAX]),
        IdxData::F32(vec![0.5, -1.25, f32::INFINITY, 3.0, 4.0, 1e-30]),
        IdxData::F64(vec![0.1, -2.5, 3.0, 4.0, 5.0, f64::MAX]),
    ];
    for data in arrays {
        let a = IdxArray {
            dims: vec![2, 3],
            data,
        };
        for gzip in [false, true] {
            let path = dir.path().join(format!("a{gzip}.idx"));
            write_idx(&path, &a, gzip).unwrap();
            let raw = std::fs::read(&path).unwrap();
            assert_eq!(raw[..2] == [0x1f, 0x8b], gzip);
            assert_eq!(read_idx(&path).unwrap(), a);
            assert_eq!(parse_idx(&raw).unwrap(), a);
        }
    }
}

#[test]
fn idx_layout_matches_the_format() {
    let a = IdxArray {
        dims: vec![2, 1],
        data: IdxData::I16(vec![1, -2]),
    };
    assert_eq!(
        encode_idx(&a, false).unwrap(),
        vec![0, 0, 0x0B, 2, 0, 0, 0, 2, 0, 0, 0, 1, 0, 1, 0xff, 0xfe]
    );
    // MNIST's label header: magic 0x00000801, count.
    let labels = parse_idx(&[0, 0, 8, 1, 0, 0, 0, 3, 7, 2, 1]).unwrap();
    assert_eq!(labels.dims, vec![3]);
    assert_eq!(labels.data, IdxData::U8(vec![7, 2, 1]));
    assert!(encode_idx(
        &IdxArray {
            dims: vec![3],
            data: IdxData::U8(vec![1])
        },
        false
    )
    .is_err());
}

#[test]
fn bad_magic_and_types_are_typed() {
    assert!(matches!(
        parse_idx(b"PK\x03\x04 not idx"),
        Err(NnError::IdxMagic { magic, .. }) if magic == b"PK\x03\x04"
    ));
    assert!(matches!(parse_idx(&[]), Err(NnError::IdxMagic { magic, .. }) if magic.is_empty()));
    assert!(matches!(
        parse_idx(&[0, 0, 8, 0]),
        Err(NnError::IdxMagic { .. })
    ));
    assert!(matches!(
        parse_idx(&[0, 0, 0x0A, 1, 0, 0, 0, 0]),
        Err(NnError::IdxType { code: 0x0A, .. })
    ));
    // A header claiming an absurd size fails on the data, without allocating it.
    assert!(matches!(
        parse_idx(&[
            0, 0, 0x0E, 3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff
        ]),
        Err(NnError::IdxTruncated { .. }) | Err(NnError::IdxTooLarge { .. })
    ));
    let dir = tempfile::tempdir().unwrap();
    assert!(matches!(
        read_idx(dir.path().join("missing")),
        Err(NnError::Io { .. })
    ));
}

#[test]
fn truncated_files_are_typed_at_every_offset() {
    let (images, _) = synthetic(5);
    for gzip in [false, true] {
        let bytes = encode_idx(&images, gzip).unwrap();
        for len in 0..bytes.len() {
            match parse_idx(&bytes[..len]) {
                Err(NnError::IdxTruncated { .. }) | Err(NnError::IdxMagic { .. }) => {}
                // A cut gzip stream may also be reported by the decompressor as corrupt.
                Err(NnError::IdxCorrupt { .. }) if gzip => {}
                other => panic!("gzip {gzip}, cut at {len}: {other:?}"),
            }
        }
        assert_eq!(parse_idx(&bytes).unwrap(), images);
    }
    // A plain file cut inside the body reports how much is missing.
    let bytes = encode_idx(&images, false).unwrap();
    assert!(matches!(
        parse_idx(&bytes[..bytes.len() - 3]),
        Err(NnError::IdxTruncated { expected, got, .. }) if expected == bytes.len() as u64 && got + 3 == expected
    ));
}

#[test]
fn corrupted_gzip_is_an_error_not_a_panic() {
    let (images, _) = synthetic(5);
    let bytes = encode_idx(&images, true).unwrap();
    for pos in 2..bytes.len() {
        let mut c = bytes.clone();
        c[pos] ^= 0x55;
        // Either an error, or (for bytes the decoder ignores, like the header's timestamp) the data.
        if let Ok(a) = parse_idx(&c) {
            assert_eq!(a.dims.len(), 3, "byte {pos}");
        }
    }
}

#[test]
fn dataset_from_files_and_batches() {
    let dir = tempfile::tempdir().unwrap();
    let (images, labels) = synthetic(10);
    let ip = dir.path().join("train-images-idx3-ubyte.gz");
    let lp = dir.path().join("train-labels-idx1-ubyte");
    write_idx(&ip, &images, true).unwrap();
    write_idx(&lp, &labels, false).unwrap();
    let ds = Dataset::from_idx_files(&ip, &lp).unwrap();
    assert_eq!(ds.len(), 10);
    assert_eq!(ds.sample_shape(), &[1, 4, 3]);
    assert_eq!(ds.num_classes(), 10);
    let (x, y) = ds.batch(&[3, 0]).unwrap();
    assert_eq!(x.shape(), vec![2, 1, 4, 3]);
    assert_eq!(y, vec![3, 0]);
    let HostData::F32(v) = x.data() else { panic!() };
    assert_eq!(v[0], 21.0 / 255.0); // image 3, pixel 0 = 3·7
    assert_eq!(v[12], 0.0);
    assert!(v.iter().all(|p| (0.0..=1.0).contains(p)));
    let sizes: Vec<usize> = ds.batches(4).unwrap().map(|b| b.unwrap().1.len()).collect();
    assert_eq!(sizes, vec![4, 4, 2]);
    let sizes: Vec<usize> = ds
        .batches(4)
        .unwrap()
        .drop_last(true)
        .map(|b| b.unwrap().1.len())
        .collect();
    assert_eq!(sizes, vec![4, 4]);
    assert_eq!(ds.batches(3).unwrap().len(), 4);
    assert!(matches!(ds.batches(0), Err(NnError::InvalidConfig { .. })));
    assert!(matches!(
        ds.batch(&[10]),
        Err(NnError::IndexOutOfRange { index: 10, .. })
    ));
    assert_eq!(ds.take(3).len(), 3);
}

#[test]
fn shuffling_is_seeded_and_covers_every_sample_once() {
    let (images, labels) = synthetic(23);
    let ds = Dataset::from_idx(images, labels).unwrap();
    let epoch = |rng: &mut Rng| -> Vec<usize> {
        ds.shuffled_batches(5, rng)
            .unwrap()
            .flat_map(|b| {
                let (x, _) = b.unwrap();
                let HostData::F32(v) = x.data() else { panic!() };
                // Recover each image's index from its first pixel (index · 7).
                v.chunks(12)
                    .map(|img| (img[0] * 255.0).round() as usize / 7)
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    let mut r1 = Rng::seed(5);
    let mut r2 = Rng::seed(5);
    let e1 = epoch(&mut r1);
    assert_eq!(e1, epoch(&mut r2), "same seed, same order");
    let e2 = epoch(&mut r1);
    assert_ne!(e1, e2, "each epoch draws a new order");
    assert_ne!(e1, (0..23).collect::<Vec<_>>());
    let mut sorted = e1.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..23).collect::<Vec<_>>());
    // Labels travel with their images.
    let mut r = Rng::seed(9);
    for b in ds.shuffled_batches(4, &mut r).unwrap() {
        let (x, y) = b.unwrap();
        let HostData::F32(v) = x.data() else { panic!() };
        for (img, &label) in v.chunks(12).zip(&y) {
            assert_eq!(((img[0] * 255.0).round() as usize / 7) % 10, label);
        }
    }
}

#[test]
fn bad_datasets_are_typed() {
    let (images, labels) = synthetic(4);
    let (_, short) = synthetic(3);
    assert!(matches!(
        Dataset::from_idx(images.clone(), short),
        Err(NnError::BadData { .. })
    ));
    let floats = IdxArray {
        dims: vec![4],
        data: IdxData::F32(vec![0.0; 4]),
    };
    assert!(matches!(
        Dataset::from_idx(images.clone(), floats),
        Err(NnError::BadData { .. })
    ));
    assert!(matches!(
        Dataset::from_idx(labels.clone(), labels),
        Err(NnError::BadData { .. })
    ));
    assert!(matches!(
        Dataset::new(vec![0; 10], vec![0, 1], &[2, 2]),
        Err(NnError::BadData { .. })
    ));
    assert!(Dataset::new(vec![0; 8], vec![0, 1], &[2, 2]).is_ok());
}

#[test]
fn a_sample_shape_whose_element_count_overflows_is_refused() {
    // 3 · 0xAAAA_AAAA_AAAA_AAAB = 2^65 + 1: one element per sample, wrapped.
    let shape = [3, 0xAAAA_AAAA_AAAA_AAAB, 1];
    match Dataset::new(vec![7], vec![0], &shape) {
        Err(NnError::BadData { what, reason }) => {
            assert_eq!(what, "Dataset");
            assert!(reason.contains("overflows"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_label_with_no_class_count_is_refused_not_wrapped_to_zero_classes() {
    let e = Dataset::new(vec![0; 4], vec![3, usize::MAX], &[2, 1]).unwrap_err();
    assert!(
        matches!(&e, NnError::BadData { what: "Dataset", reason } if reason.contains("label 1")),
        "{e}"
    );
    let ds = Dataset::new(vec![0; 4], vec![3, usize::MAX - 1], &[2, 1]).unwrap();
    assert_eq!(ds.num_classes(), usize::MAX);
}

/// Bytes past the dimensions a header gives are refused, plain or gzipped.
#[test]
fn data_past_the_header_is_refused() {
    let (images, _) = synthetic(3);
    let plain = encode_idx(&images, false).unwrap();
    assert!(parse_idx(&plain).is_ok());
    for extra in [1usize, 7, 5000] {
        let mut longer = plain.clone();
        longer.extend(std::iter::repeat_n(0u8, extra));
        let e = parse_idx(&longer).unwrap_err();
        assert!(
            matches!(&e, NnError::IdxCorrupt { reason, .. } if reason.contains("follow")),
            "{extra} bytes: {e}"
        );
        // The same bytes gzipped.
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut enc, &longer).unwrap();
        let gz = enc.finish().unwrap();
        assert!(matches!(parse_idx(&gz), Err(NnError::IdxCorrupt { .. })));
    }
}

/// Bytes after the gzip member are refused as the same bytes after a raw file are, naming the
/// file.
#[test]
fn bytes_after_the_gzip_member_are_refused() {
    let (images, _) = synthetic(3);
    let dir = tempfile::tempdir().unwrap();
    for gzip in [false, true] {
        let whole = encode_idx(&images, gzip).unwrap();
        for extra in [&b"x"[..], &[0u8; 9][..], &vec![0x1f; 70_000][..]] {
            let mut longer = whole.clone();
            longer.extend_from_slice(extra);
            let path = dir
                .path()
                .join(format!("images-{gzip}-{}.idx", extra.len()));
            std::fs::write(&path, &longer).unwrap();
            match read_idx(&path) {
                Err(NnError::IdxCorrupt { path: p, reason }) => {
                    assert_eq!(p, path);
                    assert!(reason.contains("follow"), "{reason}");
                }
                other => panic!("gzip {gzip}, {} bytes: {other:?}", extra.len()),
            }
            assert!(matches!(
                parse_idx(&longer),
                Err(NnError::IdxCorrupt { .. })
            ));
        }
        // A file read to its last byte is still read.
        assert_eq!(parse_idx(&whole).unwrap(), images);
    }
    // A second gzip member after the first is bytes after the member too.
    let gz = encode_idx(&images, true).unwrap();
    let twice = [gz.clone(), gz].concat();
    assert!(matches!(parse_idx(&twice), Err(NnError::IdxCorrupt { .. })));
}
