//! `qweb-bench`: the load generator (`load`) and the experiment runner (`run`).

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use qweb_bench::load::{run_load, LoadSpec};
use qweb_bench::runner::{run, RunArgs};
use qweb_bench::zipf::{run_zipf, ZipfArgs};

/// qweb's benchmark tools: a TLS/HTTP load generator and the runner that reproduces the QWEB
/// paper's experiments with qweb, nginx, h2o and Caddy side by side.
#[derive(Parser)]
#[command(version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Generate load against one HTTPS URL and report rate, throughput, latency and errors.
    /// Exits 1 when any error was counted.
    Load {
        #[command(flatten)]
        spec: LoadSpec,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Run the experiment matrix (starts qweb, nginx, h2o and Caddy itself) and write tables and
    /// charts.
    Run(RunArgs),
    /// Hit ratios of the proxy cache's memory store, S3-FIFO against LRU, on Zipf traces with
    /// one-time keys (no server: the store itself).
    Zipf(ZipfArgs),
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Cmd::Load { spec, json } => match run_load(&spec) {
            Ok(r) => {
                if json {
                    match serde_json::to_string_pretty(&r) {
                        Ok(s) => println!("{s}"),
                        Err(e) => {
                            eprintln!("error: {e}");
                            return ExitCode::FAILURE;
                        }
                    }
                } else {
                    println!("{}", r.human());
                }
                if r.errors.total() > 0 {
                    ExitCode::FAILURE
                } else {
                    ExitCode::SUCCESS
                }
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        },
        Cmd::Zipf(args) => match run_zipf(&args) {
            Ok(table) => {
                print!("{table}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        },
        Cmd::Run(args) => match run(args) {
            Ok(_) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        },
    }
}
