//! The results: markdown sections and tables, SVG charts, `results.md` (setup, results,
//! skipped rows, problems, every command) and `results.json`.

use super::*;

impl Runner {
    pub(super) fn section(&mut self, t: Table, chart: Option<&str>) {
        let mut s = t.to_markdown();
        if let Some(c) = chart {
            s.push_str(&format!("\n![{}]({c})\n", t.title));
        }
        self.sections.push(s);
    }

    pub(super) fn skip_section(&mut self, title: &str, why: &str) {
        self.skipped
            .push(format!("{title}: skipped: not available ({why})"));
        self.sections
            .push(format!("### {title}\n\nskipped: not available ({why})\n"));
    }

    pub(super) fn write_chart(&mut self, name: &str, svg: &str) {
        let p = self.out.join(name);
        if let Err(e) = std::fs::write(&p, svg) {
            self.failures.push(format!("write {}: {e}", p.display()));
        }
    }

    pub(super) fn write_results(&self) -> Result<()> {
        let mut md = String::new();
        md.push_str(&format!(
            "# qweb-bench results ({} profile)\n\n",
            self.profile.name
        ));
        md.push_str("## Setup\n\n");
        md.push_str(&format!("- Date (UTC): {}\n", utc_stamp(now_secs())));
        md.push_str(&format!("- Machine: {}\n", machine_summary()));
        md.push_str(&format!(
            "- Load average at the end: {}\n",
            procs::loadavg()
        ));
        md.push_str(&format!(
            "- qweb: {} ({})\n",
            command_output(&self.qweb, &["--version"])
                .unwrap_or_default()
                .trim(),
            self.qweb.display()
        ));
        md.push_str(&format!(
            "- nginx: {}\n",
            self.nginx
                .as_ref()
                .map(|n| n.version_text.clone())
                .unwrap_or_else(|| format!("not available ({})", self.nginx_missing))
        ));
        for (name, p) in [("h2o", &self.h2o), ("Caddy", &self.caddy)] {
            md.push_str(&format!(
                "- {name}: {}\n",
                match p {
                    Ok(i) => format!("{} ({})", i.version_text, i.bin.display()),
                    Err(e) => format!("not available ({e})"),
                }
            ));
        }
        md.push_str(&format!(
            "- wrk: {}; h2load: {}; strace: {}\n",
            tool_version(self.wrk.as_deref(), &["-v"]),
            tool_version(self.h2load.as_deref(), &["--version"]),
            tool_version(self.strace.as_deref(), &["-V"])
        ));
        md.push_str(&format!(
            "- Client: qweb-bench {} (tokio multi-thread, {} threads per load, rustls {} + aws-lc-rs)\n",
            env!("CARGO_PKG_VERSION"),
            crate::cpus(),
            "0.23"
        ));
        md.push_str(&format!(
            "- Workers: {} (qweb worker threads = nginx worker processes); profile: warm-up {} s, \
             {} s measured, {} interleaved round(s) per row (median reported); G: one worker \
             per server, pinned\n",
            self.workers, self.profile.warmup, self.profile.duration, self.profile.rounds
        ));
        md.push_str(&format!(
            "- Key server: {}; compression: {}\n",
            feature_note(&self.keyserver),
            feature_note(&self.compression)
        ));
        md.push_str(&format!(
            "- Command: `{}` (run took {:.0} s; workspace {})\n",
            command_line(),
            self.started.elapsed().as_secs_f64(),
            self.workspace.display()
        ));
        let git = |args: &[&str]| {
            Command::new("git")
                .arg("-C")
                .arg(&self.workspace)
                .args(args)
                .output()
                .ok()
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
                .unwrap_or_default()
        };
        md.push_str(&format!(
            "- Commit: {}{}\n\n",
            git(&["rev-parse", "--short=10", "HEAD"]),
            if git(&["status", "--porcelain", "--untracked-files=no"]).is_empty() {
                ""
            } else {
                " (with uncommitted changes)"
            }
        ));
        md.push_str("## Results\n\n");
        for s in &self.sections {
            md.push_str(s);
            md.push('\n');
        }
        if !self.skipped.is_empty() {
            md.push_str("## Skipped\n\n");
            for s in &self.skipped {
                md.push_str(&format!("- {s}\n"));
            }
            md.push('\n');
        }
        md.push_str("## Problems\n\n");
        if self.failures.is_empty() {
            md.push_str("None: every server answered, no request or handshake failed, and qweb's counters matched the client's.\n");
        } else {
            for f in &self.failures {
                md.push_str(&format!("- {f}\n"));
            }
        }
        md.push_str("\n## Commands of every run\n\n```\n");
        for m in &self.measured {
            for c in &m.commands {
                md.push_str(&format!("# {} / {}\n{c}\n", m.experiment, m.label));
            }
        }
        md.push_str("```\n");
        let p = self.out.join("results.md");
        std::fs::write(&p, md).map_err(|e| Error::path("write", &p, e))?;
        let json = serde_json::json!({
            "profile": self.profile,
            "workers": self.workers,
            "machine": machine_summary(),
            "measured": self.measured,
            "skipped": self.skipped,
            "failures": self.failures,
        });
        let p = self.out.join("results.json");
        let text = serde_json::to_string_pretty(&json)
            .map_err(|e| Error::Other(format!("serialize results: {e}")))?;
        std::fs::write(&p, text).map_err(|e| Error::path("write", &p, e))?;
        Ok(())
    }
}

/// The runner's own command line, program name shortened to `qweb-bench`.
fn command_line() -> String {
    let mut v: Vec<String> = std::env::args().skip(1).collect();
    v.insert(0, "qweb-bench".into());
    v.join(" ")
}

/// The first line of a tool's version output, or "not installed".
fn tool_version(bin: Option<&Path>, args: &[&str]) -> String {
    match bin {
        Some(b) => command_output(b, args)
            .and_then(|o| o.lines().next().map(|l| l.trim().to_string()))
            .unwrap_or_else(|| b.display().to_string()),
        None => "not installed".into(),
    }
}

/// CPU model, CPUs, memory and kernel, from /proc.
pub fn machine_summary() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
        .unwrap_or_else(|| "unknown CPU".into());
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<u64>().ok())
        })
        .map(|kib| format!("{:.1} GiB RAM", kib as f64 / 1024.0 / 1024.0))
        .unwrap_or_default();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    format!(
        "{model}, {} CPUs available, {mem}, Linux {kernel}",
        crate::cpus()
    )
}
