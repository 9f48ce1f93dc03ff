//! Loss curves as an SVG line chart: axes with ticks and labels, grid lines and a legend,
//! in a few lines of SVG rather than a plotting dependency.

use std::fmt::Write as _;

/// One curve: a name and its values per step.
pub struct Curve<'a> {
    pub name: &'a str,
    pub values: Vec<f64>,
}

const COLOURS: [&str; 4] = ["#4878b8", "#d0603a", "#3a9a5a", "#8a58a8"];

/// The curves on shared axes (step, loss), with ticks, axis labels and a legend; `title`
/// above.
pub fn loss_curves_svg(title: &str, curves: &[Curve]) -> String {
    let (width, height) = (760.0, 440.0);
    let (left, right, top, bottom) = (70.0, 20.0, 40.0, 56.0);
    let (plot_right, plot_bottom) = (width - right, height - bottom);
    let last_step = curves
        .iter()
        .map(|c| c.values.len())
        .max()
        .unwrap_or(0)
        .saturating_sub(1)
        .max(1);
    let finite = curves
        .iter()
        .flat_map(|c| c.values.iter().copied())
        .filter(|v| v.is_finite());
    let (low, high) = finite.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    });
    let (low, high) = if low.is_finite() && high > low {
        (low, high)
    } else if low.is_finite() {
        (low - 0.5, low + 0.5)
    } else {
        (0.0, 1.0)
    };
    // The loss axis runs from tick to tick, so that its ends are labelled too.
    let y_step = tick_step(high - low, 6);
    let (low, high) = (
        (low / y_step).floor() * y_step,
        (high / y_step).ceil() * y_step,
    );
    let x_step = tick_step(last_step as f64, 8).max(1.0);
    let x = |step: f64| left + (plot_right - left) * step / last_step as f64;
    let y = |v: f64| top + (plot_bottom - top) * (high - v) / (high - low);

    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{left}\" y=\"24\" font-size=\"14\">{}</text>\n",
        escape(title)
    );
    // Grid lines and tick labels, then the axes over them.
    for value in ticks(low, high, y_step) {
        let at = y(value);
        let _ = writeln!(
            out,
            "<line x1=\"{left}\" y1=\"{at:.1}\" x2=\"{plot_right}\" y2=\"{at:.1}\" stroke=\"#e4e4e4\"/>\
             <line x1=\"{a}\" y1=\"{at:.1}\" x2=\"{left}\" y2=\"{at:.1}\" stroke=\"#888\"/>\
             <text x=\"{t}\" y=\"{ty:.1}\" text-anchor=\"end\">{}</text>",
            label(value, y_step),
            a = left - 5.0,
            t = left - 8.0,
            ty = at + 4.0,
        );
    }
    for step in ticks(0.0, last_step as f64, x_step) {
        let at = x(step);
        let _ = writeln!(
            out,
            "<line x1=\"{at:.1}\" y1=\"{top}\" x2=\"{at:.1}\" y2=\"{plot_bottom}\" stroke=\"#e4e4e4\"/>\
             <line x1=\"{at:.1}\" y1=\"{plot_bottom}\" x2=\"{at:.1}\" y2=\"{b}\" stroke=\"#888\"/>\
             <text x=\"{at:.1}\" y=\"{t}\" text-anchor=\"middle\">{}</text>",
            label(step, x_step),
            b = plot_bottom + 5.0,
            t = plot_bottom + 19.0,
        );
    }
    let _ = writeln!(
        out,
        "<line x1=\"{left}\" y1=\"{plot_bottom}\" x2=\"{plot_right}\" y2=\"{plot_bottom}\" stroke=\"#888\"/>\n\
         <line x1=\"{left}\" y1=\"{top}\" x2=\"{left}\" y2=\"{plot_bottom}\" stroke=\"#888\"/>\n\
         <text x=\"{cx}\" y=\"{xl}\" text-anchor=\"middle\">training step</text>\n\
         <text transform=\"translate(16 {cy}) rotate(-90)\" text-anchor=\"middle\">loss (cross-entropy, nats per token)</text>",
        cx = (left + plot_right) / 2.0,
        xl = height - 12.0,
        cy = (top + plot_bottom) / 2.0,
    );
    for (i, curve) in curves.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let points: Vec<String> = curve
            .values
            .iter()
            .enumerate()
            .filter(|(_, v)| v.is_finite())
            .map(|(step, &v)| format!("{:.1},{:.1}", x(step as f64), y(v)))
            .collect();
        let _ = writeln!(
            out,
            "<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"1.5\" points=\"{}\"/>",
            points.join(" ")
        );
    }
    // The legend in the top right corner, where falling curves leave room.
    let longest = curves.iter().map(|c| c.name.chars().count()).max();
    if let Some(longest) = longest {
        let (box_width, row) = (40.0 + 7.0 * longest as f64, 18.0);
        let (bx, by) = (plot_right - box_width - 8.0, top + 8.0);
        let _ = writeln!(
            out,
            "<rect x=\"{bx:.1}\" y=\"{by:.1}\" width=\"{box_width:.1}\" height=\"{h:.1}\" fill=\"white\" fill-opacity=\"0.9\" stroke=\"#bbb\"/>",
            h = row * curves.len() as f64 + 8.0,
        );
        for (i, curve) in curves.iter().enumerate() {
            let colour = COLOURS[i % COLOURS.len()];
            let ty = by + row * (i as f64 + 1.0);
            let _ = writeln!(
                out,
                "<line x1=\"{a:.1}\" y1=\"{ly:.1}\" x2=\"{b:.1}\" y2=\"{ly:.1}\" stroke=\"{colour}\" stroke-width=\"3\"/><text x=\"{c:.1}\" y=\"{ty:.1}\">{}</text>",
                escape(curve.name),
                a = bx + 8.0,
                b = bx + 28.0,
                c = bx + 34.0,
                ly = ty - 4.0,
            );
        }
    }
    out += "</svg>\n";
    out
}

