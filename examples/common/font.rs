//! The font the examples' pictures write their text in: DejaVu Sans, shipped beside them in
//! `examples/assets` with its licence (plotters draws no text without one).

/// Registers the font as plotters' "sans-serif".
pub fn register() -> Result<(), Box<dyn std::error::Error>> {
    plotters::style::register_font(
        "sans-serif",
        plotters::style::FontStyle::Normal,
        include_bytes!("../assets/DejaVuSans.ttf"),
    )
    .map_err(|_| "the bundled font did not load".into())
}
