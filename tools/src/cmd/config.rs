//! `qr config check FILE`: validate a config file (`crate::config`) without
//! starting anything, naming the table, the key and the fix of each error.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::CommandFactory as _;

/// Options of `qr config`.
#[derive(Clone, Debug, clap::Args)]
pub(crate) struct ConfigArgs {
    #[command(subcommand)]
    action: Action,
}

/// What to do with a config file.
#[derive(Clone, Debug, clap::Subcommand)]
enum Action {
    /// Check every table of FILE (or only --command's): unknown tables and
    /// keys, values of the wrong type or that the option refuses, secrets,
    /// conflicting keys and missing required keys. Paths are not opened.
    ///
    /// Exit codes: 0 valid; 1 invalid; 2 bad usage or an unreadable file.
    Check(CheckArgs),
}

/// Options of `qr config check`.
#[derive(Clone, Debug, clap::Args)]
struct CheckArgs {
    /// The TOML file.
    file: PathBuf,
    /// Check only this command's table, e.g. `node-agent` or `kv-relay
    /// upstream` (also written `kv-relay.upstream`).
    #[arg(long, value_name = "NAME")]
    command: Option<String>,
}

/// Run `qr config`.
pub(crate) fn main(args: &ConfigArgs) -> ExitCode {
    let Action::Check(a) = &args.action;
    let file = a.file.display();
    let root = crate::Cli::command();
    let only = a
        .command
        .as_deref()
        .map(|c| c.split_whitespace().collect::<Vec<_>>().join("."));
    if let Some(only) = &only {
        let mut built = root.clone();
        built.build();
        let known = crate::config::table_names(&built);
        if !known.contains(only) {
            eprintln!(
                "qr config check: --command {only}: no such command reads a config file; \
                 use one of: {}",
                known.join(", ")
            );
            return ExitCode::from(2);
        }
    }
    let doc = match crate::config::read(&a.file) {
        Ok(doc) => doc,
        Err(e) if std::fs::metadata(&a.file).is_ok() => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
        Err(e) => {
            eprintln!("qr config check: {e}");
            return ExitCode::from(2);
        }
    };
    let problems = crate::config::check(root.clone(), &doc, only.as_deref());
    if problems.is_empty() {
        let tables = crate::config::tables_in(root, &doc);
        let tables: Vec<String> = tables
            .into_iter()
            .filter(|t| only.as_ref().is_none_or(|o| o == t))
            .collect();
        println!("{file}: ok (tables: {})", tables.join(", "));
        ExitCode::SUCCESS
    } else {
        for p in &problems {
            eprintln!("{file}: {p}");
        }
        eprintln!("{file}: {} error(s)", problems.len());
        ExitCode::FAILURE
    }
}
