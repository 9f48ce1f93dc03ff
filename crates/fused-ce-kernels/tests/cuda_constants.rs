//! cubecl 0.10 prints a float constant that is infinite or NaN into CUDA C as `inf`,
//! `-inf` or `NaN`, identifiers NVRTC does not know: the kernel then fails to compile on
//! CUDA only (SPIR-V takes them, so the suite passes on lavapipe). Kernels start running
//! maxima at `RUNNING_MAX_START` and make NaN at run time (`runtime_nan`); this test keeps
//! the constants out of the kernels' source.

use std::path::Path;

const NON_FINITE: [&str; 3] = ["::INFINITY", "::NEG_INFINITY", "::NAN"];

#[test]
fn kernels_write_no_infinite_or_nan_constants() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut found = Vec::new();
    let mut files = 0;
    let mut folders = vec![src.clone()];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).expect("a folder of the crate's src") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                folders.push(path);
                continue;
            }
            if path.extension().is_none_or(|ext| ext != "rs") {
                continue;
            }
            files += 1;
            let text = std::fs::read_to_string(&path).expect("a source file");
            for (number, line) in text.lines().enumerate() {
                let code = line.split("//").next().unwrap_or("");
                if NON_FINITE.iter().any(|constant| code.contains(constant)) {
                    found.push(format!(
                        "{}:{}: {}",
                        path.display(),
                        number + 1,
                        line.trim()
                    ));
                }
            }
        }
    }
    assert!(
        files > 5,
        "read {files} source files from {}",
        src.display()
    );
    assert!(
        found.is_empty(),
        "non-finite float constants in kernel code (NVRTC cannot compile them):\n{}",
        found.join("\n")
    );
}
