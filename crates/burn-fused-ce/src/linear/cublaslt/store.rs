//! The cuBLASLt algorithms chosen by measurement (`measure.rs`), kept on disk across
//! processes where this crate's `persistence` feature is on (the suite package's `cuda`
//! feature turns it on with Burn's, whose autotune keeps its results the same way).
//!
//! One small text file beside the database cubecl's autotune keeps its results in: the
//! active cubecl environment's `<root>/<name>.db` (by default `target/environment/` of
//! the outermost workspace the process runs from, else the user's cache directory
//! `cubecl/`; cubecl's `[environment]` config chooses another) gives
//! `<root>/<name>.fused-ce-cublaslt`. Nothing is read or written where cubecl's
//! `autotune.disable_cache` is set. A header line, then one line per choice, its fields
//! apart by tabs (`|` here):
//!
//! ```text
//! burn-fused-ce cuBLASLt algorithms, format 1
//! NVIDIA H200 | 9.0 | 132 | 130100 | 0,128256,4096,128256,... | 3f,...,0 | 33554432
//! ```
//!
//! keyed by the device's name, compute capability and SM count, cuBLASLt's version and
//! the product (its shapes, transposes, leading dimensions, types, alignments, whether it
//! sums into its output); the algorithm is `cublasLtMatmulAlgo_t`'s
//! opaque 8 words, with the workspace it said it uses. A stored algorithm is checked
//! with `cublasLtMatmulAlgoCheck` before it is used, and measured again where the check
//! fails.
//!
//! The file is read once per process and rewritten whole after each new choice: to a
//! temporary file beside it, then renamed over it (no lock file; two processes writing
//! at once keep the entries of the last rename). A missing, unreadable or corrupt file,
//! or one of another format, holds nothing; a line that does not parse is skipped;
//! entries of other devices or cuBLASLt versions (a store copied from another machine)
//! are kept as they are and never match; a file that cannot be written is left as it
//! is. None of it is ever an error for the caller: the algorithm is measured again.
#![cfg_attr(not(all(feature = "cuda", feature = "persistence")), allow(dead_code))]

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The file's first line: another means another format, whose entries are not read.
const HEADER: &str = "burn-fused-ce cuBLASLt algorithms, format 1";

/// The extension of the store's file, beside the environment's `<name>.db`.
pub(crate) const EXTENSION: &str = "fused-ce-cublaslt";

/// What a stored algorithm was chosen for.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct StoreKey {
    /// The device's name, with no tab or line break.
    pub device: String,
    /// Major and minor.
    pub compute_capability: [u32; 2],
    pub multiprocessors: u32,
    /// cuBLASLt's version (`major * 10000 + minor * 100 + patch`).
    pub cublaslt_version: u64,
    /// The product's key, as words (`AlgorithmKey::store_words`).
    pub product: Vec<u64>,
}

impl StoreKey {
    pub fn new(
        device: &str,
        compute_capability: [u32; 2],
        multiprocessors: u32,
        cublaslt_version: u64,
        product: Vec<u64>,
    ) -> Self {
        let device = device
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect::<String>()
            .trim()
            .to_string();
        Self {
            device,
            compute_capability,
            multiprocessors,
            cublaslt_version,
            product,
        }
    }
}

/// A chosen algorithm: `cublasLtMatmulAlgo_t`'s opaque words, and the workspace it uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StoredAlgorithm {
    pub algorithm: [u64; 8],
    pub workspace_bytes: u64,
}

/// The stored choices, in a stable order (the file is written the same for the same
/// entries).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct AlgorithmStore {
    entries: BTreeMap<StoreKey, StoredAlgorithm>,
}

impl AlgorithmStore {
    /// The algorithm stored for `key`.
    pub fn get(&self, key: &StoreKey) -> Option<StoredAlgorithm> {
        self.entries.get(key).copied()
    }

    /// Keeps `algorithm` for `key`; whether that changed the store.
    pub fn insert(&mut self, key: StoreKey, algorithm: StoredAlgorithm) -> bool {
        self.entries.insert(key, algorithm) != Some(algorithm)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.len()
    }