/// A step of 1, 2 or 5 times a power of ten that cuts `range` into about `count` parts.
fn tick_step(range: f64, count: usize) -> f64 {
    let rough = range.abs().max(f64::MIN_POSITIVE) / count.max(1) as f64;
    let power = 10f64.powf(rough.log10().floor());
    let mantissa = rough / power;
    let nice = if mantissa <= 1.0 {
        1.0
    } else if mantissa <= 2.0 {
        2.0
    } else if mantissa <= 5.0 {
        5.0
    } else {
        10.0
    };
    nice * power
}

/// The multiples of `step` from `low` to `high`, both included where they are multiples.
fn ticks(low: f64, high: f64, step: f64) -> Vec<f64> {
    let first = (low / step - 1e-9).ceil() as i64;
    let last = (high / step + 1e-9).floor() as i64;
    (first..=last).map(|k| k as f64 * step).collect()
}

/// `value` with as many decimals as `step` needs.
fn label(value: f64, step: f64) -> String {
    let decimals = (-step.log10().floor()).max(0.0) as usize;
    format!("{value:.decimals$}")
}

/// `text` with XML's special characters escaped.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round_numbers_that_cover_the_range() {
        assert_eq!(tick_step(10.83 - 6.2, 6), 1.0);
        assert_eq!(tick_step(299.0, 8), 50.0);
        assert_eq!(ticks(6.0, 11.0, 1.0), vec![6.0, 7.0, 8.0, 9.0, 10.0, 11.0]);
        assert_eq!(label(7.0, 0.5), "7.0");
        assert_eq!(label(150.0, 50.0), "150");
    }

    #[test]
    fn the_chart_has_ticks_axis_labels_and_a_legend() {
        let svg = loss_curves_svg(
            "a <title>",
            &[
                Curve {
                    name: "fused linear CE",
                    values: vec![10.8, 9.0, 7.5, f64::NAN, 6.9],
                },
                Curve {
                    name: "Burn's loss",
                    values: vec![10.8, 9.1, 7.4, 7.0, 6.8],
                },
            ],
        );
        assert!(svg.contains("training step") && svg.contains("nats per token"));
        assert!(svg.contains(">fused linear CE</text>") && svg.contains(">Burn's loss</text>"));
        assert!(svg.contains("a &lt;title&gt;"));
        assert!(svg.contains(">11</text>") && svg.contains(">6</text>"));
        assert_eq!(svg.matches("<polyline").count(), 2);
    }
}
