//! Loss curves as an SVG line chart (no plotting dependency: a few lines of SVG).

use std::fmt::Write as _;

/// One curve: a name and its values per step.
pub struct Curve<'a> {
    pub name: &'a str,
    pub values: Vec<f64>,
}

const COLOURS: [&str; 4] = ["#4878b8", "#d0603a", "#3a9a5a", "#8a58a8"];

/// The curves on shared axes (step, loss), with a legend; `title` above.
pub fn loss_curves_svg(title: &str, curves: &[Curve]) -> String {
    let (width, height) = (760.0, 420.0);
    let (left, right, top, bottom) = (60.0, 20.0, 40.0, 40.0);
    let steps = curves
        .iter()
        .map(|c| c.values.len())
        .max()
        .unwrap_or(0)
        .max(2);
    let finite = curves
        .iter()
        .flat_map(|c| c.values.iter().copied())
        .filter(|v| v.is_finite());
    let (low, high) = finite.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    });
    let (low, high) = if low.is_finite() && high > low {
        (low, high)
    } else {
        (0.0, 1.0)
    };
    let x = |step: usize| left + (width - left - right) * step as f64 / (steps - 1) as f64;
    let y = |v: f64| top + (height - top - bottom) * (high - v) / (high - low);
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{left}\" y=\"22\" font-size=\"14\">{title}</text>\n\
         <line x1=\"{left}\" y1=\"{b}\" x2=\"{r}\" y2=\"{b}\" stroke=\"#888\"/>\n\
         <line x1=\"{left}\" y1=\"{top}\" x2=\"{left}\" y2=\"{b}\" stroke=\"#888\"/>\n\
         <text x=\"{r}\" y=\"{t}\" text-anchor=\"end\">step {last}</text>\n\
         <text x=\"{l}\" y=\"{yt}\" text-anchor=\"end\">{high:.2}</text>\n\
         <text x=\"{l}\" y=\"{yb}\" text-anchor=\"end\">{low:.2}</text>\n",
        b = height - bottom,
        r = width - right,
        t = height - 12.0,
        last = steps - 1,
        l = left - 6.0,
        yt = top + 4.0,
        yb = height - bottom,
    );
    for (i, curve) in curves.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let points: Vec<String> = curve
            .values
            .iter()
            .enumerate()
            .filter(|(_, v)| v.is_finite())
            .map(|(step, &v)| format!("{:.1},{:.1}", x(step), y(v)))
            .collect();
        let _ = writeln!(
            out,
            "<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"1.5\" points=\"{}\"/>",
            points.join(" ")
        );
        let legend_y = top + 16.0 * (i as f64 + 1.0);
        let _ = writeln!(
            out,
            "<line x1=\"{a}\" y1=\"{ly}\" x2=\"{b}\" y2=\"{ly}\" stroke=\"{colour}\" stroke-width=\"3\"/><text x=\"{c}\" y=\"{ty}\">{}</text>",
            curve.name,
            a = width - right - 190.0,
            b = width - right - 170.0,
            c = width - right - 164.0,
            ly = legend_y - 4.0,
            ty = legend_y,
        );
    }
    out += "</svg>\n";
    out
}
