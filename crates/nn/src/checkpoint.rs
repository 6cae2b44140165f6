//! Checkpoints: a module's named parameters and buffers in the safetensors format.
//!
//! * [`save`] writes atomically: the bytes go to a temporary file beside the target, which is
//!   synced and then renamed over it (and the directory synced). A crash, a full disk or a failed
//!   write at any point leaves the previous checkpoint as it was. A `path` that is a symbolic
//!   link is written through: the file it points to is replaced (atomically, from a temporary
//!   file beside it) and the link stays a link.
//! * [`load`] checks everything before changing anything: a file whose names or shapes do not
//!   match the module is a [`NnError::StateMismatch`] listing every missing, unexpected and
//!   mis-shaped name, and the module is left untouched. A truncated or corrupted file is a typed
//!   error ([`NnError::Safetensors`], [`NnError::Checksum`]), never a panic.
//! * Files carry a CRC-32 of their tensor data in the safetensors metadata (key `crc32`), so a
//!   flipped bit in the data is caught too. Files written by other tools (without it) load as
//!   well.
//!
//! Tensors are stored under their hierarchical names (`0.weight`, `conv1.bias`,
//! `3.running_mean`) in their own dtype (F32, F64, BF16 or F16); loading converts each to the
//! dtype of the parameter it fills (exact when widening, rounded to nearest even when
//! narrowing, as PyTorch's `load_state_dict` copies).
//!
//! ```
//! use arenagrad_nn::{checkpoint, Linear, Module, Rng};
//! let dir = std::env::temp_dir().join(format!("arenagrad-doc-{}", std::process::id()));
//! std::fs::create_dir_all(&dir).unwrap();
//! let path = dir.join("model.safetensors");
//! let a = Linear::new(3, 2, &mut Rng::seed(1))?;
//! checkpoint::save(&a, &path)?;
//! let b = Linear::new(3, 2, &mut Rng::seed(2))?;
//! checkpoint::load(&b, &path)?;
//! assert_eq!(a.weight().value(), b.weight().value());
//! # std::fs::remove_dir_all(&dir).unwrap();
//! # Ok::<(), arenagrad_nn::NnError>(())
//! ```

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use arenagrad_graph::{bf16, f16, Bool, DType, HostData, HostTensor};
use safetensors::tensor::{Dtype, SafeTensors, View};

use crate::error::{NnError, Result, ShapeConflict, StateMismatch};
use crate::files::io;
pub use crate::files::write_atomic;
use crate::module::Module;
use crate::optim::Optimizer;
use crate::Rng;

/// The metadata key holding the data checksum.
pub const CRC_KEY: &str = "crc32";
/// The metadata key naming the writer.
pub const FORMAT_KEY: &str = "format";
const FORMAT: &str = "arenagrad";

/// One tensor's little-endian bytes, as the format stores them.
struct Blob {
    dtype: Dtype,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

impl View for &Blob {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.bytes)
    }
    fn data_len(&self) -> usize {
        self.bytes.len()
    }
}

fn to_blob(t: &HostTensor) -> Blob {
    let dtype = match t.dtype() {
        DType::F32 => Dtype::F32,
        DType::F64 => Dtype::F64,
        DType::BF16 => Dtype::BF16,
        DType::F16 => Dtype::F16,
        DType::I64 => Dtype::I64,
        DType::I32 => Dtype::I32,
        DType::U8 => Dtype::U8,
        DType::Bool => Dtype::BOOL,
    };
    let bytes = t.data().to_le_bytes();
    Blob {
        dtype,
        shape: t.shape().to_vec(),
        bytes,
    }
}

/// CRC-32 of the tensors' bytes taken in name order (independent of the file's layout).
fn crc_of<'a>(tensors: impl Iterator<Item = &'a [u8]>) -> u32 {
    let mut crc = flate2::Crc::new();
    for b in tensors {
        crc.update(b);
    }
    crc.sum()
}

