//! The repository's README shows the same example as the `arenagrad` crate's README, which is
//! compiled and run as a doctest: the two must not drift apart.

fn first_rust_block(text: &str) -> &str {
    let start = text.find("```rust").expect("a ```rust block");
    let end = start + 7 + text[start + 7..].find("```").expect("its closing fence");
    &text[start..end]
}

#[test]
fn the_readme_example_is_the_doctested_one() {
    let repo = include_str!("../README.md");
    let krate = include_str!("../crates/arenagrad/README.md");
    assert_eq!(first_rust_block(repo), first_rust_block(krate));
}