    /// The store a file's text holds: nothing where the header is not this format's;
    /// lines that do not parse are skipped (the last of a key's lines is kept).
    pub fn parse(text: &str) -> Self {
        let mut lines = text.lines();
        if lines.next().map(str::trim_end) != Some(HEADER) {
            return Self::default();
        }
        let entries = lines.filter_map(parse_line).collect();
        Self { entries }
    }

    /// The store as a file's text.
    pub fn to_text(&self) -> String {
        let mut text = format!("{HEADER}\n");
        for (key, stored) in &self.entries {
            let product: Vec<String> = key.product.iter().map(u64::to_string).collect();
            let algorithm: Vec<String> = stored
                .algorithm
                .iter()
                .map(|word| format!("{word:x}"))
                .collect();
            text += &format!(
                "{}\t{}.{}\t{}\t{}\t{}\t{}\t{}\n",
                key.device,
                key.compute_capability[0],
                key.compute_capability[1],
                key.multiprocessors,
                key.cublaslt_version,
                product.join(","),
                algorithm.join(","),
                stored.workspace_bytes
            );
        }
        text
    }

    /// The store in the file at `path`; empty where it is missing, unreadable or not
    /// this format's.
    pub fn read(path: &Path) -> Self {
        std::fs::read(path)
            .ok()
            .and_then(|bytes| String::from_utf8(bytes).ok())
            .map_or_else(Self::default, |text| Self::parse(&text))
    }

    /// Writes the store to `path` (its directory made where missing): to a temporary
    /// file beside it, renamed over it, so that a reader never sees half a file and no
    /// lock is left behind. The temporary file is removed where that fails.
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        if let Some(directory) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(directory)?;
        }
        let temporary = temporary_beside(path);
        let written = std::fs::File::create(&temporary)
            .and_then(|mut file| file.write_all(self.to_text().as_bytes()))
            .and_then(|()| std::fs::rename(&temporary, path));
        if written.is_err() {
            let _ = std::fs::remove_file(&temporary);
        }
        written
    }
}

/// A name beside `path` no other writer uses at once: the process and a count.
fn temporary_beside(path: &Path) -> PathBuf {
    use core::sync::atomic::{AtomicU64, Ordering};
    static WRITES: AtomicU64 = AtomicU64::new(0);
    let name = path
        .file_name()
        .map_or_else(|| "store".into(), |name| name.to_string_lossy());
    let count = WRITES.fetch_add(1, Ordering::Relaxed);
    path.with_file_name(format!(".{name}.{}.{count}.tmp", std::process::id()))
}

/// One entry's line, or `None` where it does not parse.
fn parse_line(line: &str) -> Option<(StoreKey, StoredAlgorithm)> {
    let fields: Vec<&str> = line.split('\t').collect();
    let [
        device,
        capability,
        multiprocessors,
        version,
        product,
        algorithm,
        workspace,
    ] = fields[..]
    else {
        return None;
    };
    let (major, minor) = capability.split_once('.')?;
    let product = product
        .split(',')
        .map(|word| word.parse::<u64>().ok())
        .collect::<Option<Vec<u64>>>()?;
    let words = algorithm
        .split(',')
        .map(|word| u64::from_str_radix(word, 16).ok())
        .collect::<Option<Vec<u64>>>()?;
    let algorithm: [u64; 8] = words.try_into().ok()?;
    let key = StoreKey {
        device: device.to_string(),
        compute_capability: [major.parse().ok()?, minor.parse().ok()?],
        multiprocessors: multiprocessors.parse().ok()?,
        cublaslt_version: version.parse().ok()?,
        product,
    };
    let stored = StoredAlgorithm {
        algorithm,
        workspace_bytes: workspace.trim_end().parse().ok()?,
    };
    Some((key, stored))
}

/// The process's store: read from disk on first use, where it is kept on disk.
#[cfg(all(feature = "cuda", feature = "persistence"))]
mod on_disk {
    use std::path::PathBuf;
    use std::sync::{LazyLock, Mutex};

    use cubecl_runtime::config::{CubeClRuntimeConfig, RuntimeConfig};

