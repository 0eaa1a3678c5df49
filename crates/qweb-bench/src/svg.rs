//! Hand-written SVG charts (grouped bars, lines): no fonts or system libraries needed to draw
//! them; text uses the viewer's sans-serif font.

use std::fmt::Write;

const PALETTE: [&str; 8] = [
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#9c755f",
];

const W: f64 = 760.0;
const H: f64 = 420.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 90.0;

/// Escapes text for XML.
pub fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A "nice" axis maximum at or above `max`: 1, 2, 2.5 or 5 times a power of ten.
pub fn nice_max(max: f64) -> f64 {
    if !max.is_finite() || max <= 0.0 {
        return 1.0;
    }
    let p = 10f64.powf(max.log10().floor());
    for m in [1.0, 2.0, 2.5, 5.0, 10.0] {
        if m * p >= max * 0.999_999 {
            return m * p;
        }
    }
    10.0 * p
}

fn tick_label(v: f64) -> String {
    if v >= 10_000.0 && v % 1000.0 == 0.0 {
        format!("{}k", v / 1000.0)
    } else if v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

fn frame(out: &mut String, title: &str, y_label: &str, ymax: f64) {
    let _ = write!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{}" y="24" text-anchor="middle" font-size="15" font-weight="bold">{}</text>
<text transform="translate(18,{}) rotate(-90)" text-anchor="middle">{}</text>
"#,
        W / 2.0,
        xml_escape(title),
        TOP + (H - TOP - BOTTOM) / 2.0,
        xml_escape(y_label)
    );
    let ph = H - TOP - BOTTOM;
    for i in 0..=5 {
        let v = ymax * i as f64 / 5.0;
        let y = TOP + ph - ph * i as f64 / 5.0;
        let _ = writeln!(
            out,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
            W - RIGHT,
            LEFT - 6.0,
            y + 4.0,
            tick_label(v)
        );
    }
    let _ = writeln!(
        out,
        r##"<line x1="{LEFT}" y1="{}" x2="{}" y2="{}" stroke="#333"/>"##,
        TOP + ph,
        W - RIGHT,
        TOP + ph
    );
}

fn legend(out: &mut String, names: &[(String, bool)]) {
    let mut x = LEFT;
    let y = H - 18.0;
    for (i, (name, dashed)) in names.iter().enumerate() {
        let c = PALETTE[i % PALETTE.len()];
        if *dashed {
            let _ = writeln!(
                out,
                r#"<line x1="{x}" y1="{}" x2="{}" y2="{}" stroke="{c}" stroke-width="2" stroke-dasharray="5,3"/>"#,
                y - 4.0,
                x + 14.0,
                y - 4.0
            );
        } else {
            let _ = writeln!(
                out,
                r#"<rect x="{x}" y="{}" width="12" height="12" fill="{c}"/>"#,
                y - 10.0
            );
        }
        let _ = writeln!(
            out,
            r#"<text x="{}" y="{y}">{}</text>"#,
            x + 18.0,
            xml_escape(name)
        );
        x += 30.0 + 7.0 * name.chars().count() as f64;
    }
}

/// A grouped bar chart: one group per category on the x axis, one bar per series in each
/// group. NaN values leave a gap. Values are printed above the bars.
pub fn bar_chart(
    title: &str,
    y_label: &str,
    categories: &[String],
    series: &[(String, Vec<f64>)],
) -> String {
    let max = series
        .iter()
        .flat_map(|(_, v)| v.iter().copied())
        .filter(|v| v.is_finite())
        .fold(0.0, f64::max);
    let ymax = nice_max(max);
    let mut out = String::new();
    frame(&mut out, title, y_label, ymax);
    let pw = W - LEFT - RIGHT;
    let ph = H - TOP - BOTTOM;
    let ng = categories.len().max(1) as f64;
    let gw = pw / ng;
    let ns = series.len().max(1) as f64;
    let bw = (gw * 0.8 / ns).min(60.0);
    for (g, cat) in categories.iter().enumerate() {
        let gx = LEFT + gw * g as f64 + (gw - bw * ns) / 2.0;
        for (s, (_, vals)) in series.iter().enumerate() {
            let Some(&v) = vals.get(g) else { continue };
            if !v.is_finite() {
                continue;
            }
            let h = ph * (v / ymax).clamp(0.0, 1.0);
            let x = gx + bw * s as f64;
            let _ = writeln!(
                out,
                r#"<rect x="{x:.1}" y="{:.1}" width="{:.1}" height="{h:.1}" fill="{}"><title>{}</title></rect>"#,
                TOP + ph - h,
                bw - 2.0,
                PALETTE[s % PALETTE.len()],
                xml_escape(&format!("{cat}: {}", crate::report::num(v)))
            );
            let _ = writeln!(
                out,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="10">{}</text>"#,
                x + (bw - 2.0) / 2.0,
                TOP + ph - h - 3.0,
                crate::report::num(v)
            );
        }
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            LEFT + gw * (g as f64 + 0.5),
            TOP + ph + 18.0,
            xml_escape(cat)
        );
    }
    let names: Vec<(String, bool)> = series.iter().map(|(n, _)| (n.clone(), false)).collect();
    legend(&mut out, &names);
    out.push_str("</svg>\n");
    out
}