/// The first name a safetensors header lists twice, read with a JSON parser key by key (the
/// header is a JSON object; safetensors reads it into a map, which keeps one of a repeated
/// name's entries). `None` when every key is distinct or the header is not a JSON object (which
/// safetensors then refuses itself).
fn repeated_key(header: &[u8]) -> Option<String> {
    use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};
    struct FirstRepeat;
    impl<'de> Visitor<'de> for FirstRepeat {
        type Value = Option<String>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: MapAccess<'de>>(
            self,
            mut map: A,
        ) -> std::result::Result<Self::Value, A::Error> {
            let mut seen = std::collections::HashSet::new();
            let mut repeat = None;
            while let Some(key) = map.next_key::<String>()? {
                map.next_value::<IgnoredAny>()?;
                if !seen.insert(key.clone()) && repeat.is_none() {
                    repeat = Some(key);
                }
            }
            Ok(repeat)
        }
    }
    let mut de = serde_json::Deserializer::from_slice(header);
    de.deserialize_map(FirstRepeat).ok().flatten()
}

/// Serialises named tensors to safetensors bytes (with the checksum metadata). Names must be
/// unique; a repeated name keeps its last tensor.
pub fn tensors_to_bytes<'a>(
    tensors: impl IntoIterator<Item = (&'a str, &'a HostTensor)>,
) -> Result<Vec<u8>> {
    let blobs: BTreeMap<&str, Blob> = tensors.into_iter().map(|(n, t)| (n, to_blob(t))).collect();
    let crc = crc_of(blobs.values().map(|b| b.bytes.as_slice()));
    let meta: HashMap<String, String> = [
        (FORMAT_KEY.to_string(), FORMAT.to_string()),
        (CRC_KEY.to_string(), format!("{crc:08x}")),
    ]
    .into_iter()
    .collect();
    safetensors::serialize(blobs.iter().map(|(n, b)| (*n, b)), Some(meta)).map_err(|source| {
        NnError::Safetensors {
            path: PathBuf::from("<memory>"),
            source,
        }
    })
}

/// Parses safetensors bytes into named tensors (sorted by name), verifying the checksum when the
/// file has one. `path` only labels errors.
pub fn tensors_from_bytes(bytes: &[u8], path: &Path) -> Result<Vec<(String, HostTensor)>> {
    tensors_from_bytes_where(bytes, path, &|_| true)
}

/// [`tensors_from_bytes`] for the names `keep` accepts: the others are not decoded (so a
/// dtype the engine does not hold is no error there).
fn tensors_from_bytes_where(
    bytes: &[u8],
    path: &Path,
    keep: &dyn Fn(&str) -> bool,
) -> Result<Vec<(String, HostTensor)>> {
    // The header first (safetensors itself checks its length and JSON): a name it lists twice
    // would be read as one tensor.
    if let Some(header) = bytes
        .get(..8)
        .map(|n| u64::from_le_bytes(n.try_into().expect("invariant: 8 bytes")))
        .and_then(|n| usize::try_from(n).ok())
        .and_then(|n| bytes.get(8..8usize.checked_add(n)?))
    {
        if let Some(dup) = repeated_key(header) {
            return Err(NnError::Metadata {
                path: path.to_path_buf(),
                reason: format!("the header lists {dup:?} more than once"),
            });
        }
    }
    let st = SafeTensors::deserialize(bytes).map_err(|source| NnError::Safetensors {
        path: path.to_path_buf(),
        source,
    })?;
    let (_, meta) = SafeTensors::read_metadata(bytes).map_err(|source| NnError::Safetensors {
        path: path.to_path_buf(),
        source,
    })?;
    let mut views = st.tensors();
    views.sort_by(|a, b| a.0.cmp(&b.0));
    if let Some(stored) = meta.metadata().as_ref().and_then(|m| m.get(CRC_KEY)) {
        let stored = u32::from_str_radix(stored, 16).map_err(|_| NnError::Metadata {
            path: path.to_path_buf(),
            reason: format!("checksum {stored:?} is not hexadecimal"),
        })?;
        let computed = crc_of(views.iter().map(|(_, v)| v.data()));
        if stored != computed {
            return Err(NnError::Checksum {
                path: path.to_path_buf(),
                stored,
                computed,
            });
        }
    }
    views
        .into_iter()
        .filter(|(name, _)| keep(name))
        .map(|(name, v)| {
            let shape = v.shape().to_vec();
            let bytes = v.data();
            let data = match v.dtype() {
                Dtype::F32 => HostData::F32(decode_le(bytes, f32::from_le_bytes)),
                Dtype::F64 => HostData::F64(decode_le(bytes, f64::from_le_bytes)),
                Dtype::BF16 => HostData::BF16(
                    bytes
                        .chunks_exact(2)
                        .map(|c| bf16::from_le_bytes([c[0], c[1]]))
                        .collect(),
                ),
                Dtype::F16 => HostData::F16(
                    bytes
                        .chunks_exact(2)
                        .map(|c| f16::from_le_bytes([c[0], c[1]]))
                        .collect(),
                ),
                Dtype::I64 => HostData::I64(decode_le(bytes, i64::from_le_bytes)),
                Dtype::I32 => HostData::I32(decode_le(bytes, i32::from_le_bytes)),
                Dtype::U8 => HostData::U8(bytes.to_vec()),
                Dtype::BOOL => HostData::Bool(bytes.iter().map(|&b| Bool::new(b != 0)).collect()),
                other => {
                    return Err(NnError::UnsupportedDType {
                        path: path.to_path_buf(),
                        name,
                        dtype: other.to_string(),
                    })
                }
            };
            Ok((name, HostTensor::from_data(data, &shape)?))
        })
        .collect()
}

