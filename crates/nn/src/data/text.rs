//! Text for character (byte) language models: a corpus of documents split into training and
//! validation text by document, and windows of it as batches of next-token predictions.
//!
//! [`TextCorpus::from_fortune_dir`] reads the fortune-cookie files of Debian's `fortunes`
//! package (`/usr/share/games/fortunes/`): plain text, one document after another, each ended by
//! a line holding only `%`. Each text file is read once (the `.u8` names are links to the same
//! files), the `.dat` indexes and folders are skipped, and files are taken in name order so the
//! split is the same everywhere.

use std::path::Path;

use arenagrad_graph::GraphError;

use super::try_vec;
use crate::error::{NnError, Result};
use crate::files::io;
use crate::Rng;

/// Which part of a [`TextCorpus`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    /// The training text.
    Train,
    /// The validation text.
    Valid,
}

/// Documents joined into a training and a validation text, bytes as tokens (a vocabulary of
/// 256). Each document keeps its `%` line, so a model learns where one ends.
///
/// ```
/// use arenagrad_nn::data::{Split, TextCorpus};
/// use arenagrad_nn::Rng;
/// let docs: Vec<&[u8]> = (0..20).map(|_| b"To be or not to be.\n".as_slice()).collect();
/// let corpus = TextCorpus::from_documents(&docs, 10)?;
/// assert_eq!(corpus.documents(), (18, 2)); // every 10th document is for validation
/// let (x, y) = corpus.batch(Split::Train, 4, 8, &mut Rng::seed(0))?;
/// assert_eq!((x.len(), y.len()), (32, 32));
/// assert_eq!(&x[1..8], &y[..7]); // each target is the next input
/// # Ok::<(), arenagrad_nn::NnError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextCorpus {
    train: Vec<u8>,
    valid: Vec<u8>,
    /// Where each document ends (its `%` line included) in the training and validation text:
    /// the boundaries `documents_of` returns, kept rather than found again by looking for `%`
    /// lines, which a document may hold itself.
    ends: (Vec<usize>, Vec<usize>),
    files: usize,
}

impl TextCorpus {
    /// The documents of a fortune directory; document `i` (counted over the files in name
    /// order) goes to validation when `i % valid_every == valid_every − 1`.
    pub fn from_fortune_dir(dir: impl AsRef<Path>, valid_every: usize) -> Result<Self> {
        Self::from_fortune_files(dir, valid_every, |_| true)
    }

    /// [`TextCorpus::from_fortune_dir`] over the files whose name `keep` accepts (say one
    /// topic for fine-tuning, and the others for pretraining).
    pub fn from_fortune_files(
        dir: impl AsRef<Path>,
        valid_every: usize,
        keep: impl Fn(&str) -> bool,
    ) -> Result<Self> {
        let dir = dir.as_ref();
        let mut paths: Vec<_> = std::fs::read_dir(dir)
            .map_err(io(dir))?
            .map(|e| e.map(|e| e.path()).map_err(io(dir)))
            .collect::<Result<_>>()?;
        paths.sort();
        let mut seen = Vec::new();
        let mut texts = Vec::new();
        for p in paths {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if p.extension().is_some_and(|e| e == "dat") || p.is_dir() || !keep(name) {
                continue;
            }
            let real = std::fs::canonicalize(&p).map_err(io(&p))?;
            if seen.contains(&real) {
                continue;
            }
            texts.push(std::fs::read(&real).map_err(io(&real))?);
            seen.push(real);
        }
        if texts.is_empty() {
            return Err(NnError::BadData {
                what: "TextCorpus",
                reason: format!("no fortune files in {}", dir.display()),
            });
        }
        let docs: Vec<&[u8]> = texts.iter().flat_map(|t| split_fortunes(t)).collect();
        let mut c = Self::from_documents(&docs, valid_every)?;
        c.files = texts.len();
        Ok(c)
    }

    /// `docs` joined, each followed by a `%` line, every `valid_every`-th to validation.
    pub fn from_documents(docs: &[&[u8]], valid_every: usize) -> Result<Self> {
        if valid_every < 2 {
            return Err(NnError::BadData {
                what: "TextCorpus",
                reason: format!("valid_every must be at least 2, got {valid_every}"),
            });
        }
        let (mut train, mut valid, mut ends) = (Vec::new(), Vec::new(), (Vec::new(), Vec::new()));
        for (i, d) in docs.iter().enumerate() {
            let (out, ends) = if i % valid_every == valid_every - 1 {
                (&mut valid, &mut ends.1)
            } else {
                (&mut train, &mut ends.0)
            };
            out.extend_from_slice(d);
            if !d.ends_with(b"\n") {
                out.push(b'\n');
            }
            out.extend_from_slice(b"%\n");
            ends.push(out.len());
        }
        Ok(TextCorpus {
            train,
            valid,
            ends,
            files: 1,
        })
    }

    /// Training and validation document counts.
    pub fn documents(&self) -> (usize, usize) {
        (self.ends.0.len(), self.ends.1.len())
    }

    /// The files read.
    pub fn files(&self) -> usize {
        self.files
    }