/// A line chart over categorical x values (evenly spaced, labelled with `x_labels`); each
/// series is (name, values, dashed). NaN values break the line.
pub fn line_chart(
    title: &str,
    x_label: &str,
    y_label: &str,
    x_labels: &[String],
    series: &[(String, Vec<f64>, bool)],
) -> String {
    let max = series
        .iter()
        .flat_map(|(_, v, _)| v.iter().copied())
        .filter(|v| v.is_finite())
        .fold(0.0, f64::max);
    let ymax = nice_max(max);
    let mut out = String::new();
    frame(&mut out, title, y_label, ymax);
    let pw = W - LEFT - RIGHT;
    let ph = H - TOP - BOTTOM;
    let n = x_labels.len().max(1) as f64;
    let xat = |i: usize| LEFT + pw * (i as f64 + 0.5) / n;
    for (i, l) in x_labels.iter().enumerate() {
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            xat(i),
            TOP + ph + 18.0,
            xml_escape(l)
        );
    }
    let _ = writeln!(
        out,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
        LEFT + pw / 2.0,
        TOP + ph + 40.0,
        xml_escape(x_label)
    );
    for (s, (name, vals, dashed)) in series.iter().enumerate() {
        let c = PALETTE[s % PALETTE.len()];
        let mut d = String::new();
        let mut pen_down = false;
        for (i, v) in vals.iter().enumerate() {
            if !v.is_finite() {
                pen_down = false;
                continue;
            }
            let y = TOP + ph - ph * (v / ymax).clamp(0.0, 1.0);
            let _ = write!(
                d,
                "{}{:.1},{:.1} ",
                if pen_down { "L" } else { "M" },
                xat(i),
                y
            );
            pen_down = true;
            let _ = writeln!(
                out,
                r#"<circle cx="{:.1}" cy="{y:.1}" r="3" fill="{c}"><title>{}</title></circle>"#,
                xat(i),
                xml_escape(&format!("{name}: {}", crate::report::num(*v)))
            );
        }
        let dash = if *dashed {
            r#" stroke-dasharray="5,3""#
        } else {
            ""
        };
        let _ = writeln!(
            out,
            r#"<path d="{}" fill="none" stroke="{c}" stroke-width="2"{dash}/>"#,
            d.trim_end()
        );
    }
    let names: Vec<(String, bool)> = series.iter().map(|(n, _, d)| (n.clone(), *d)).collect();
    legend(&mut out, &names);
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nice_maxima() {
        assert_eq!(nice_max(0.0), 1.0);
        assert_eq!(nice_max(7.0), 10.0);
        assert_eq!(nice_max(10.0), 10.0);
        assert_eq!(nice_max(1234.0), 2000.0);
        assert_eq!(nice_max(2100.0), 2500.0);
        assert_eq!(nice_max(0.3), 0.5);
    }

    #[test]
    fn bar_chart_is_well_formed() {
        let s = bar_chart(
            "A <b>",
            "hs/s",
            &["TLS 1.3".into(), "TLS 1.2".into()],
            &[
                ("qweb".into(), vec![100.0, f64::NAN]),
                ("nginx".into(), vec![80.0, 90.0]),
            ],
        );
        assert!(s.starts_with("<svg"));
        assert!(s.trim_end().ends_with("</svg>"));
        assert!(s.contains("A &lt;b&gt;"));
        // Three bars: the NaN one is left out.
        assert_eq!(s.matches("<rect x=").count(), 3 + 2); // + 2 legend squares
    }

    #[test]
    fn line_chart_breaks_at_gaps() {
        let s = line_chart(
            "sweep",
            "ms",
            "hs/s",
            &["0".into(), "1".into(), "5".into()],
            &[("sync".into(), vec![10.0, f64::NAN, 5.0], false)],
        );
        assert_eq!(s.matches("<circle").count(), 2);
        assert_eq!(s.matches(" M").count() + s.matches("\"M").count(), 2);
    }
}
