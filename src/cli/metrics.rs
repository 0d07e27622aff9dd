//! `raidfs metrics`: every mounted array's metrics (or one's) in the
//! Prometheus text format, for node_exporter's textfile collector; the
//! names are in docs/metrics.md. `--output FILE` replaces FILE at once
//! (written beside it, then renamed), as the collector wants.

use crate::cli::status::{all_reports, connect, query};
use crate::control::metrics;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct MetricsArgs {
    /// Write to FILE (replaced atomically) instead of standard output.
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Only the array mounted here.
    pub mount_point: Option<PathBuf>,
}

pub fn run(args: MetricsArgs) -> i32 {
    let reports = match &args.mount_point {
        Some(mp) => match connect(mp).and_then(|mut c| query(&mut c)) {
            Ok(report) => vec![report],
            Err(msg) => return super::fail(msg),
        },
        None => all_reports(),
    };
    let text = metrics::render(&reports);
    let Some(path) = args.output else {
        print!("{text}");
        return 0;
    };
    // A name the collector ignores (it reads *.prom) until the rename.
    let mut tmp = path.clone().into_os_string();
    tmp.push(format!(".{}.tmp", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let written = std::fs::write(&tmp, text).and_then(|()| std::fs::rename(&tmp, &path));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return super::fail(format!("writing {}: {e}", path.display()));
    }
    0
}