    /// The bytes of a split.
    pub fn text(&self, split: Split) -> &[u8] {
        match split {
            Split::Train => &self.train,
            Split::Valid => &self.valid,
        }
    }

    /// The documents of a split, each with the `%` line that ends it (so that a model reading
    /// one document at a time learns where documents end): as many as [`TextCorpus::documents`]
    /// counts, a document that holds `%` lines of its own included.
    ///
    /// ```
    /// use arenagrad_nn::data::{Split, TextCorpus};
    /// let docs: [&[u8]; 3] = [b"one\n", b"two", b"three\n"];
    /// let corpus = TextCorpus::from_documents(&docs, 3)?;
    /// let train = corpus.documents_of(Split::Train);
    /// assert_eq!(train, [&b"one\n%\n"[..], &b"two\n%\n"[..]]);
    /// # Ok::<(), arenagrad_nn::NnError>(())
    /// ```
    pub fn documents_of(&self, split: Split) -> Vec<&[u8]> {
        let (text, ends) = match split {
            Split::Train => (&self.train, &self.ends.0),
            Split::Valid => (&self.valid, &self.ends.1),
        };
        let starts = std::iter::once(0).chain(ends.iter().copied());
        starts.zip(ends).map(|(a, &b)| &text[a..b]).collect()
    }

    fn windows(&self, split: Split, context: usize) -> Result<usize> {
        let n = self.text(split).len();
        if context == 0 || n <= context {
            return Err(NnError::BadData {
                what: "TextCorpus",
                reason: format!("{split:?} text of {n} bytes holds no window of {context} + 1"),
            });
        }
        Ok(n - context)
    }

    /// `batch` windows of `context + 1` bytes starting at `starts`, as inputs and targets
    /// (`[batch, context]` each, row-major; the targets are the inputs shifted by one).
    pub fn batch_at(
        &self,
        split: Split,
        context: usize,
        starts: &[usize],
    ) -> Result<(Vec<usize>, Vec<usize>)> {
        let limit = self.windows(split, context)?;
        let op = "TextCorpus::batch_at";
        self.gather(op, split, context, starts.iter().copied(), limit)
    }

    /// The windows at `starts` (each below `limit`), into inputs and targets reserved fallibly
    /// first: a batch too large to hold is [`GraphError::TooLarge`] or
    /// [`GraphError::OutOfMemory`] naming `op` and `[batch, context]`, not an abort, and no
    /// start is drawn before the room for all of them is there.
    fn gather(
        &self,
        op: &'static str,
        split: Split,
        context: usize,
        starts: impl ExactSizeIterator<Item = usize>,
        limit: usize,
    ) -> Result<(Vec<usize>, Vec<usize>)> {
        let batch = starts.len();
        let shape = [batch, context];
        let n = batch
            .checked_mul(context)
            .ok_or_else(|| GraphError::TooLarge {
                op,
                shape: shape.to_vec(),
            })?;
        let (mut x, mut y) = (try_vec(op, &shape, n)?, try_vec(op, &shape, n)?);
        let text = self.text(split);
        for s in starts {
            if s >= limit {
                return Err(NnError::BadData {
                    what: "TextCorpus",
                    reason: format!("a window at {s} runs past the {split:?} text"),
                });
            }
            x.extend(text[s..s + context].iter().map(|&b| usize::from(b)));
            y.extend(text[s + 1..s + context + 1].iter().map(|&b| usize::from(b)));
        }
        Ok((x, y))
    }

    /// `batch` windows at offsets drawn uniformly with `rng`.
    pub fn batch(
        &self,
        split: Split,
        batch: usize,
        context: usize,
        rng: &mut Rng,
    ) -> Result<(Vec<usize>, Vec<usize>)> {
        let limit = self.windows(split, context)?;
        let starts = (0..batch).map(|_| rng.below(limit));
        self.gather("TextCorpus::batch", split, context, starts, limit)
    }

    /// The `step`-th batch of a fixed order that another program can compute too (the PyTorch
    /// twin of the `char_gpt` example): window `b` starts at `((step·batch + b)·104729) mod n`,
    /// `n` the number of windows, in exact integer arithmetic (as Python's integers compute it)
    /// for every `step` and `batch`.
    pub fn fixed_batch(
        &self,
        split: Split,
        step: usize,
        batch: usize,
        context: usize,
    ) -> Result<(Vec<usize>, Vec<usize>)> {
        let limit = self.windows(split, context)?;
        let n = limit as u128;
        // step·batch + b < 2^128 for 64-bit operands; reducing it mod n first keeps the product
        // by 104729 below 2^81, and changes no residue.
        let starts = (0..batch).map(|b| {
            let k = (step as u128 * batch as u128 + b as u128) % n;
            ((k * 104_729) % n) as usize
        });
        self.gather("TextCorpus::fixed_batch", split, context, starts, limit)
    }

    /// Consecutive windows covering a split (the last one may overlap the one before): every
    /// position predicted once, for a full validation pass.
    pub fn sequential_starts(&self, split: Split, context: usize) -> Result<Vec<usize>> {
        let limit = self.windows(split, context)?;
        let mut v: Vec<usize> = (0..limit).step_by(context).collect();
        if v.last() != Some(&(limit - 1)) && limit > context {
            v.push(limit - 1);
        }
        Ok(v)
    }
}

