//! The GAN example's generator covers the mixture's modes after a short run.

#[allow(dead_code)]
#[path = "../examples/gan.rs"]
mod gan;

#[test]
#[cfg_attr(miri, ignore)]
fn short_gan_run_covers_at_least_six_of_eight_modes() {
    let run = gan::train(800, 0).expect("training runs");
    assert_eq!(run.d_loss.len(), 800);
    assert!(run.d_loss.iter().chain(&run.g_loss).all(|l| l.is_finite()));
    let covered = gan::modes_covered(&run.samples);
    assert!(covered >= 6, "generator covers only {covered} of 8 modes");
    // And the check itself is discriminating: samples on one mode cover one.
    let one: Vec<(f64, f64)> = (0..100).map(|i| (2.0 + i as f64 * 1e-3, 0.0)).collect();
    assert_eq!(gan::modes_covered(&one), 1);
}
