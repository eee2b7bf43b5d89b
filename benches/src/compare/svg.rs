//! A small hand-written SVG writer for the comparison plots: grouped bar charts, one panel per
//! metric, stacked vertically. No dependency; the output is plain SVG 1.1 text.

use std::fmt::Write as _;

/// One bar group (a setup) with one value per series; `None` draws no bar and a "n/a" mark.
#[derive(Debug, Clone)]
pub struct Group {
    /// Label under the group (the setup's name).
    pub label: String,
    /// One value per series of the panel.
    pub values: Vec<Option<f64>>,
    /// Fill colour of the group's first series (the others are shaded from the panel's palette).
    pub color: Option<String>,
}

/// A panel: a title, a unit, one or more series, and a linear or logarithmic y axis.
#[derive(Debug, Clone)]
pub struct Panel {
    /// Title above the panel.
    pub title: String,
    /// Unit shown on the y axis.
    pub unit: String,
    /// Series names (legend), in the order of `Group::values`.
    pub series: Vec<String>,
    /// The groups, left to right.
    pub groups: Vec<Group>,
    /// Logarithmic y axis (for latencies spanning decades).
    pub log: bool,
}

const WIDTH: f64 = 900.0;
const PANEL_H: f64 = 300.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 60.0;
const PALETTE: [&str; 4] = ["#59a14f", "#e15759", "#76b7b2", "#b07aa1"];

/// Escapes text for SVG element content and attribute values.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

/// A short human form of a value: 3 significant digits, k/M suffixes for large ones.
pub fn short(v: f64) -> String {
    if v == 0.0 {
        return "0".into();
    }
    let (v, suffix) = if v.abs() >= 1e6 {
        (v / 1e6, "M")
    } else if v.abs() >= 1e4 {
        (v / 1e3, "k")
    } else {
        (v, "")
    };
    let s = if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    };
    format!("{s}{suffix}")
}

/// "Nice" upper bound for a linear axis: 1, 2 or 5 times a power of ten, at least `max`.
fn nice_max(max: f64) -> f64 {
    if max <= 0.0 || !max.is_finite() {
        return 1.0;
    }
    let p = 10f64.powf(max.log10().floor());
    for m in [1.0, 2.0, 5.0, 10.0] {
        if m * p >= max {
            return m * p;
        }
    }
    10.0 * p
}

fn panel(out: &mut String, p: &Panel, y0: f64) {
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = PANEL_H - TOP - BOTTOM;
    let top = y0 + TOP;
    let base = top + plot_h;
    let vals: Vec<f64> = p
        .groups
        .iter()
        .flat_map(|g| g.values.iter().flatten().copied())
        .filter(|v| v.is_finite() && *v > 0.0)
        .collect();
    let max = vals.iter().copied().fold(0.0, f64::max);
    let min = vals.iter().copied().fold(f64::INFINITY, f64::min);
    // Axis mapping and ticks.
    let (lo, hi) = if p.log {
        let lo = if min.is_finite() {
            10f64.powf(min.log10().floor())
        } else {
            1.0
        };
        let hi = if max > 0.0 {
            10f64.powf(max.log10().ceil())
        } else {
            10.0
        };
        (lo, if hi <= lo { lo * 10.0 } else { hi })
    } else {
        (0.0, nice_max(max))
    };
    let y_of = |v: f64| -> f64 {
        let f = if p.log {
            (v.max(lo).log10() - lo.log10()) / (hi.log10() - lo.log10())
        } else {
            v / hi
        };
        base - f.clamp(0.0, 1.0) * plot_h
    };
    let _ = writeln!(
        out,
        r#"<text x="{}" y="{}" font-size="15" font-weight="bold">{}</text>"#,
        LEFT,
        y0 + 22.0,
        escape(&p.title)
    );
    let ticks: Vec<f64> = if p.log {
        let mut t = Vec::new();
        let mut v = lo;
        while v <= hi * 1.0001 {
            t.push(v);
            v *= 10.0;
        }
        t
    } else {
        (0..=5).map(|i| hi * f64::from(i) / 5.0).collect()
    };
    for t in ticks {
        let y = y_of(t);
        let _ = writeln!(
            out,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" font-size="11" text-anchor="end">{}</text>"##,
            LEFT + plot_w,
            LEFT - 6.0,
            y + 4.0,
            escape(&short(t))
        );
    }
    let _ = writeln!(
        out,
        r#"<text x="14" y="{:.1}" font-size="12" transform="rotate(-90 14 {:.1})" text-anchor="middle">{}</text>"#,
        top + plot_h / 2.0,
        top + plot_h / 2.0,
        escape(&p.unit)
    );
    let _ = writeln!(
        out,
        r##"<line x1="{LEFT}" y1="{base:.1}" x2="{:.1}" y2="{base:.1}" stroke="#333"/>"##,
        LEFT + plot_w
    );
    // Bars.
    let n = p.groups.len().max(1);
    let group_w = plot_w / n as f64;
    let nser = p.series.len().max(1);
    let bar_w = (group_w * 0.8) / nser as f64;
    for (gi, g) in p.groups.iter().enumerate() {
        let gx = LEFT + gi as f64 * group_w + group_w * 0.1;
        for (si, v) in g.values.iter().enumerate() {
            let x = gx + si as f64 * bar_w;
            let color = match (&g.color, si) {
                (Some(c), 0) => c.clone(),
                _ => PALETTE[si % PALETTE.len()].to_string(),
            };
            match v {
                Some(v) if v.is_finite() => {
                    let y = y_of(*v);
                    let _ = writeln!(
                        out,
                        r#"<rect x="{x:.1}" y="{y:.1}" width="{:.1}" height="{:.1}" fill="{}"><title>{}: {}</title></rect><text x="{:.1}" y="{:.1}" font-size="10" text-anchor="middle">{}</text>"#,
                        (bar_w - 2.0).max(1.0),
                        (base - y).max(0.0),
                        escape(&color),
                        escape(&format!(
                            "{} {}",
                            g.label,
                            p.series.get(si).map_or("", |s| s)
                        )),
                        escape(&short(*v)),
                        x + bar_w / 2.0,
                        y - 3.0,
                        escape(&short(*v))
                    );
                }
                _ => {
                    let _ = writeln!(
                        out,
                        r##"<text x="{:.1}" y="{:.1}" font-size="10" text-anchor="middle" fill="#999">n/a</text>"##,
                        x + bar_w / 2.0,
                        base - 4.0
                    );
                }
            }
        }
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="{:.1}" font-size="12" text-anchor="middle">{}</text>"#,
            gx + group_w * 0.4,
            base + 18.0,
            escape(&g.label)
        );
    }
    // Legend (only when there is more than one series).
    if p.series.len() > 1 {
        for (si, s) in p.series.iter().enumerate() {
            let x = WIDTH - RIGHT - 110.0 * (p.series.len() - si) as f64;
            let _ = writeln!(
                out,
                r#"<rect x="{x:.1}" y="{:.1}" width="12" height="12" fill="{}"/><text x="{:.1}" y="{:.1}" font-size="12">{}</text>"#,
                y0 + 11.0,
                PALETTE[si % PALETTE.len()],
                x + 16.0,
                y0 + 22.0,
                escape(s)
            );
        }
    }
}

