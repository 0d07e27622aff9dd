//! Man pages and shell completions, generated from the clap definitions so
//! they cannot drift from the command line: `raidfs generate-man DIR` and
//! `raidfs completions SHELL`, hidden, which `make install` runs.

use std::path::PathBuf;

use clap::CommandFactory;

#[derive(clap::Args)]
pub struct ManArgs {
    /// Directory for raidfs.8 and one raidfs-COMMAND.8 per subcommand.
    pub dir: PathBuf,
}

#[derive(clap::Args)]
pub struct CompletionsArgs {
    /// bash, zsh, fish, elvish or powershell.
    pub shell: clap_complete::Shell,
}

/// The man pages' section: raidfs administers storage, as mdadm(8) does.
const SECTION: &str = "8";

pub fn run_man(args: ManArgs) -> i32 {
    match write_man_pages(&args.dir) {
        Ok(written) => {
            for path in written {
                println!("{}", path.display());
            }
            0
        }
        Err(msg) => super::fail(msg),
    }
}

fn write_man_pages(dir: &std::path::Path) -> Result<Vec<PathBuf>, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut cmd = super::Cli::command().disable_help_subcommand(true);
    // Gives each subcommand its display name, `raidfs-mount`.
    cmd.build();
    let pages = std::iter::once(cmd.clone())
        .chain(cmd.get_subcommands().filter(|s| !s.is_hide_set()).cloned());
    let mut written = Vec::new();
    for page in pages {
        let man = clap_mangen::Man::new(page)
            .section(SECTION)
            .manual("System Administration")
            .source(format!("raidfs {}", env!("CARGO_PKG_VERSION")));
        let path = man
            .generate_to(dir)
            .map_err(|e| format!("writing a man page in {}: {e}", dir.display()))?;
        written.push(path);
    }
    Ok(written)
}

pub fn run_completions(args: CompletionsArgs) -> i32 {
    use std::io::Write;
    let mut cmd = super::Cli::command();
    // Into memory first: clap_complete panics on a failed write (a closed pipe).
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut cmd, "raidfs", &mut script);
    match std::io::stdout().write_all(&script) {
        Ok(()) => 0,
        Err(e) => super::fail(format!("writing the completion script: {e}")),
    }
}
