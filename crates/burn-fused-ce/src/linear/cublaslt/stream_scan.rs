//! The CUDA stream cubecl-cuda launches a stream slot's kernels on, read from the
//! server's `Debug` text.
//!
//! cubecl-cuda 0.11.3 has no accessor for it, and cuBLASLt must run on it so that the
//! products keep their order among cubecl's kernels with no host wait. The server's
//! `Debug` shows its stream pool as
//! `StreamPool { streams: [Some(StreamWrapper { stream: Stream { sys: 0x…, …`, slot by
//! slot (`None` for a slot not created yet). The dependencies are pinned exactly
//! (`Cargo.toml`), the stream found is checked against the CUDA context before use
//! (`device.rs`), and anything unexpected here turns cuBLASLt off for the device with
//! one warning through `log`; the CUDA suite then fails (`linear/cublaslt.rs` asks
//! every product to run through cuBLASLt). This file is the one to replace once cubecl
//! exposes the stream.

/// The `sys` handle of slot `slot` in the first stream pool of `text`, or `None` where
/// the text does not have that shape.
pub(crate) fn stream_of_slot(text: &str, slot: usize) -> Option<u64> {
    const POOL: &str = "StreamPool { streams: [";
    let start = text.find(POOL)? + POOL.len();
    let entry = top_level_entries(&text[start..]).nth(slot)?;
    let entry = entry.trim();
    if !entry.starts_with("Some(") {
        return None;
    }
    const SYS: &str = "sys: 0x";
    let hex_start = entry.find(SYS)? + SYS.len();
    let hex: String = entry[hex_start..]
        .chars()
        .take_while(char::is_ascii_hexdigit)
        .collect();
    u64::from_str_radix(&hex, 16)
        .ok()
        .filter(|&handle| handle != 0)
}

/// How many regular slots the first stream pool of `text` has: its entries but the one
/// special stream after them (`MultiStream` makes its pool with one).
pub(crate) fn regular_slots(text: &str) -> Option<usize> {
    const POOL: &str = "StreamPool { streams: [";
    let start = text.find(POOL)? + POOL.len();
    top_level_entries(&text[start..])
        .count()
        .checked_sub(1)
        .filter(|&slots| slots > 0)
}

