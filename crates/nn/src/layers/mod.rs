//! The layers.

pub(crate) mod attention;
pub(crate) mod basic;
pub(crate) mod conv;
pub(crate) mod linear;
pub(crate) mod norm;
pub(crate) mod rnn;
pub(crate) mod sequential;