/// Elements per thread below which a tensor is decoded on one thread.
const DECODE_PER_THREAD: usize = 1 << 18;

/// The little-endian values of `N` bytes each in `bytes`, in a fresh buffer. Most of the time
/// is the kernel's zeroing of the fresh pages as they are first written, so a large tensor is
/// filled by the engine's threads ([`arenagrad_graph::default_threads`]) in parallel parts,
/// its buffer allocated zeroed (untouched pages, faulted in by the thread that fills them).
fn decode_le<T: Copy + Default + Send, const N: usize>(
    bytes: &[u8],
    f: impl Fn([u8; N]) -> T + Copy + Send + Sync,
) -> Vec<T> {
    let fill = |out: &mut [T], src: &[u8]| {
        for (o, c) in out.iter_mut().zip(src.chunks_exact(N)) {
            *o = f(c.try_into().expect("invariant: chunks of N bytes"));
        }
    };
    let n = bytes.len() / N;
    let threads = arenagrad_graph::default_threads().min(n / DECODE_PER_THREAD);
    if threads <= 1 {
        return bytes
            .chunks_exact(N)
            .map(|c| f(c.try_into().expect("invariant: chunks of N bytes")))
            .collect();
    }
    let mut v = vec![T::default(); n];
    let per = n.div_ceil(threads);
    std::thread::scope(|s| {
        for (out, src) in v.chunks_mut(per).zip(bytes.chunks(per * N)) {
            s.spawn(move || fill(out, src));
        }
    });
    v
}

/// The module's parameters and buffers by hierarchical name (what [`save`] writes).
pub fn state_dict<M: Module + ?Sized>(module: &M) -> Vec<(String, HostTensor)> {
    module
        .named_state()
        .into_iter()
        .map(|(n, p, _)| (n, p.value()))
        .collect()
}

/// Saves the module's parameters and buffers to `path`, atomically.
pub fn save<M: Module + ?Sized>(module: &M, path: impl AsRef<Path>) -> Result<()> {
    save_with_writer(module, path, |f| f)
}

/// [`save`] through a writer wrapping the temporary file (to count bytes, throttle, or test what
/// a failure midway does). The checkpoint replaces `path` only if every write succeeds.
pub fn save_with_writer<M: Module + ?Sized, W: Write>(
    module: &M,
    path: impl AsRef<Path>,
    wrap: impl FnOnce(File) -> W,
) -> Result<()> {
    let state = state_dict(module);
    let bytes = tensors_to_bytes(state.iter().map(|(n, t)| (n.as_str(), t)))?;
    write_atomic(path.as_ref(), &bytes, wrap)
}

