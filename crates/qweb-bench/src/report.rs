//! Markdown tables and number formatting for the results.

/// One results table.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Table {
    /// Heading above the table.
    pub title: String,
    /// Column headers. Columns of numbers are right-aligned.
    pub headers: Vec<String>,
    /// Cells, row by row.
    pub rows: Vec<Vec<String>>,
    /// Lines printed under the table.
    pub notes: Vec<String>,
}

impl Table {
    /// A table with `title` and `headers`.
    pub fn new(title: impl Into<String>, headers: &[&str]) -> Self {
        Table {
            title: title.into(),
            headers: headers.iter().map(|h| h.to_string()).collect(),
            ..Default::default()
        }
    }

    /// Appends a row (padded or cut to the number of headers).
    pub fn row(&mut self, mut cells: Vec<String>) {
        cells.resize(self.headers.len(), String::new());
        self.rows.push(cells);
    }

    /// Whether every cell of column `i` is empty or a number-like value (right-aligned).
    fn numeric(&self, i: usize) -> bool {
        self.rows.iter().all(|r| {
            r.get(i).map_or(true, |c| {
                let v = c.trim_end_matches(['×', '%', ' ']);
                v.is_empty() || v == "—" || v.parse::<f64>().is_ok()
            })
        })
    }

    /// The table as GitHub-flavoured markdown, with its title as a level-3 heading.
    pub fn to_markdown(&self) -> String {
        let esc = |s: &str| s.replace('|', "\\|");
        let mut out = format!("### {}\n\n", self.title);
        out.push_str(&format!(
            "| {} |\n",
            self.headers
                .iter()
                .map(|h| esc(h))
                .collect::<Vec<_>>()
                .join(" | ")
        ));
        let align: Vec<&str> = (0..self.headers.len())
            .map(|i| if self.numeric(i) { "---:" } else { "---" })
            .collect();
        out.push_str(&format!("| {} |\n", align.join(" | ")));
        for r in &self.rows {
            out.push_str(&format!(
                "| {} |\n",
                r.iter().map(|c| esc(c)).collect::<Vec<_>>().join(" | ")
            ));
        }
        for n in &self.notes {
            out.push_str(&format!("\n{n}\n"));
        }
        out
    }
}

/// A number with sensible precision: integers from 100 up, one decimal from 10, two below;
/// "—" for NaN or infinite values.
pub fn num(x: f64) -> String {
    if !x.is_finite() {
        return "—".into();
    }
    let a = x.abs();
    if a >= 100.0 {
        format!("{x:.0}")
    } else if a >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    }
}

/// `x / base` as "1.85×"; "—" when either is missing or the base is zero.
pub fn ratio(x: f64, base: f64) -> String {
    if !x.is_finite() || !base.is_finite() || base == 0.0 {
        return "—".into();
    }
    format!("{:.2}×", x / base)
}

/// Microseconds as milliseconds with two decimals ("0.41").
pub fn ms(us: f64) -> String {
    if !us.is_finite() {
        return "—".into();
    }
    format!("{:.2}", us / 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_and_ratios() {
        assert_eq!(num(1234.56), "1235");
        assert_eq!(num(12.345), "12.3");
        assert_eq!(num(1.2345), "1.23");
        assert_eq!(num(f64::NAN), "—");
        assert_eq!(ratio(200.0, 100.0), "2.00×");
        assert_eq!(ratio(50.0, 200.0), "0.25×");
        assert_eq!(ratio(1.0, 0.0), "—");
        assert_eq!(ratio(f64::NAN, 1.0), "—");
        assert_eq!(ms(1500.0), "1.50");
    }

    #[test]
    fn markdown_table() {
        let mut t = Table::new("A. Handshakes", &["server", "hs/s", "vs nginx"]);
        t.row(vec!["qweb | none".into(), "100".into()]);
        t.row(vec!["1m.bin".into(), "—".into(), "1.50×".into()]);
        t.notes.push("note".into());
        assert_eq!(
            t.to_markdown(),
            "### A. Handshakes\n\n| server | hs/s | vs nginx |\n| --- | ---: | ---: |\n\
             | qweb \\| none | 100 |  |\n| 1m.bin | — | 1.50× |\n\nnote\n"
        );
    }
}
