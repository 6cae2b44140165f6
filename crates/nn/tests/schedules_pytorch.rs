//! Learning-rate schedules against PyTorch 2.15: the rate at every step of `OneCycleLR`
//! (two-phase cosine; three-phase linear) and after every epoch of `ReduceLROnPlateau` (min and
//! relative, with cooldown and a floor; max and absolute), as PyTorch's schedulers set them.

use arenagrad_nn::optim::{
    Anneal, LrSchedule, OneCycleLr, Optimizer, PlateauConfig, PlateauMode, ReduceLrOnPlateau, Sgd,
    SgdConfig,
};
use arenagrad_nn::{HostTensor, Parameter};

fn close(a: &[f64], b: &[f64]) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x - y).abs() <= 1e-15 * y.abs().max(1e-3),
            "step {i}: {x} vs {y}"
        );
    }
}

fn sgd() -> Sgd {
    let p = Parameter::new("p", HostTensor::new(vec![0.0f32], &[1]).unwrap());
    Sgd::new([p], SgdConfig::new(1.0)).unwrap()
}

#[test]
fn one_cycle_cos_matches_pytorch() {
    let s = OneCycleLr::new(0.1, 50).unwrap();
    s.check().unwrap();
    let got: Vec<f64> = (0..50).map(|k| s.lr_at(k)).collect();
    close(
        &got,
        &[
            0.0040000000000000036,
            0.0052034602152724735,
            0.008753494340683884,
            0.014472088841534572,
            0.022072489510780793,
            0.03117358052235722,
            0.04131899517009691,
            0.052000000000000005,
            0.0626810048299031,
            0.07282641947764279,
            0.08192751048921922,
            0.08952791115846544,
            0.09524650565931612,
            0.09879653978472754,
            0.1,
            0.09979871550490317,
            0.09919648264401378,
            0.09819815024222053,
            0.09681175628501273,
            0.09504846320134738,
            0.09292246799033459,
            0.0904508879153485,
            0.08765362268588736,
            0.08455319423681344,
            0.0811745653949763,
            0.07754493889320883,
            0.07369353834991745,
            0.06965137297768985,
            0.0654509879153485,
            0.06112620219362893,
            0.05671183644422961,
            0.05224343254455968,
            0.04775696745544034,
            0.043288563555770404,
            0.03887419780637107,
            0.03454941208465151,
            0.030349027022310158,
            0.026306861650082565,
            0.022455461106791173,
            0.0188258346050237,
            0.015447205763186566,
            0.012346777314112658,
            0.009549512084651508,
            0.007077932009665416,
            0.004951936798652629,
            0.003188643714987268,
            0.0018022497577794773,
            0.0008039173559862364,
            0.00020168449509684564,
            4e-07,
        ],
    );
}

#[test]
fn one_cycle_linear_three_phase_matches_pytorch() {
    let s = OneCycleLr {
        anneal: Anneal::Linear,
        three_phase: true,
        pct_start: 0.25,
        div_factor: 10.0,
        final_div_factor: 100.0,
        ..OneCycleLr::new(0.2, 40).unwrap()
    };
    s.check().unwrap();
    let got: Vec<f64> = (0..40).map(|k| s.lr_at(k)).collect();
    close(
        &got,
        &[
            0.02,
            0.04,
            0.06,
            0.08,
            0.1,
            0.12000000000000002,
            0.14,
            0.16,
            0.18,
            0.2,
            0.18000000000000002,
            0.16,
            0.14,
            0.12000000000000001,
            0.09999999999999999,
            0.08,
            0.06,
            0.04000000000000001,
            0.01999999999999999,
            0.019057142857142856,
            0.018114285714285715,
            0.017171428571428574,
            0.01622857142857143,
            0.015285714285714286,
            0.014342857142857143,
            0.0134,
            0.012457142857142858,
            0.011514285714285715,
            0.010571428571428572,
            0.009628571428571427,
            0.008685714285714286,
            0.007742857142857142,
            0.0068000000000000005,
            0.005857142857142856,
            0.004914285714285715,
            0.00397142857142857,
            0.003028571428571429,
            0.0020857142857142845,
            0.0011428571428571434,
            0.0001999999999999988,
        ],
    );
}

#[test]
fn plateau_min_relative_matches_pytorch() {
    let mut opt = sgd();
    let cfg = PlateauConfig {
        patience: 2,
        cooldown: 1,
        min_lr: 0.002,
        ..Default::default()
    };
    let mut s = ReduceLrOnPlateau::new(cfg).unwrap();
    let got: Vec<f64> = [
        1.0,
        0.9,
        0.9,
        0.8999,
        0.95,
        0.7,
        0.7,
        0.7,
        0.7,
        0.7,
        0.7,
        0.6999999,
        0.7,
        f64::NAN,
        0.5,
    ]
    .iter()
    .map(|&m| s.step(m, &mut opt).unwrap())
    .collect();
    close(
        &got,
        &[
            1.0,
            1.0,
            1.0,
            1.0,
            1.0,
            1.0,
            1.0,
            1.0,
            0.1,
            0.1,
            0.1,
            0.1,
            0.010000000000000002,
            0.010000000000000002,
            0.010000000000000002,
        ],
    );
    assert_eq!(opt.learning_rate(), *got.last().unwrap());
}

#[test]
fn plateau_max_absolute_matches_pytorch() {
    let mut opt = sgd();
    let cfg = PlateauConfig {
        mode: PlateauMode::Max,
        relative: false,
        threshold: 0.01,
        patience: 1,
        factor: 0.5,
        ..Default::default()
    };
    let mut s = ReduceLrOnPlateau::new(cfg).unwrap();
    let got: Vec<f64> = [0.5, 0.6, 0.6, 0.6, 0.65, 0.65, 0.65, 0.65, 0.9]
        .iter()
        .map(|&m| s.step(m, &mut opt).unwrap())
        .collect();
    close(&got, &[1.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.25, 0.25, 0.25]);
}

/// A scheduler resumed from its saved state reduces when the uninterrupted one does.
#[test]
fn plateau_resumes_from_its_state() {
    let metrics = [
        1.0,
        0.9,
        0.9,
        0.8999,
        0.95,
        0.7,
        0.7,
        0.7,
        0.7,
        0.7,
        0.7,
        0.6999999,
        0.7,
        f64::NAN,
        0.5,
    ];
    let cfg = PlateauConfig {
        patience: 2,
        cooldown: 1,
        ..Default::default()
    };
    let (mut a, mut opt_a) = (ReduceLrOnPlateau::new(cfg).unwrap(), sgd());
    let whole: Vec<f64> = metrics
        .iter()
        .map(|&m| a.step(m, &mut opt_a).unwrap())
        .collect();
    let (mut b, mut opt_b) = (ReduceLrOnPlateau::new(cfg).unwrap(), sgd());
    for &m in &metrics[..6] {
        b.step(m, &mut opt_b).unwrap();
    }
    let (mut c, mut opt_c) = (ReduceLrOnPlateau::new(cfg).unwrap(), sgd());
    c.load_state(b.state());
    opt_c.set_learning_rate(opt_b.learning_rate()).unwrap();
    let rest: Vec<f64> = metrics[6..]
        .iter()
        .map(|&m| c.step(m, &mut opt_c).unwrap())
        .collect();
    assert_eq!(rest, whole[6..]);
    assert!(ReduceLrOnPlateau::new(PlateauConfig { factor: 1.0, ..cfg }).is_err());
}