/// Saves named tensors (not necessarily a module's) to `path`, atomically.
pub fn save_tensors<'a>(
    tensors: impl IntoIterator<Item = (&'a str, &'a HostTensor)>,
    path: impl AsRef<Path>,
) -> Result<()> {
    let bytes = tensors_to_bytes(tensors)?;
    write_atomic(path.as_ref(), &bytes, |f| f)
}

/// Reads every tensor of a checkpoint, sorted by name. The file is read through a memory map,
/// so each tensor is copied once, from the page cache into its own buffer.
pub fn load_tensors(path: impl AsRef<Path>) -> Result<Vec<(String, HostTensor)>> {
    load_tensors_where(path.as_ref(), &|_| true)
}

fn load_tensors_where(
    path: &Path,
    keep: &dyn Fn(&str) -> bool,
) -> Result<Vec<(String, HostTensor)>> {
    let bytes = arenagrad_alloc::MappedFile::open(path).map_err(io(path))?;
    tensors_from_bytes_where(&bytes, path, keep)
}

/// The index of a sharded checkpoint, as `transformers` writes it beside the shards.
pub const SHARD_INDEX: &str = "model.safetensors.index.json";
/// A whole checkpoint in one file, as `transformers` names it.
pub const SINGLE_FILE: &str = "model.safetensors";

/// Reads every tensor of a checkpoint however it is stored, sorted by name: a safetensors
/// file; a sharded checkpoint's index (`model.safetensors.index.json`, whose `weight_map`
/// names the shard, beside it, that holds each tensor); or a directory holding either (the
/// index first), as `save_pretrained` writes them. Every tensor the index maps must be in its
/// shard, and no name may come from two shards; a shard's tensors the index does not map are
/// left out, as `transformers` leaves them.
pub fn read_tensors(path: impl AsRef<Path>) -> Result<Vec<(String, HostTensor)>> {
    read_tensors_where(path.as_ref(), &|_| true)
}

/// [`read_tensors`] for the names `keep` accepts (the others not decoded).
fn read_tensors_where(
    path: &Path,
    keep: &dyn Fn(&str) -> bool,
) -> Result<Vec<(String, HostTensor)>> {
    let file = if path.is_dir() {
        let index = path.join(SHARD_INDEX);
        if index.exists() {
            index
        } else {
            path.join(SINGLE_FILE)
        }
    } else {
        path.to_path_buf()
    };
    if file.extension().is_some_and(|e| e == "json") {
        read_sharded(&file, keep)
    } else {
        load_tensors_where(&file, keep)
    }
}

/// The tensors a shard index maps (those `keep` accepts), read shard by shard.
fn read_sharded(index: &Path, keep: &dyn Fn(&str) -> bool) -> Result<Vec<(String, HostTensor)>> {
    let bad = |reason: String| NnError::Metadata {
        path: index.to_path_buf(),
        reason,
    };
    let text = std::fs::read_to_string(index).map_err(io(index))?;
    let json: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| bad(format!("not JSON: {e}")))?;
    let map = json
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| bad("no \"weight_map\" object".into()))?;
    // Shard → the names it must provide.
    let mut shards: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, shard) in map {
        let shard = shard
            .as_str()
            .ok_or_else(|| bad(format!("the shard of {name:?} is not a file name")))?;
        // A shard lies beside the index: a name that climbs out of the directory is refused.
        let plain = Path::new(shard)
            .components()
            .all(|c| matches!(c, std::path::Component::Normal(_)));
        if !plain {
            return Err(bad(format!(
                "shard {shard:?} is not a file beside the index"
            )));
        }
        let names = shards.entry(shard.to_string()).or_default();
        if keep(name) {
            names.push(name.clone());
        }
    }
    let dir = index.parent().unwrap_or(Path::new("."));
    let mut out: BTreeMap<String, HostTensor> = BTreeMap::new();
    for (shard, names) in shards {
        let shard_path = dir.join(&shard);
        let mut held: HashMap<String, HostTensor> =
            load_tensors_where(&shard_path, keep)?.into_iter().collect();
        for name in names {
            let t = held.remove(&name).ok_or_else(|| NnError::Metadata {
                path: shard_path.clone(),
                reason: format!("the index maps {name:?} to this shard, which lacks it"),
            })?;
            out.insert(name, t);
        }
    }
    Ok(out.into_iter().collect())
}

