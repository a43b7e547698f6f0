//! `qr completions SHELL` and `qr man`: shell completions and manual pages,
//! generated from the same clap definitions that parse the command line, so
//! they never drift from it.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::CommandFactory as _;

/// Options of `qr completions`.
#[derive(Clone, Debug, clap::Args)]
pub(crate) struct CompletionsArgs {
    /// The shell to complete for.
    shell: clap_complete::Shell,
}

/// Options of `qr man`.
#[derive(Clone, Debug, clap::Args)]
pub(crate) struct ManArgs {
    /// Write qr.1 and one page per subcommand (qr-SUBCOMMAND.1, …) into this
    /// directory; without it, print qr.1 on stdout.
    #[arg(long)]
    dir: Option<PathBuf>,
}

/// Print the completion script for `args.shell` on stdout.
pub(crate) fn completions(args: &CompletionsArgs) -> ExitCode {
    let mut cmd = crate::Cli::command();
    // Into memory first: clap_complete panics on a write error, and a reader
    // that closes the pipe early (`| head`) is no reason to.
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut cmd, "qr", &mut script);
    match std::io::stdout().write_all(&script) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("qr completions: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Write the manual pages.
pub(crate) fn man(args: &ManArgs) -> ExitCode {
    let cmd = crate::Cli::command();
    let result = match &args.dir {
        None => {
            let mut out = Vec::new();
            clap_mangen::Man::new(cmd)
                .render(&mut out)
                .and_then(|()| std::io::stdout().write_all(&out))
        }
        Some(dir) => std::fs::create_dir_all(dir).and_then(|()| write_pages(&cmd, "qr", dir)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("qr man: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `name.1` for `cmd`, then a page per subcommand (`name-sub.1`), recursively.
fn write_pages(cmd: &clap::Command, name: &str, dir: &std::path::Path) -> std::io::Result<()> {
    let mut out = Vec::new();
    clap_mangen::Man::new(cmd.clone())
        .title(name.to_string())
        .render(&mut out)?;
    std::fs::write(dir.join(format!("{name}.1")), out)?;
    for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
        write_pages(sub, &format!("{name}-{}", sub.get_name()), dir)?;
    }
    Ok(())
}
