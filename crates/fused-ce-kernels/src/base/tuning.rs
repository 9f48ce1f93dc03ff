//! How the kernels are cut and launched: a typed value with per-device defaults. It
//! changes speed, never results. Benches and tuning sweeps set it; users normally leave
//! the device's default.

use core::fmt;
use core::str::FromStr;

use cubecl::prelude::*;

/// Most chunks per row: the exchange gathers `MAX_CHUNKS * PARTIAL_SLOTS` values in
/// shared memory.
pub const MAX_CHUNKS: usize = 64;

/// The evict-first cache hints of the one-pass kernel (inline PTX, so CUDA through its
/// C++ backend only; see `ptx::load_vector`). Data read or written once no longer evicts
/// from L2 the part of a chunk that the gradient pass reads again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum CacheHints {
    /// Plain loads and stores.
    #[default]
    Off,
    /// The logits that are not read again, as `ld.global.cs`.
    Loads,
    /// The gradient's stores, as `st.global.cs`.
    Stores,
    /// Both.
    LoadsAndStores,
}

impl CacheHints {
    /// The one-pass kernel's comptime bits: 1 for loads, 2 for stores.
    pub(crate) fn bits(self) -> u32 {
        match self {
            CacheHints::Off => 0,
            CacheHints::Loads => 1,
            CacheHints::Stores => 2,
            CacheHints::LoadsAndStores => 3,
        }
    }
}

/// Launch shapes of the row kernels and of the one-pass kernel. Every field has a
/// per-device default ([`KernelTuning::for_device`]); any value that passes
/// [`KernelTuning::validate`] gives the same results.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KernelTuning {
    /// Most units of a row kernel's cube (a power of two, 32 to 1024).
    pub row_units: usize,
    /// Vectors each unit of the row kernels loads before using any (1 to 8).
    pub row_loads: usize,
    /// Most bytes of a row one cube of the one-pass kernel takes (1 KiB to 1 MiB), on a
    /// device that runs all of a row's cubes at once (one that reports its SM count);
    /// elsewhere a row is one chunk.
    pub chunk_bytes: usize,
    /// Most bytes of its chunk a one-pass cube stages in shared memory (0 to 192 KiB);
    /// the rest is read again from L2 by the gradient pass.
    pub stage_bytes: usize,
    /// Most units of a one-pass cube (a power of two, 32 to 1024).
    pub one_pass_units: usize,
    /// Vectors each unit of the one-pass reduction loads before using any (1 to 8).
    pub one_pass_loads: usize,
    /// Vectors each unit of the one-pass re-reading loop loads before storing any (1, 2
    /// or 4); `None`: 2 for 16-bit logits on a device that reports its SM count, else 4.
    pub reread_loads: Option<usize>,
    /// Keep the staged vectors as exponentials, so their gradient is a multiply (never
    /// with softcap, whose derivative needs the logits).
    pub staged_exps: bool,
    /// Narrower vectors for the one-pass kernel than the widest that fits (a power of
    /// two dividing it); `None`: the widest.
    pub one_pass_vector: Option<usize>,
    /// The one-pass kernel's cache hints (CUDA through its C++ backend only; ignored
    /// elsewhere, the LLVM backend included).
    pub cache_hints: CacheHints,
    /// Cut every row into this many chunks, whatever the plan (1 to 64). For tests of the
    /// exchange between the cubes of a row: the device must run that many cubes at once.
    pub chunks: Option<usize>,
}

impl KernelTuning {
    /// The defaults for a device that reports its SM count (CUDA) or not (`known_device`),
    /// on the CUDA runtime or another (`on_cuda`). Chosen by measurement on an H200:
    /// docs/history.md gives the decisions, lab/sweeps/ the settings swept.
    pub fn defaults(known_device: bool, on_cuda: bool) -> Self {
        KernelTuning {
            row_units: 256,
            row_loads: 8,
            chunk_bytes: 64 * 1024,
            stage_bytes: if known_device { 32 * 1024 } else { 16 * 1024 },
            one_pass_units: 256,
            one_pass_loads: if known_device { 4 } else { 2 },
            reread_loads: None,
            staged_exps: true,
            one_pass_vector: None,
            cache_hints: if on_cuda {
                CacheHints::LoadsAndStores
            } else {
                CacheHints::Off
            },
            chunks: None,
        }
    }

    /// The defaults for the device behind `client`.
    pub fn for_device(client: &Client) -> Self {
        let known_device = client
            .properties()
            .hardware
            .num_streaming_multiprocessors
            .is_some();
        Self::defaults(known_device, client.name() == "cuda")
    }