/// Renames checkpoint keys on their way into a module (or out of one): rules applied in the
/// order they were added, each to the name the ones before it left. A name a [`KeyMap::drop`]
/// pattern matches is left out.
///
/// ```
/// use arenagrad_nn::checkpoint::KeyMap;
/// let map = KeyMap::new()
///     .drop("*.attn.masked_bias")
///     .strip_prefix("transformer.")
///     .rename("ln_", "norm");
/// assert_eq!(map.apply("transformer.h.0.ln_1.weight").as_deref(), Some("h.0.norm1.weight"));
/// assert_eq!(map.apply("h.3.attn.masked_bias"), None);
/// assert_eq!(map.apply("lm_head.weight").as_deref(), Some("lm_head.weight"));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyMap {
    rules: Vec<KeyRule>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum KeyRule {
    StripPrefix(String),
    AddPrefix(String),
    Rename(String, String),
    Drop(String),
}

impl KeyMap {
    /// No rules: every name as it is.
    pub fn new() -> Self {
        Self::default()
    }

    /// Removes `prefix` from names that start with it.
    pub fn strip_prefix(mut self, prefix: &str) -> Self {
        self.rules.push(KeyRule::StripPrefix(prefix.into()));
        self
    }

    /// Puts `prefix` in front of every name that does not start with it already.
    pub fn add_prefix(mut self, prefix: &str) -> Self {
        self.rules.push(KeyRule::AddPrefix(prefix.into()));
        self
    }

    /// Replaces every occurrence of `from` in a name with `to`.
    pub fn rename(mut self, from: &str, to: &str) -> Self {
        self.rules.push(KeyRule::Rename(from.into(), to.into()));
        self
    }

    /// Leaves out names matching `pattern`, where `*` stands for any run of characters (dots
    /// included) and everything else for itself.
    pub fn drop(mut self, pattern: &str) -> Self {
        self.rules.push(KeyRule::Drop(pattern.into()));
        self
    }

    /// The name `name` becomes, or `None` when a rule drops it.
    pub fn apply(&self, name: &str) -> Option<String> {
        let mut n = name.to_string();
        for r in &self.rules {
            match r {
                KeyRule::StripPrefix(p) => {
                    if let Some(rest) = n.strip_prefix(p.as_str()) {
                        n = rest.to_string();
                    }
                }
                KeyRule::AddPrefix(p) => {
                    if !n.starts_with(p.as_str()) {
                        n = format!("{p}{n}");
                    }
                }
                KeyRule::Rename(from, to) => {
                    if !from.is_empty() {
                        n = n.replace(from.as_str(), to);
                    }
                }
                KeyRule::Drop(p) => {
                    if glob_matches(p, &n) {
                        return None;
                    }
                }
            }
        }
        Some(n)
    }

    /// The checkpoint at `path` ([`read_tensors`]: a file, a shard index or a directory) with
    /// its names mapped; a dropped name's tensor is not even decoded, so one of a dtype the
    /// engine does not hold (torchvision's int64 `num_batches_tracked`, say) is no error.
    pub fn read(&self, path: impl AsRef<Path>) -> Result<Vec<(String, HostTensor)>> {
        let path = path.as_ref();
        let tensors = read_tensors_where(path, &|name| self.apply(name).is_some())?;
        self.remap(tensors, path)
    }

    /// `tensors` renamed (the dropped ones left out). Two names that become one are a
    /// [`NnError::Metadata`] error naming both, labelled with `path`.
    pub fn remap(
        &self,
        tensors: Vec<(String, HostTensor)>,
        path: &Path,
    ) -> Result<Vec<(String, HostTensor)>> {
        let mut out: BTreeMap<String, (String, HostTensor)> = BTreeMap::new();
        for (name, t) in tensors {
            let Some(to) = self.apply(&name) else {
                continue;
            };
            if let Some((first, _)) = out.get(&to) {
                return Err(NnError::Metadata {
                    path: path.to_path_buf(),
                    reason: format!("{first:?} and {name:?} both become {to:?}"),
                });
            }
            out.insert(to, (name, t));
        }
        Ok(out.into_iter().map(|(to, (_, t))| (to, t)).collect())
    }
}

