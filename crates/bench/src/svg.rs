//! Line charts as SVG, written by hand: a benchmark's plot must open anywhere without a
//! plotting library or a network.

use std::fmt::Write;

/// One line of a chart: its name and its (x, y) points.
pub struct Series {
    /// Shown in the legend.
    pub name: String,
    /// Points, in x order.
    pub points: Vec<(f64, f64)>,
}

/// A chart panel: a title, axis names and its lines.
pub struct Panel {
    /// Above the plot.
    pub title: String,
    /// Under the x axis.
    pub x_label: String,
    /// Beside the y axis.
    pub y_label: String,
    /// The lines.
    pub series: Vec<Series>,
}

const WIDTH: f64 = 640.0;
const HEIGHT: f64 = 360.0;
const MARGIN_LEFT: f64 = 80.0;
const MARGIN_RIGHT: f64 = 150.0;
const MARGIN_TOP: f64 = 40.0;
const MARGIN_BOTTOM: f64 = 50.0;
const COLORS: [&str; 6] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
];

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A "nice" upper bound for an axis: 1, 2 or 5 times a power of ten, at least `max`.
fn nice_ceiling(max: f64) -> f64 {
    if max <= 0.0 {
        return 1.0;
    }
    let power = 10f64.powf(max.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|step| step * power)
        .find(|bound| *bound >= max)
        .unwrap_or(10.0 * power)
}

fn panel(out: &mut String, panel: &Panel, top: f64) {
    let plot_width = WIDTH - MARGIN_LEFT - MARGIN_RIGHT;
    let plot_height = HEIGHT - MARGIN_TOP - MARGIN_BOTTOM;
    let points = panel.series.iter().flat_map(|s| s.points.iter());
    let x_max = points.clone().map(|p| p.0).fold(1.0, f64::max);
    let x_min = points.clone().map(|p| p.0).fold(x_max, f64::min);
    let y_max = nice_ceiling(points.map(|p| p.1).fold(0.0, f64::max));
    let x_span = (x_max - x_min).max(1.0);
    let x_at = |x: f64| MARGIN_LEFT + (x - x_min) / x_span * plot_width;
    let y_at = |y: f64| top + MARGIN_TOP + plot_height - y / y_max * plot_height;
    let _ = writeln!(
        out,
        r#"<text x="{}" y="{}" font-size="16" text-anchor="middle">{}</text>"#,
        MARGIN_LEFT + plot_width / 2.0,
        top + 24.0,
        escape(&panel.title)
    );
    for tick in 0..=5 {
        let value = y_max * f64::from(tick) / 5.0;
        let y = y_at(value);
        let _ = writeln!(
            out,
            r##"<line x1="{MARGIN_LEFT}" y1="{y}" x2="{}" y2="{y}" stroke="#ddd"/><text x="{}" y="{}" font-size="11" text-anchor="end">{value:.0}</text>"##,
            MARGIN_LEFT + plot_width,
            MARGIN_LEFT - 6.0,
            y + 4.0
        );
    }
    let mut xs: Vec<f64> = panel
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .collect();
    xs.sort_by(f64::total_cmp);
    xs.dedup();
    for x in xs {
        let _ = writeln!(
            out,
            r#"<text x="{}" y="{}" font-size="11" text-anchor="middle">{x}</text>"#,
            x_at(x),
            top + MARGIN_TOP + plot_height + 16.0
        );
    }
    let _ = writeln!(
        out,
        r#"<text x="{}" y="{}" font-size="12" text-anchor="middle">{}</text>"#,
        MARGIN_LEFT + plot_width / 2.0,
        top + HEIGHT - 12.0,
        escape(&panel.x_label)
    );
    let _ = writeln!(
        out,
        r#"<text x="16" y="{}" font-size="12" text-anchor="middle" transform="rotate(-90 16 {})">{}</text>"#,
        top + MARGIN_TOP + plot_height / 2.0,
        top + MARGIN_TOP + plot_height / 2.0,
        escape(&panel.y_label)
    );
    for (index, series) in panel.series.iter().enumerate() {
        let color = COLORS[index % COLORS.len()];
        let path: Vec<String> = series
            .points
            .iter()
            .map(|(x, y)| format!("{:.1},{:.1}", x_at(*x), y_at(*y)))
            .collect();
        let _ = writeln!(
            out,
            r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="2"/>"#,
            path.join(" ")
        );
        for (x, y) in &series.points {
            let _ = writeln!(
                out,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{color}"/>"#,
                x_at(*x),
                y_at(*y)
            );
        }
        let legend_y = top + MARGIN_TOP + 10.0 + index as f64 * 18.0;
        let legend_x = WIDTH - MARGIN_RIGHT + 16.0;
        let _ = writeln!(
            out,
            r#"<rect x="{legend_x}" y="{}" width="12" height="4" fill="{color}"/><text x="{}" y="{}" font-size="12">{}</text>"#,
            legend_y - 4.0,
            legend_x + 18.0,
            legend_y + 2.0,
            escape(&series.name)
        );
    }
}

/// An SVG document with `panels` stacked top to bottom.
pub fn render(panels: &[Panel]) -> String {
    let height = HEIGHT * panels.len() as f64;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif">"#
    );
    let _ = writeln!(
        out,
        r#"<rect width="{WIDTH}" height="{height}" fill="white"/>"#
    );
    for (index, one) in panels.iter().enumerate() {
        panel(&mut out, one, index as f64 * HEIGHT);
    }
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: a chart is a complete SVG document with one line per series and escaped labels.
    #[test]
    fn renders_lines_and_escapes() {
        let svg = render(&[Panel {
            title: "write <MB/s>".into(),
            x_label: "threads".into(),
            y_label: "MB/s".into(),
            series: vec![
                Series {
                    name: "a".into(),
                    points: vec![(1.0, 10.0), (2.0, 30.0)],
                },
                Series {
                    name: "b".into(),
                    points: vec![(1.0, 5.0), (2.0, 7.0)],
                },
            ],
        }]);
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains("write &lt;MB/s&gt;"));
        assert_eq!(nice_ceiling(37.0), 50.0);
        assert_eq!(nice_ceiling(0.3), 0.5);
    }
}