    use super::{AlgorithmStore, EXTENSION, StoreKey, StoredAlgorithm};

    /// The store's file (`None`: not kept on disk) and what it held when read, with the
    /// choices made since.
    struct Opened {
        path: Option<PathBuf>,
        store: AlgorithmStore,
    }

    static STORE: LazyLock<Mutex<Opened>> = LazyLock::new(|| {
        let path = file();
        let store = path
            .as_deref()
            .map_or_else(AlgorithmStore::default, AlgorithmStore::read);
        Mutex::new(Opened { path, store })
    });

    /// Beside the active cubecl environment's database, unless cubecl keeps no autotune
    /// results on disk. cubecl's config (read once per process, by cubecl) sets the
    /// environment's root and name when it loads; asking for it here makes sure it has.
    fn file() -> Option<PathBuf> {
        let config = CubeClRuntimeConfig::get();
        if config.autotune.disable_cache {
            return None;
        }
        Some(cubecl_environment::environment::path().with_extension(EXTENSION))
    }

    pub fn stored(key: &StoreKey) -> Option<StoredAlgorithm> {
        STORE.lock().ok()?.store.get(key)
    }

    pub fn keep(key: StoreKey, algorithm: StoredAlgorithm) {
        let Ok(mut opened) = STORE.lock() else {
            return;
        };
        if opened.store.insert(key, algorithm)
            && let Some(path) = &opened.path
        {
            // A store that cannot be written stays as it was: the choice is kept for
            // this process, and measured again by the next.
            let _ = opened.store.write(path);
        }
    }
}

/// The algorithm kept on disk for `key`, where the store is kept and holds one.
#[cfg(feature = "cuda")]
pub(crate) fn stored_algorithm(key: &StoreKey) -> Option<StoredAlgorithm> {
    #[cfg(feature = "persistence")]
    {
        on_disk::stored(key)
    }
    #[cfg(not(feature = "persistence"))]
    {
        let _ = key;
        None
    }
}