/// Renders panels one under the other, with a caption line at the bottom.
pub fn render(title: &str, panels: &[Panel], caption: &str) -> String {
    let h = 40.0 + PANEL_H * panels.len() as f64 + 30.0;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{h}" viewBox="0 0 {WIDTH} {h}" font-family="sans-serif">"#
    );
    let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        out,
        r#"<text x="{}" y="26" font-size="18" font-weight="bold" text-anchor="middle">{}</text>"#,
        WIDTH / 2.0,
        escape(title)
    );
    for (i, p) in panels.iter().enumerate() {
        panel(&mut out, p, 40.0 + PANEL_H * i as f64);
    }
    let _ = writeln!(
        out,
        r##"<text x="{LEFT}" y="{:.1}" font-size="11" fill="#555">{}</text>"##,
        h - 10.0,
        escape(caption)
    );
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup() {
        assert_eq!(
            escape(r#"a<b & "c">'"#),
            "a&lt;b &amp; &quot;c&quot;&gt;&apos;"
        );
    }

    #[test]
    fn renders_bars_and_missing_values() {
        let panels = [
            Panel {
                title: "throughput <touches/s>".into(),
                unit: "touches/s".into(),
                series: vec!["touches/s".into()],
                groups: vec![
                    Group {
                        label: "kswap".into(),
                        values: vec![Some(1000.0)],
                        color: None,
                    },
                    Group {
                        label: "zswap".into(),
                        values: vec![None],
                        color: Some("#e15759".into()),
                    },
                ],
                log: false,
            },
            Panel {
                title: "latency".into(),
                unit: "us".into(),
                series: vec!["p50".into(), "p99".into()],
                groups: vec![Group {
                    label: "kswap".into(),
                    values: vec![Some(20.0), Some(900.0)],
                    color: None,
                }],
                log: true,
            },
        ];
        let s = render("random & more", &panels, "caption");
        assert!(s.starts_with("<svg"));
        assert!(s.trim_end().ends_with("</svg>"));
        assert!(s.contains("random &amp; more"));
        assert!(s.contains("throughput &lt;touches/s&gt;"));
        // background + 3 bars + 2 legend boxes
        assert_eq!(s.matches("<rect").count(), 6);
        assert_eq!(s.matches(">n/a<").count(), 1);
        assert!(!s.contains("NaN") && !s.contains("inf"));
    }

    #[test]
    fn short_values_and_nice_axes() {
        assert_eq!(short(1234.0), "1234");
        assert_eq!(short(12345.0), "12.3k");
        assert_eq!(short(2_500_000.0), "2.50M");
        assert_eq!(short(2.71), "2.71");
        assert_eq!(nice_max(0.0), 1.0);
        assert_eq!(nice_max(730.0), 1000.0);
        assert_eq!(nice_max(180.0), 200.0);
        assert_eq!(nice_max(41.0), 50.0);
    }
}