/// The comma-separated entries of the list whose opening bracket precedes `text`, up to
/// its closing bracket (brackets and quoted strings nested inside are skipped over).
fn top_level_entries(text: &str) -> impl Iterator<Item = &str> {
    let mut entries = Vec::new();
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    let mut entry_start = 0;
    for (at, c) in text.char_indices() {
        if in_string {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => in_string = true,
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' if depth == 0 => {
                entries.push(&text[entry_start..at]);
                break;
            }
            ')' | ']' | '}' => depth -= 1,
            ',' if depth == 0 => {
                entries.push(&text[entry_start..at]);
                entry_start = at + 1;
            }
            _ => {}
        }
    }
    entries.into_iter()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SERVER: &str = "CudaServer { ctx: CudaContext { context: 0x55d0, comm_stream: 0x0, \
        modules: {}, name: \"a, ] \\\" (\" }, device_id: DeviceId { type_id: 0, index_id: 0 }, \
        streams: MultiStream { streams: StreamPool { streams: [\
        Some(StreamWrapper { stream: Stream { sys: 0x7f3a10, memory_management_gpu: \
        MemoryManagement { pools: [Pool { pages: {1: [2, 3]} }] } }, cursor: 4, \
        last_synced: {} }), None, \
        Some(StreamWrapper { stream: Stream { sys: 0xbeef01, memory: (1, 2) }, cursor: 0, \
        last_synced: {0: 1} }), None], factory: Factory, max_streams: 3 } } }";

    #[test]
    fn each_slot_gives_its_own_stream() {
        assert_eq!(stream_of_slot(SERVER, 0), Some(0x7f3a10));
        assert_eq!(stream_of_slot(SERVER, 2), Some(0xbeef01));
    }

    #[test]
    fn slots_not_created_or_past_the_pool_give_nothing() {
        assert_eq!(stream_of_slot(SERVER, 1), None);
        assert_eq!(stream_of_slot(SERVER, 3), None);
        assert_eq!(stream_of_slot(SERVER, 4), None);
        assert_eq!(stream_of_slot("CudaServer { streams: [] }", 0), None);
    }

    #[test]
    fn the_special_stream_is_not_a_regular_slot() {
        assert_eq!(regular_slots(SERVER), Some(3));
        assert_eq!(regular_slots("StreamPool { streams: [None] }"), None);
    }

    /// cubecl-server's own stream pool (the version cubecl-cuda runs on), with a stand-in
    /// for cubecl-cuda's `Stream` (`sys` first, as there): the text holds each created
    /// slot's stream where `stream_of_slot` looks, and the special stream past them.
    #[test]
    fn cubecl_servers_pool_reads_as_expected() {
        use core::sync::atomic::{AtomicUsize, Ordering};
        use cubecl_environment::stream::StreamId;
        use cubecl_server::logging::ServerLogger;
        use cubecl_server::memory_management::{ErrorGraph, FailureId};
        use cubecl_server::server::{BufferBinding, ServerError};
        use cubecl_server::stream::{EventStreamBackend, MultiStream, StreamMemory};
        use std::sync::Arc;

        static CREATED: AtomicUsize = AtomicUsize::new(0);

        #[derive(Debug)]
        #[allow(dead_code)]
        struct Stream {
            sys: *mut u8,
            memory_management_gpu: Vec<(u32, String)>,
        }

        impl StreamMemory for Stream {
            fn failure(&self, _binding: &BufferBinding) -> Option<FailureId> {
                None
            }
            fn taint(&mut self, _: &BufferBinding, _: FailureId, _: &mut ErrorGraph) {}
            fn written(&mut self, _: &BufferBinding, _: &mut ErrorGraph) {}
        }

        #[derive(Debug)]
        struct Backend;

        impl EventStreamBackend for Backend {
            type Stream = Stream;
            type Event = ();

            fn create_stream(&self) -> Result<Stream, ServerError> {
                let n = CREATED.fetch_add(1, Ordering::Relaxed) + 1;
                Ok(Stream {
                    sys: (0x7f00_0000 + n * 0x100) as *mut u8,
                    memory_management_gpu: vec![(1, "pages [a, b]) {".into())],
                })
            }
            fn handle_cursor(_: &Stream, _: &BufferBinding) -> u64 {
                0
            }
            fn flush(_: &mut Stream, _: &mut ErrorGraph) {}
            fn wait_event(_: &mut Stream, _: ()) -> Result<(), ServerError> {
                Ok(())
            }
            fn wait_event_sync(_: ()) -> Result<(), ServerError> {
                Ok(())
            }
        }

        let mut pool = MultiStream::new(Arc::new(ServerLogger::default()), Backend, 4);
        // Stream 6 lands in slot 2, then stream 1 in slot 1.
        for value in [6, 1] {
            assert!(pool.resolve(StreamId { value }, [].into_iter()).is_ok());
        }
        let text = format!("{pool:?}");
        assert_eq!(regular_slots(&text), Some(4), "{text}");
        assert_eq!(stream_of_slot(&text, 2), Some(0x7f00_0100), "{text}");
        assert_eq!(stream_of_slot(&text, 1), Some(0x7f00_0200), "{text}");
        assert_eq!(stream_of_slot(&text, 0), None, "{text}");
        assert_eq!(stream_of_slot(&text, 3), None, "{text}");
    }

    #[test]
    fn a_null_stream_is_refused() {
        let text = "StreamPool { streams: [Some(StreamWrapper { stream: Stream { sys: 0x0 } })] }";
        assert_eq!(stream_of_slot(text, 0), None);
    }
}