/// Keeps the algorithm chosen for `key` on disk, where the store is kept.
#[cfg(feature = "cuda")]
pub(crate) fn keep_algorithm(key: StoreKey, algorithm: StoredAlgorithm) {
    #[cfg(feature = "persistence")]
    {
        on_disk::keep(key, algorithm);
    }
    #[cfg(not(feature = "persistence"))]
    {
        let _ = (key, algorithm);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(device: &str, words: &[u64]) -> StoreKey {
        StoreKey::new(device, [9, 0], 132, 130_100, words.to_vec())
    }

    fn algorithm(seed: u64) -> StoredAlgorithm {
        StoredAlgorithm {
            algorithm: core::array::from_fn(|i| {
                seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ i as u64
            }),
            workspace_bytes: seed * 4096,
        }
    }

    fn sample() -> AlgorithmStore {
        let mut store = AlgorithmStore::default();
        assert!(store.insert(key("NVIDIA H200", &[0, 128_256, 4096, 1, 2]), algorithm(1)));
        assert!(store.insert(key("NVIDIA H200", &[1, 4096, 4096, 0, 2]), algorithm(2)));
        // Another machine's entry, with a name that needs cleaning.
        assert!(store.insert(
            key("NVIDIA\tH100 80GB\nHBM3 ", &[0, 128_256, 4096, 1, 2]),
            StoredAlgorithm {
                algorithm: [u64::MAX; 8],
                workspace_bytes: 0,
            }
        ));
        assert!(!store.insert(key("NVIDIA H200", &[1, 4096, 4096, 0, 2]), algorithm(2)));
        store
    }

    /// A scratch directory of this test's own under the system's temporary one.
    fn scratch(name: &str) -> PathBuf {
        let directory =
            std::env::temp_dir().join(format!("burn-fused-ce-store-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&directory);
        directory
    }

    #[test]
    fn a_store_reads_back_from_its_text() {
        let store = sample();
        assert_eq!(store.len(), 3);
        let text = store.to_text();
        assert!(text.starts_with(HEADER), "{text}");
        assert!(text.contains("NVIDIA H100 80GB HBM3\t"), "{text}");
        let parsed = AlgorithmStore::parse(&text);
        assert_eq!(parsed, store);
        let probe = key("NVIDIA H200", &[0, 128_256, 4096, 1, 2]);
        assert_eq!(parsed.get(&probe), Some(algorithm(1)));
        // Another device, cuBLASLt version or product finds nothing.
        let mut other = probe.clone();
        other.cublaslt_version += 1;
        assert_eq!(parsed.get(&other), None);
        let mut other = probe.clone();
        other.compute_capability = [10, 0];
        assert_eq!(parsed.get(&other), None);
        assert_eq!(
            parsed.get(&key("NVIDIA H200", &[0, 128_256, 4096, 1])),
            None
        );
    }

    #[test]
    fn a_store_written_then_read_gives_the_same_algorithms() {
        let directory = scratch("roundtrip");
        let path = directory.join("nested").join("default.fused-ce-cublaslt");
        assert_eq!(AlgorithmStore::read(&path), AlgorithmStore::default());
        let mut store = sample();
        store.write(&path).expect("writes the store");
        assert_eq!(AlgorithmStore::read(&path), store);
        // Rewritten with one more choice: the earlier ones stay, another device's too.
        assert!(store.insert(key("NVIDIA H200", &[7, 7]), algorithm(3)));
        store.write(&path).expect("rewrites the store");
        let read = AlgorithmStore::read(&path);
        assert_eq!(read, store);
        assert_eq!(read.get(&key("NVIDIA H200", &[7, 7])), Some(algorithm(3)));
        // Nothing beside it but the store: no temporary or lock file left.
        let names: Vec<String> = std::fs::read_dir(path.parent().expect("a directory"))
            .expect("lists the directory")
            .map(|entry| {
                entry
                    .expect("an entry")
                    .file_name()
                    .to_string_lossy()
                    .into()
            })
            .collect();
        assert_eq!(names, ["default.fused-ce-cublaslt"]);
        let _ = std::fs::remove_dir_all(&directory);
    }

    #[test]
    fn corrupt_or_foreign_stores_hold_nothing_and_bad_lines_are_skipped() {
        assert_eq!(AlgorithmStore::parse(""), AlgorithmStore::default());
        assert_eq!(
            AlgorithmStore::parse("burn-fused-ce cuBLASLt algorithms, format 0\n"),
            AlgorithmStore::default()
        );
        let good = sample().to_text();
        // Another format's header: nothing, whatever follows.
        let foreign = good.replacen(HEADER, "something else", 1);
        assert_eq!(AlgorithmStore::parse(&foreign), AlgorithmStore::default());
        // Lines cut short, with a field missing or a word that is not one: skipped.
        let mut lines: Vec<String> = good.lines().map(str::to_string).collect();
        let cut = lines[1][..lines[1].len() / 2].to_string();
        let bad_word = lines[2].replacen("\t9.0\t", "\t9.x\t", 1);
        let short_algorithm = {
            let mut fields: Vec<&str> = lines[3].split('\t').collect();
            let seven_words: Vec<&str> = fields[5].split(',').take(7).collect();
            let seven_words = seven_words.join(",");
            fields[5] = &seven_words;
            fields.join("\t")
        };
        lines.extend([cut, bad_word, short_algorithm, "\u{0}\u{1}garbage".into()]);
        let parsed = AlgorithmStore::parse(&lines.join("\n"));
        assert_eq!(parsed, sample());
        // Bytes that are not text: nothing.
        let directory = scratch("corrupt");
        std::fs::create_dir_all(&directory).expect("makes the directory");
        let path = directory.join("default.fused-ce-cublaslt");
        std::fs::write(&path, [0xff, 0xfe, 0x00, 0x9c]).expect("writes garbage");
        assert_eq!(AlgorithmStore::read(&path), AlgorithmStore::default());
        // And it is replaced by the next write.
        sample().write(&path).expect("writes over it");
        assert_eq!(AlgorithmStore::read(&path), sample());
        let _ = std::fs::remove_dir_all(&directory);
    }
}