/// Whether `name` matches `pattern` (`*`: any run of characters), by the greedy two-pointer
/// scan with one backtrack point (no recursion, linear in practice).
fn glob_matches(pattern: &str, name: &str) -> bool {
    let (p, n) = (pattern.as_bytes(), name.as_bytes());
    let (mut i, mut j) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while j < n.len() {
        if i < p.len() && p[i] == b'*' {
            star = Some((i, j));
            i += 1;
        } else if i < p.len() && p[i] == n[j] {
            i += 1;
            j += 1;
        } else if let Some((si, sj)) = star {
            i = si + 1;
            j = sj + 1;
            star = Some((si, sj + 1));
        } else {
            return false;
        }
    }
    p[i..].iter().all(|&c| c == b'*')
}

/// Where a training run is, besides its model and optimiser: what [`save_training`] keeps so
/// that a resumed run continues exactly — the step (or epoch) count a learning-rate schedule
/// reads, and the generator that orders the data — and what it has recorded so far, so that a
/// resumed run reports on the whole run (a loss curve that goes on from the step it stopped at).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Progress {
    /// Steps (or epochs) done; what `LrSchedule::lr_at` is given next.
    pub step: u64,
    /// The data order's generator, as it is now.
    pub rng: Option<Rng>,
    /// Series of numbers by name (a loss per step, an accuracy per epoch), kept as `f64`
    /// tensors `progress/history/<name>`.
    pub history: BTreeMap<String, Vec<f64>>,
    /// A loss scaler's state, when the run scales its loss (f16 training).
    pub scaler: Option<crate::optim::GradScalerState>,
    /// A [`ReduceLrOnPlateau`](crate::optim::ReduceLrOnPlateau)'s state, when the run has one
    /// (`progress/plateau`: the best metric, then the three counters).
    pub plateau: Option<crate::optim::PlateauState>,
}

const MODEL: &str = "model/";
const OPTIMIZER: &str = "optimizer/";
const STEP: &str = "progress/step";
const RNG: &str = "progress/rng";
const HISTORY: &str = "progress/history/";
const SCALE: &str = "progress/scaler/scale";
const GROWTH: &str = "progress/scaler/growth_tracker";
const PLATEAU_BEST: &str = "progress/plateau/best";
const PLATEAU_COUNTS: &str = "progress/plateau/counters";

/// Saves everything a run needs to resume exactly, in one safetensors file written atomically:
/// the module's parameters and buffers (`model/…`), the optimiser's state (`optimizer/…`, see
/// `Optimizer::state_tensors`) and the [`Progress`]. Training N steps, saving, loading into
/// fresh objects and training N more gives the weights of 2N steps bit for bit.
pub fn save_training<M: Module + ?Sized, O: Optimizer + ?Sized>(
    path: impl AsRef<Path>,
    module: &M,
    optimizer: &O,
    progress: &Progress,
) -> Result<()> {
    let mut all: Vec<(String, HostTensor)> = state_dict(module)
        .into_iter()
        .map(|(n, t)| (format!("{MODEL}{n}"), t))
        .collect();
    all.extend(
        optimizer
            .state_tensors()?
            .into_iter()
            .map(|(n, t)| (format!("{OPTIMIZER}{n}"), t)),
    );
    all.push((STEP.to_string(), crate::optim::u64_tensor(progress.step)));
    if let Some(rng) = &progress.rng {
        all.push((RNG.to_string(), crate::optim::u64s_tensor(&rng.state())));
    }
    for (name, series) in &progress.history {
        let t = HostTensor::new(series.clone(), &[series.len()])?;
        all.push((format!("{HISTORY}{name}"), t));
    }
    if let Some(s) = &progress.scaler {
        all.push((SCALE.to_string(), HostTensor::new(vec![s.scale], &[1])?));
        all.push((
            GROWTH.to_string(),
            crate::optim::u64_tensor(s.growth_tracker),
        ));
    }
    if let Some(p) = &progress.plateau {
        all.push((
            PLATEAU_BEST.to_string(),
            HostTensor::new(vec![p.best], &[1])?,
        ));
        all.push((
            PLATEAU_COUNTS.to_string(),
            crate::optim::u64s_tensor(&[p.num_bad_epochs, p.cooldown_counter, p.last_epoch]),
        ));
    }
    save_tensors(all.iter().map(|(n, t)| (n.as_str(), t)), path)
}