/// A fortune file's documents: the text between lines that hold only `%`, without empty ones.
fn split_fortunes(text: &[u8]) -> Vec<&[u8]> {
    let mut docs = Vec::new();
    let mut start = 0;
    let mut at = 0;
    while at < text.len() {
        let end = text[at..]
            .iter()
            .position(|&b| b == b'\n')
            .map_or(text.len(), |p| at + p + 1);
        let line = &text[at..end];
        if line == b"%\n" || line == b"%" || line == b"%\r\n" {
            if at > start {
                docs.push(&text[start..at]);
            }
            start = end;
        }
        at = end;
    }
    if start < text.len() {
        docs.push(&text[start..]);
    }
    docs.retain(|d| d.iter().any(|b| !b.is_ascii_whitespace()));
    docs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fortunes_split_on_percent_lines() {
        let t = b"one\nline\n%\ntwo\n%\n%\nthree";
        assert_eq!(
            split_fortunes(t),
            vec![&b"one\nline\n"[..], &b"two\n"[..], &b"three"[..]]
        );
        assert!(split_fortunes(b"%\n%\n").is_empty());
    }

    fn corpus() -> TextCorpus {
        let docs: Vec<&[u8]> = (0..4)
            .map(|_| b"To be or not to be.\n".as_slice())
            .collect();
        TextCorpus::from_documents(&docs, 1000).unwrap()
    }

    #[test]
    fn a_batch_too_large_to_hold_is_a_typed_error_not_an_abort() {
        let c = corpus();
        let mut rng = Rng::seed(0);
        // 2^40 windows of 16: 2^44 indices, more than any address space holds.
        let huge = 1usize << 40;
        let oom = |r: Result<(Vec<usize>, Vec<usize>)>, want: &str| match r {
            Err(NnError::Graph(GraphError::OutOfMemory { op, shape, bytes })) => {
                assert_eq!((op, shape), (want, vec![huge, 16]));
                assert_eq!(bytes, (huge * 16) * std::mem::size_of::<usize>());
            }
            other => panic!("{want}: {other:?}"),
        };
        oom(
            c.batch(Split::Train, huge, 16, &mut rng),
            "TextCorpus::batch",
        );
        oom(
            c.fixed_batch(Split::Train, 3, huge, 16),
            "TextCorpus::fixed_batch",
        );
        // A batch·context that overflows usize.
        match c.batch(Split::Train, usize::MAX / 2, 4, &mut rng) {
            Err(NnError::Graph(GraphError::TooLarge { op, shape })) => {
                assert_eq!((op, shape), ("TextCorpus::batch", vec![usize::MAX / 2, 4]))
            }
            other => panic!("{other:?}"),
        }
        // Nothing was drawn for the refused batches: the generator is where a fresh one is.
        assert_eq!(rng.below(1000), Rng::seed(0).below(1000));
    }

    #[test]
    fn fixed_batch_follows_its_formula_for_any_step() {
        let c = corpus();
        let text = c.text(Split::Train);
        let context = 5;
        let n = (text.len() - context) as u128;
        for (step, batch) in [(0, 3), (7, 4), (1usize << 62, 8), (usize::MAX, 3)] {
            let (x, y) = c.fixed_batch(Split::Train, step, batch, context).unwrap();
            assert_eq!((x.len(), y.len()), (batch * context, batch * context));
            for b in 0..batch {
                // The documented formula, in integers wide enough for these operands.
                let k = step as u128 * batch as u128 + b as u128;
                let s = ((k * 104_729) % n) as usize;
                let want: Vec<usize> = text[s..s + context].iter().map(|&v| v.into()).collect();
                assert_eq!(
                    &x[b * context..(b + 1) * context],
                    want,
                    "step {step}, b {b}"
                );
                assert_eq!(
                    y[b * context],
                    usize::from(text[s + 1]),
                    "step {step}, b {b}"
                );
            }
        }
    }

    #[test]
    fn documents_that_hold_percent_lines_stay_whole() {
        let docs: [&[u8]; 5] = [b"one\n", b"%", b"%\n", b"a\n%\nb\n", b"two"];
        let c = TextCorpus::from_documents(&docs, 1000).unwrap();
        assert_eq!(c.documents(), (5, 0));
        let want: [&[u8]; 5] = [
            b"one\n%\n",
            b"%\n%\n",
            b"%\n%\n",
            b"a\n%\nb\n%\n",
            b"two\n%\n",
        ];
        assert_eq!(c.documents_of(Split::Train), want);
        assert_eq!(c.documents_of(Split::Valid), Vec::<&[u8]>::new());
        // Every other one to validation: the counts and the lists agree there too.
        let c = TextCorpus::from_documents(&docs, 2).unwrap();
        assert_eq!(c.documents(), (3, 2));
        assert_eq!(c.documents_of(Split::Train), [want[0], want[2], want[4]]);
        assert_eq!(c.documents_of(Split::Valid), [want[1], want[3]]);
    }
}
