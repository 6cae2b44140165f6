//! The repository's documents, compiled and run as doctests so that their Rust snippets cannot
//! rot: `docs/testing.md` (and the README, whose example is also the `arenagrad` crate's).
#![forbid(unsafe_code)]

/// `docs/testing.md`.
#[doc = include_str!("testing.md")]
#[cfg(doctest)]
pub struct TestingGuide;

/// `README.md`.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct Readme;