/// Loads what [`save_training`] wrote into `module` and `optimizer` (which must match the saved
/// ones: the same names and shapes, the same optimiser kind over the same parameters) and
/// returns the [`Progress`]. Everything is checked before anything is kept: on an error the
/// module and the optimiser are as they were.
pub fn load_training<M: Module + ?Sized, O: Optimizer + ?Sized>(
    path: impl AsRef<Path>,
    module: &M,
    optimizer: &mut O,
) -> Result<Progress> {
    let path = path.as_ref();
    let bad = |reason: String| NnError::Metadata {
        path: path.to_path_buf(),
        reason,
    };
    let (mut model, mut opt, mut step, mut rng) = (Vec::new(), Vec::new(), None, None);
    let (mut scale, mut growth) = (None, None);
    let (mut plateau_best, mut plateau_counts) = (None, None);
    let mut history = BTreeMap::new();
    for (name, t) in load_tensors(path)? {
        if let Some(n) = name.strip_prefix(MODEL) {
            model.push((n.to_string(), t));
        } else if let Some(n) = name.strip_prefix(OPTIMIZER) {
            opt.push((n.to_string(), t));
        } else if let Some(n) = name.strip_prefix(HISTORY) {
            if t.shape().len() != 1 {
                return Err(bad(format!(
                    "`{name}` is not a series (shape {:?})",
                    t.shape()
                )));
            }
            history.insert(n.to_string(), t.to_f64_vec());
        } else if name == SCALE {
            match t.as_slice::<f32>() {
                Some(&[s]) if s.is_finite() && s > 0.0 => scale = Some(s),
                _ => return Err(bad(format!("`{SCALE}` is not one positive f32"))),
            }
        } else if name == GROWTH {
            growth = Some(crate::optim::tensor_u64("load_training", GROWTH, &t)?);
        } else if name == PLATEAU_BEST {
            match t.as_slice::<f64>() {
                Some(&[b]) if !b.is_nan() => plateau_best = Some(b),
                _ => return Err(bad(format!("`{PLATEAU_BEST}` is not one f64"))),
            }
        } else if name == PLATEAU_COUNTS {
            plateau_counts = Some(
                crate::optim::tensor_u64s(&t, 3)
                    .ok_or_else(|| bad(format!("`{PLATEAU_COUNTS}` is not three counters")))?,
            );
        } else if name == STEP {
            step = Some(crate::optim::tensor_u64("load_training", STEP, &t)?);
        } else if name == RNG {
            let words = crate::optim::tensor_u64s(&t, 4)
                .ok_or_else(|| bad(format!("`{RNG}` is not a generator's state")))?;
            let state = Rng::from_state([words[0], words[1], words[2], words[3]])
                .ok_or_else(|| bad(format!("`{RNG}` is the all-zero state")))?;
            rng = Some(state);
        } else {
            return Err(bad(format!(
                "`{name}` is not part of a training checkpoint"
            )));
        }
    }
    let step = step.ok_or_else(|| bad(format!("no `{STEP}`: not a training checkpoint")))?;
    let scaler = match (scale, growth) {
        (Some(scale), Some(growth_tracker)) => Some(crate::optim::GradScalerState {
            scale,
            growth_tracker,
        }),
        (None, None) => None,
        _ => return Err(bad(format!("`{SCALE}` and `{GROWTH}` come together"))),
    };
    let plateau = match (plateau_best, plateau_counts) {
        (Some(best), Some(c)) => Some(crate::optim::PlateauState {
            best,
            num_bad_epochs: c[0],
            cooldown_counter: c[1],
            last_epoch: c[2],
        }),
        (None, None) => None,
        _ => {
            return Err(bad(format!(
                "`{PLATEAU_BEST}` and `{PLATEAU_COUNTS}` come together"
            )))
        }
    };
    // The optimiser checks its state before taking it; the module after. Should the module then
    // refuse, the optimiser gets its own state back.
    let before = optimizer.state_tensors()?;
    optimizer.load_state_tensors(&opt)?;
    if let Err(e) = load_state_dict(module, model, true, path) {
        optimizer.load_state_tensors(&before)?;
        return Err(e);
    }
    Ok(Progress {
        step,
        rng,
        history,
        scaler,
        plateau,
    })
}

