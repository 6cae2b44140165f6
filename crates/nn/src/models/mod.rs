//! Whole models built from the layers: a character-level GPT.

pub(crate) mod gpt;