    /// Checks every field's range; the error names the first field out of it.
    pub fn validate(&self) -> Result<(), TuningError> {
        let units = |v: usize| v.is_power_of_two() && (32..=1024).contains(&v);
        let checks = [
            (
                "row_units",
                units(self.row_units),
                "a power of two in [32, 1024]",
            ),
            ("row_loads", (1..=8).contains(&self.row_loads), "1 to 8"),
            (
                "chunk_bytes",
                (1024..=1024 * 1024).contains(&self.chunk_bytes),
                "1 KiB to 1 MiB",
            ),
            (
                "stage_bytes",
                self.stage_bytes <= 192 * 1024,
                "at most 192 KiB",
            ),
            (
                "one_pass_units",
                units(self.one_pass_units),
                "a power of two in [32, 1024]",
            ),
            (
                "one_pass_loads",
                (1..=8).contains(&self.one_pass_loads),
                "1 to 8",
            ),
            (
                "reread_loads",
                self.reread_loads.is_none_or(|v| [1, 2, 4].contains(&v)),
                "1, 2 or 4",
            ),
            (
                "one_pass_vector",
                self.one_pass_vector.is_none_or(|v| v.is_power_of_two()),
                "a power of two",
            ),
            (
                "chunks",
                self.chunks.is_none_or(|c| (1..=MAX_CHUNKS).contains(&c)),
                "1 to 64",
            ),
        ];
        match checks.into_iter().find(|(_, ok, _)| !ok) {
            Some((field, _, expected)) => Err(TuningError {
                setting: field.to_string(),
                expected,
            }),
            None => Ok(()),
        }
    }

    /// This tuning with `settings` applied: space-separated `field=value` pairs, e.g.
    /// `chunk_bytes=49152 stage_bytes=40960 cache_hints=loads`. Booleans are `0`/`1`,
    /// `one_pass_vector` and `chunks` take `none`, `cache_hints` takes `off`, `loads`,
    /// `stores` or `loads-and-stores`. The result is validated.
    pub fn with_settings(mut self, settings: &str) -> Result<Self, TuningError> {
        for setting in settings.split_whitespace() {
            let bad = |expected: &'static str| TuningError {
                setting: setting.to_string(),
                expected,
            };
            let (field, value) = setting
                .split_once('=')
                .ok_or_else(|| bad("`field=value`"))?;
            let number = || value.parse::<usize>().map_err(|_| bad("a whole number"));
            let optional = || match value {
                "none" => Ok(None),
                _ => number().map(Some),
            };
            match field {
                "row_units" => self.row_units = number()?,
                "row_loads" => self.row_loads = number()?,
                "chunk_bytes" => self.chunk_bytes = number()?,
                "stage_bytes" => self.stage_bytes = number()?,
                "one_pass_units" => self.one_pass_units = number()?,
                "one_pass_loads" => self.one_pass_loads = number()?,
                "reread_loads" => self.reread_loads = optional()?,
                "staged_exps" => self.staged_exps = number()? != 0,
                "one_pass_vector" => self.one_pass_vector = optional()?,
                "chunks" => self.chunks = optional()?,
                "cache_hints" => {
                    self.cache_hints = match value {
                        "off" => CacheHints::Off,
                        "loads" => CacheHints::Loads,
                        "stores" => CacheHints::Stores,
                        "loads-and-stores" => CacheHints::LoadsAndStores,
                        _ => return Err(bad("off, loads, stores or loads-and-stores")),
                    }
                }
                _ => return Err(bad("a field of KernelTuning")),
            }
        }
        self.validate()?;
        Ok(self)
    }
}

/// A tuning value out of its range, or a setting that could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TuningError {
    /// The field, or the `field=value` text, at fault.
    pub setting: String,
    /// What it should be.
    pub expected: &'static str,
}

impl fmt::Display for TuningError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "kernel tuning: `{}` should be {}",
            self.setting, self.expected
        )
    }
}

impl std::error::Error for TuningError {}

impl FromStr for KernelTuning {
    type Err = TuningError;

    /// The CUDA defaults with `settings` applied (see [`KernelTuning::with_settings`]).
    fn from_str(settings: &str) -> Result<Self, Self::Err> {
        Self::defaults(true, true).with_settings(settings)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        for known in [false, true] {
            for cuda in [false, true] {
                assert_eq!(KernelTuning::defaults(known, cuda).validate(), Ok(()));
            }
        }
    }

    #[test]
    fn settings_apply_and_validate() {
        let tuning: KernelTuning = "chunk_bytes=49152 stage_bytes=40960 cache_hints=loads chunks=3"
            .parse()
            .expect("valid settings");
        assert_eq!(tuning.chunk_bytes, 49152);
        assert_eq!(tuning.stage_bytes, 40960);
        assert_eq!(tuning.cache_hints, CacheHints::Loads);
        assert_eq!(tuning.chunks, Some(3));
        assert_eq!(tuning.row_units, 256);

        let error = "reread_loads=3".parse::<KernelTuning>().unwrap_err();
        assert_eq!(error.setting, "reread_loads");
        let error = "row_units".parse::<KernelTuning>().unwrap_err();
        assert_eq!(error.setting, "row_units");
        assert!("colour=blue".parse::<KernelTuning>().is_err());
        assert!("row_units=100".parse::<KernelTuning>().is_err());
        assert!("chunks=65".parse::<KernelTuning>().is_err());
        assert!("staged_exps=yes".parse::<KernelTuning>().is_err());
    }
}
