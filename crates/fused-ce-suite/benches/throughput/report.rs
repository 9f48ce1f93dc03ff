//! The bench's results as files: a CSV of every figure, the markdown table that
//! docs/performance.md embeds, and an SVG plot of each case's steady time against its
//! floor.

use std::fmt::Write as _;
use std::path::Path;

/// One row of the results.
pub struct Row {
    pub case: String,
    pub dtype: String,
    pub mode: String,
    /// One step synced alone, and its floor.
    pub single_ms: Option<f64>,
    pub single_floor_ms: f64,
    /// Per step in the steady state, and its floor.
    pub steady_ms: Option<f64>,
    pub steady_floor_ms: f64,
    /// Burn's stock loss, steady state and single step.
    pub stock_steady_ms: Option<f64>,
    pub stock_single_ms: Option<f64>,
    pub ours_mib: Option<f64>,
    pub stock_mib: Option<f64>,
}

/// What the run was: printed above the table.
pub struct Header {
    pub runtime: String,
    pub copy_gbps: f64,
    pub steady_copy_gbps: f64,
}

fn number(value: Option<f64>, precision: usize) -> String {
    value.map_or_else(String::new, |v| format!("{v:.precision$}"))
}

fn ratio(numerator: Option<f64>, denominator: Option<f64>) -> Option<f64> {
    numerator.zip(denominator).map(|(n, d)| n / d)
}

/// Today's date (UTC) as `YYYY-MM-DD`, from the system clock.
fn today() -> String {
    let days = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() / 86_400) as i64;
    // Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

pub fn csv(rows: &[Row]) -> String {
    let mut out = String::from(
        "case,dtype,mode,steady_ms,steady_floor_ms,steady_pct_of_floor,single_ms,single_floor_ms,stock_steady_ms,stock_single_ms,ours_extra_mib,stock_extra_mib\n",
    );
    for r in rows {
        let _ = writeln!(
            out,
            "{},{},{},{},{:.4},{},{},{:.4},{},{},{},{}",
            r.case,
            r.dtype,
            r.mode,
            number(r.steady_ms, 4),
            r.steady_floor_ms,
            number(ratio(Some(r.steady_floor_ms * 100.0), r.steady_ms), 1),
            number(r.single_ms, 4),
            r.single_floor_ms,
            number(r.stock_steady_ms, 4),
            number(r.stock_single_ms, 4),
            number(r.ours_mib, 1),
            number(r.stock_mib, 1),
        );
    }
    out
}

pub fn markdown(header: &Header, rows: &[Row]) -> String {
    let mut out = format!(
        "{} on {}{}; copy bandwidth {:.0} GB/s ({:.0} GB/s steady), read + write.\n\n",
        today(),
        header.runtime,
        option_env!("FUSED_CE_COMMIT").map_or_else(String::new, |c| format!(", commit {c}")),
        header.copy_gbps,
        header.steady_copy_gbps,
    );
    out += "| case | dtype | step | steady ms | floor ms | % of floor | single ms | Burn's loss, steady ms | Burn / ours | extra MiB (ours / Burn's) |\n";
    out += "|---|---|---|---:|---:|---:|---:|---:|---:|---:|\n";
    for r in rows {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {:.3} | {} | {} | {} | {} | {} / {} |",
            r.case,
            r.dtype,
            r.mode,
            number(r.steady_ms, 3),
            r.steady_floor_ms,
            number(ratio(Some(r.steady_floor_ms * 100.0), r.steady_ms), 0),
            number(r.single_ms, 3),
            number(r.stock_steady_ms, 2),
            number(ratio(r.stock_steady_ms, r.steady_ms), 1),
            number(r.ours_mib, 0),
            number(r.stock_mib, 0),
        );
    }
    out
}

/// Horizontal bars, one per row: the steady time, with the floor marked on it.
pub fn svg(header: &Header, rows: &[Row]) -> String {
    let (label_width, bar_width, row_height, top) = (330.0, 520.0, 22.0, 46.0);
    let width = label_width + bar_width + 90.0;
    let height = top + row_height * rows.len() as f64 + 30.0;
    let longest = rows
        .iter()
        .map(|r| r.steady_ms.unwrap_or(0.0).max(r.steady_floor_ms))
        .fold(0.0f64, f64::max)
        .max(1e-9);
    let scale = bar_width / longest;
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"10\" y=\"18\" font-size=\"14\">Fused cross-entropy, steady step against its floor ({}, {})</text>\n\
         <text x=\"10\" y=\"34\" fill=\"#555\">bar: our time per step (ms); black line: the bandwidth floor</text>\n",
        header.runtime,
        today()
    );
    for (i, r) in rows.iter().enumerate() {
        let y = top + row_height * i as f64;
        let label = format!("{} {} {}", r.case, r.dtype, r.mode);
        let _ = writeln!(
            out,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>",
            label_width - 8.0,
            y + 14.0,
            label
        );
        if let Some(ms) = r.steady_ms {
            let _ = writeln!(
                out,
                "<rect x=\"{label_width}\" y=\"{}\" width=\"{:.1}\" height=\"{}\" fill=\"#4878b8\"/>\n<text x=\"{:.1}\" y=\"{}\">{ms:.3}</text>",
                y + 3.0,
                ms * scale,
                row_height - 6.0,
                label_width + ms * scale + 6.0,
                y + 14.0,
            );
        }
        let floor_x = label_width + r.steady_floor_ms * scale;
        let _ = writeln!(
            out,
            "<line x1=\"{floor_x:.1}\" y1=\"{}\" x2=\"{floor_x:.1}\" y2=\"{}\" stroke=\"black\" stroke-width=\"2\"/>",
            y + 1.0,
            y + row_height - 1.0,
        );
    }
    out += "</svg>\n";
    out
}

/// Writes `results.csv`, `results.md` and `results.svg` into `dir`.
pub fn write(dir: &Path, header: &Header, rows: &[Row]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("results.csv"), csv(rows))?;
    std::fs::write(dir.join("results.md"), markdown(header, rows))?;
    std::fs::write(dir.join("results.svg"), svg(header, rows))
}