/// What a non-strict load skipped.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LoadReport {
    /// Names the module has and the file lacks (left as they were).
    pub missing: Vec<String>,
    /// Names the file has and the module lacks (ignored).
    pub unexpected: Vec<String>,
}

/// Loads a checkpoint into the module: every parameter and buffer must be in the file with its
/// shape, and the file must hold nothing else. On any mismatch nothing is changed and the error
/// lists every problem.
pub fn load<M: Module + ?Sized>(module: &M, path: impl AsRef<Path>) -> Result<()> {
    load_with(module, path, true).map(|_| ())
}

/// Loads a checkpoint; with `strict == false`, missing and unexpected names are reported
/// instead of refused (shape mismatches are always errors). Nothing is changed on error.
pub fn load_with<M: Module + ?Sized>(
    module: &M,
    path: impl AsRef<Path>,
    strict: bool,
) -> Result<LoadReport> {
    let path = path.as_ref();
    let tensors = load_tensors(path)?;
    load_state_dict(module, tensors, strict, path)
}

/// Loads named tensors into the module (the in-memory half of [`load_with`]); `path` only labels
/// errors.
pub fn load_state_dict<M: Module + ?Sized>(
    module: &M,
    tensors: Vec<(String, HostTensor)>,
    strict: bool,
    path: &Path,
) -> Result<LoadReport> {
    let mut file: BTreeMap<String, HostTensor> = tensors.into_iter().collect();
    let state = module.named_state();
    let mut mismatch = StateMismatch::default();
    let mut plan = Vec::new();
    for (name, p, _) in &state {
        match file.get(name) {
            None => mismatch.missing.push(name.clone()),
            Some(t) if t.shape() != p.shape() => mismatch.shapes.push(ShapeConflict {
                name: name.clone(),
                expected: p.shape(),
                found: t.shape().to_vec(),
            }),
            Some(_) => plan.push((name.clone(), p.clone())),
        }
    }
    let known: std::collections::HashSet<&str> = state.iter().map(|(n, _, _)| n.as_str()).collect();
    mismatch.unexpected = file
        .keys()
        .filter(|n| !known.contains(n.as_str()))
        .cloned()
        .collect();
    let fatal = !mismatch.shapes.is_empty()
        || (strict && (!mismatch.missing.is_empty() || !mismatch.unexpected.is_empty()));
    if fatal {
        return Err(NnError::StateMismatch {
            path: path.to_path_buf(),
            mismatch,
        });
    }
    // Convert first, so that nothing is assigned unless everything can be. A name planned once
    // takes its tensor out of the file's map (no copy when the dtype matches); one a module
    // lists twice is read twice.
    let mut uses: HashMap<&str, usize> = HashMap::new();
    for (name, _) in &plan {
        *uses.entry(name.as_str()).or_default() += 1;
    }
    let mut values = Vec::with_capacity(plan.len());
    for (name, p) in &plan {
        let last = uses.get_mut(name.as_str()).map(|n| {
            *n -= 1;
            *n == 0
        });
        let t = if last == Some(true) {
            file.remove(name)
        } else {
            file.get(name).cloned()
        };
        let Some(t) = t else { continue };
        // Converted to the module's dtype (a bf16 checkpoint into an f32 model, say).
        let t = if t.dtype() == p.dtype() {
            t
        } else {
            t.to_dtype(p.dtype())?
        };
        values.push((p, t));
    }
    for (p, v) in values {
        p.set_value(v)?;
    }
    Ok(LoadReport {
        missing: mismatch.missing,
        unexpected: mismatch.unexpected,
    })
}
