//! Config files: the options of a long-running command (`qr serve`, the
//! agents, the KV relays, the gateway) in a TOML file given by `--config FILE`.
//!
//! A file holds one table per command, named as on the command line
//! (`[serve]`, `[node-agent]`, `[kv-relay.upstream]`, `[gateway.to-fabric]`);
//! its keys are the command's long option names, exactly as the flags. The
//! set of keys, their arity and their value parsers come from clap's
//! [`Command`] (whatever command has a `--config` option has a table), so a
//! new flag works in a config file without touching this module.
//!
//! - A string or integer is `--key value`; `true` is `--key`, `false`
//!   nothing; an array repeats the flag.
//! - Precedence: file < environment (`env = "QR_..."`) < command line. A key
//!   the command line (or the environment) sets is not taken from the file;
//!   for a repeatable option the command line's list replaces the file's.
//! - Secrets (options read from the environment with hidden values: a KV
//!   password) are refused in a file: the fix names their `*-file` option
//!   and their environment variable.
//! - The global `--log-format` stays on the command line.
//!
//! [`apply`] rewrites a command line with its file's options (inserted right
//! after the subcommand path, so the derive parser sees one command line);
//! [`check`] validates a whole file for `qr config check`.

use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::parser::ValueSource;
use clap::{Arg, ArgAction, Command};

/// The id (and long name) of the `--config` option.
const OPTION: &str = "config";

/// `--config FILE`, for every command that reads a config file: declared
/// on its options struct as `#[command(arg(crate::config::option()))]`.
///
/// Read from the raw command line by [`apply`] before the derive parser
/// runs (the parsed command never needs it), so it is no field of the struct.
pub(crate) fn option() -> Arg {
    Arg::new(OPTION)
        .long(OPTION)
        .value_name("FILE")
        .value_parser(clap::value_parser!(PathBuf))
        .help(
            "Read options from this TOML file's table for this command (e.g. [node-agent], \
             [kv-relay.upstream]; keys are the long option names). Options on the command \
             line (and QR_* environment variables) override the file's. Check it with `qr \
             config check FILE`",
        )
}

/// One error in a config file: where, what and how to fix it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Problem {
    /// The table, as written in the file (`kv-relay.upstream`); empty for
    /// the file as a whole.
    pub(crate) table: String,
    /// The key, if the problem is one key's.
    pub(crate) key: Option<String>,
    /// What is wrong.
    pub(crate) problem: String,
    /// What to do about it.
    pub(crate) fix: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.table.is_empty() {
            write!(f, "[{}] ", self.table)?;
        }
        if let Some(key) = &self.key {
            write!(f, "key \"{key}\": ")?;
        }
        write!(f, "{}; fix: {}", self.problem, self.fix)
    }
}

/// The shape a key's value must have, from the option's clap action.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// A flag: `true` or `false`.
    Flag,
    /// One value: a string or a number.
    Single,
    /// A repeatable option: an array (or one value).
    Many,
}

/// A command that reads a config file: its path from the root
/// (`["kv-relay", "upstream"]`) and its clap definition.
struct Leaf<'a> {
    path: Vec<String>,
    cmd: &'a Command,
}

impl Leaf<'_> {
    /// The table name: the path joined with dots.
    fn table(&self) -> String {
        self.path.join(".")
    }

    /// `qr kv-relay upstream`.
    fn usage(&self) -> String {
        format!("qr {}", self.path.join(" "))
    }

    /// The option a key names (its long name or an alias), if any may be
    /// put in a file (not positional, not global, not help or `--config`).
    fn option(&self, key: &str) -> Option<&Arg> {
        self.cmd.get_arguments().find(|a| {
            configurable(a)
                && (a.get_long() == Some(key)
                    || a.get_all_aliases().is_some_and(|v| v.contains(&key)))
        })
    }

    /// The keys a file may use here (long names).
    fn keys(&self) -> Vec<&str> {
        self.cmd
            .get_arguments()
            .filter(|a| configurable(a))
            .filter_map(Arg::get_long)
            .collect()
    }
}

fn configurable(a: &Arg) -> bool {
    a.get_long().is_some()
        && a.get_id() != OPTION
        && !a.is_global_set()
        && !matches!(
            a.get_action(),
            ArgAction::Help | ArgAction::HelpShort | ArgAction::HelpLong | ArgAction::Version
        )
}

fn kind(a: &Arg) -> Kind {
    match a.get_action() {
        ArgAction::SetTrue | ArgAction::SetFalse | ArgAction::Count => Kind::Flag,
        ArgAction::Append => Kind::Many,
        _ => Kind::Single,
    }
}

/// A secret: read from the environment with its value hidden from `--help`.
fn is_secret(a: &Arg) -> bool {
    a.get_env().is_some() && a.is_hide_env_values_set()
}

/// Every command with a `--config` option, depth first.
fn leaves(root: &Command) -> Vec<Leaf<'_>> {
    fn walk<'a>(cmd: &'a Command, path: &mut Vec<String>, out: &mut Vec<Leaf<'a>>) {
        for sub in cmd.get_subcommands() {
            path.push(sub.get_name().to_string());
            if sub.get_arguments().any(|a| a.get_id() == OPTION) {
                out.push(Leaf {
                    path: path.clone(),
                    cmd: sub,
                });
            }
            walk(sub, path, out);
            path.pop();
        }
    }
    let mut out = Vec::new();
    walk(root, &mut Vec::new(), &mut out);
    out
}

/// The table names a file may have, for `root` (built).
pub(crate) fn table_names(root: &Command) -> Vec<String> {
    leaves(root).iter().map(Leaf::table).collect()
}

/// `root` with its global options propagated and help options added, as the
/// parser sees it.
fn built(mut root: Command) -> Command {
    root.build();
    root
}

fn type_name(v: &toml::Value) -> &'static str {
    match v {
        toml::Value::String(_) => "a string",
        toml::Value::Integer(_) => "an integer",
        toml::Value::Float(_) => "a float",
        toml::Value::Boolean(_) => "a boolean",
        toml::Value::Datetime(_) => "a date-time",
        toml::Value::Array(_) => "an array",
        toml::Value::Table(_) => "a table",
    }
}

fn scalar(v: &toml::Value) -> Option<String> {
    match v {
        toml::Value::String(s) => Some(s.clone()),
        toml::Value::Integer(i) => Some(i.to_string()),
        toml::Value::Float(f) => Some(f.to_string()),
        _ => None,
    }
}

/// The command-line words a key's value stands for (`--key=value`, once per
/// value), or what is wrong with its type.
fn words(long: &str, kind: Kind, v: &toml::Value) -> Result<Vec<String>, (String, String)> {
    let flag = format!("--{long}");
    let one = |v: &toml::Value| {
        scalar(v).ok_or_else(|| {
            (
                format!(
                    "wrong type: --{long} takes a string or a number, found {}",
                    type_name(v)
                ),
                format!(
                    "write {long} = \"VALUE\" (quote it: {long} = \"true\" if you mean the word)"
                ),
            )
        })
    };
    match (kind, v) {
        (Kind::Flag, toml::Value::Boolean(true)) => Ok(vec![flag]),
        (Kind::Flag, toml::Value::Boolean(false)) => Ok(Vec::new()),
        (Kind::Flag, other) => Err((
            format!("wrong type: --{long} is a flag, found {}", type_name(other)),
            format!("write {long} = true (or false, or leave the key out)"),
        )),
        (Kind::Single, toml::Value::Array(_)) => Err((
            format!("wrong type: --{long} takes one value, found an array"),
            format!("give one value: {long} = \"VALUE\""),
        )),
        (Kind::Single, v) => Ok(vec![format!("{flag}={}", one(v)?)]),
        (Kind::Many, toml::Value::Array(items)) => items
            .iter()
            .map(|v| Ok(format!("{flag}={}", one(v)?)))
            .collect(),
        (Kind::Many, v) => Ok(vec![format!("{flag}={}", one(v)?)]),
    }
}

/// Run `arg`'s own value parser on one value; clap's message if it refuses.
fn validate(arg: &Arg, long: &str, value: &str) -> Result<(), String> {
    // A command of the option alone (its relations to others are for
    // `check_together`), under a fixed name that the message then replaces.
    let mut probe = Arg::new("value")
        .long("value")
        .action(ArgAction::Set)
        .value_parser(arg.get_value_parser().clone());
    if let Some(names) = arg.get_value_names() {
        probe = probe.value_names(names.iter().cloned());
    }
    Command::new("qr")
        .arg(probe)
        .try_get_matches_from([OsString::from("qr"), format!("--value={value}").into()])
        .map(drop)
        .map_err(|e| clap_message(&e).replace("'--value", &format!("'--{long}")))
}

/// A clap error as one line: without `error: `, the usage and the help hint.
fn clap_message(e: &clap::Error) -> String {
    e.to_string()
        .lines()
        .map(str::trim)
        .filter(|l| {
            !l.is_empty() && !l.starts_with("Usage:") && !l.starts_with("For more information")
        })
        .map(|l| l.strip_prefix("error: ").unwrap_or(l))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The nearest key to a misspelt one, if it is near enough to be a likely
/// typo.
fn nearest<'a>(key: &str, keys: &[&'a str]) -> Option<&'a str> {
    keys.iter()
        .map(|k| (strsim::damerau_levenshtein(key, k), *k))
        .filter(|&(d, k)| d <= 3.max(k.len() / 3))
        .min()
        .map(|(_, k)| k)
}

/// For each key of a table, the option's id and the command-line words the
/// key stands for.
type Words = Vec<(String, Vec<String>)>;

/// The per-key checks of one command's table (known key, not a secret, TOML
/// type, the option's own value parser): the words of the keys that pass,
/// and a problem for each that does not.
fn check_keys(leaf: &Leaf<'_>, table: &toml::Table, root: &Command) -> (Words, Vec<Problem>) {
    let name = leaf.table();
    let problem = |key: &str, problem: String, fix: String| Problem {
        table: name.clone(),
        key: Some(key.to_string()),
        problem,
        fix,
    };
    let mut words_of = Vec::new();
    let mut problems = Vec::new();
    for (key, value) in table {
        let Some(arg) = leaf.option(key) else {
            let global = root
                .get_arguments()
                .find(|a| a.is_global_set() && a.get_long() == Some(key.as_str()));
            let (what, fix) = if global.is_some() {
                (
                    format!("--{key} is a global option of qr"),
                    format!(
                        "give it on the command line: qr --{key} VALUE {}",
                        leaf.path.join(" ")
                    ),
                )
            } else if key == OPTION {
                (
                    "a config file cannot name another".to_string(),
                    "remove the key".to_string(),
                )
            } else {
                let fix = match nearest(key, &leaf.keys()) {
                    Some(k) => format!("did you mean \"{k}\"? (keys: `{} --help`)", leaf.usage()),
                    None => format!(
                        "remove it; the keys are the long options of `{} --help`",
                        leaf.usage()
                    ),
                };
                (format!("unknown key: {} has no --{key}", leaf.usage()), fix)
            };
            problems.push(problem(key, what, fix));
            continue;
        };
        let long = arg.get_long().unwrap_or(key);
        if is_secret(arg) {
            let env = arg.get_env().unwrap_or_default().to_string_lossy();
            let file_key = format!("{long}-file");
            let fix = if leaf.option(&file_key).is_some() {
                format!("put it in a file (first line) and set {file_key} = \"/path\", or set {env} in the environment")
            } else {
                format!("set {env} in the environment")
            };
            problems.push(problem(
                key,
                "a secret does not belong in a config file".to_string(),
                fix,
            ));
            continue;
        }
        let w = match words(long, kind(arg), value) {
            Ok(w) => w,
            Err((what, fix)) => {
                problems.push(problem(key, what, fix));
                continue;
            }
        };
        let mut ok = true;
        for word in &w {
            if let Some((_, v)) = word.split_once('=') {
                if let Err(e) = validate(arg, long, v) {
                    let possible: Vec<String> = arg
                        .get_possible_values()
                        .iter()
                        .map(|p| p.get_name().to_string())
                        .collect();
                    let fix = if possible.is_empty() {
                        format!("give a value --{long} takes (`{} --help`)", leaf.usage())
                    } else {
                        format!("use one of: {}", possible.join(", "))
                    };
                    problems.push(problem(key, e, fix));
                    ok = false;
                }
            }
        }
        if ok {
            words_of.push((arg.get_id().to_string(), w));
        }
    }
    (words_of, problems)
}

/// The table of `path` in a parsed file, if it has one.
fn find_table<'t>(doc: &'t toml::Table, path: &[String]) -> Option<&'t toml::Table> {
    let mut t = doc;
    for p in path {
        t = t.get(p)?.as_table()?;
    }
    Some(t)
}

/// Read and parse a config file.
pub(crate) fn read(file: &Path) -> Result<toml::Table, String> {
    let text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
    text.parse::<toml::Table>().map_err(|e| {
        format!(
            "{}: not valid TOML: {}",
            file.display(),
            e.to_string().trim_end()
        )
    })
}

/// The option names (`--ip <IP>` → `ip`) of a clap error's context.
fn context_keys(e: &clap::Error, kind: ContextKind) -> Vec<String> {
    let names: Vec<String> = match e.get(kind) {
        Some(ContextValue::String(s)) => vec![s.clone()],
        Some(ContextValue::Strings(v)) => v.clone(),
        _ => Vec::new(),
    };
    names
        .iter()
        .filter_map(|n| n.strip_prefix("--"))
        .map(|n| n.split([' ', '=']).next().unwrap_or(n).to_string())
        .collect()
}

/// What clap says about a table's options all together (conflicting keys,
/// missing required keys), mapped to key names. `bad`: keys already
/// reported, not to be reported missing too.
fn check_together(
    leaf: &Leaf<'_>,
    root: &Command,
    mut words: Words,
    bad: &[String],
) -> Vec<Problem> {
    let table = leaf.table();
    let at = |key: Option<String>, problem: String, fix: String| Problem {
        table: table.clone(),
        key,
        problem,
        fix,
    };
    let mut problems = Vec::new();
    // clap reports one error at a time: drop a conflicting key and ask again.
    for _ in 0..=words.len() {
        let mut argv: Vec<String> = vec!["qr".to_string()];
        argv.extend(leaf.path.iter().cloned());
        argv.extend(words.iter().flat_map(|(_, w)| w.iter().cloned()));
        let Err(e) = root.clone().try_get_matches_from(&argv) else {
            break;
        };
        match e.kind() {
            ErrorKind::MissingRequiredArgument => {
                problems.extend(
                    context_keys(&e, ContextKind::InvalidArg)
                        .into_iter()
                        .filter(|k| !bad.contains(k))
                        .map(|k| {
                            at(
                                Some(k.clone()),
                                format!("missing: {} needs --{k}", leaf.usage()),
                                format!("add {k} = ... to [{table}]"),
                            )
                        }),
                );
                break;
            }
            ErrorKind::ArgumentConflict => {
                let key = context_keys(&e, ContextKind::InvalidArg)
                    .into_iter()
                    .next()
                    .unwrap_or_default();
                let others = context_keys(&e, ContextKind::PriorArg).join("\", \"");
                problems.push(at(
                    Some(key.clone()),
                    clap_message(&e),
                    format!("keep only one of \"{key}\" and \"{others}\""),
                ));
                let before = words.len();
                words.retain(|(_, w)| {
                    !w.iter().any(|w| {
                        w.strip_prefix("--").and_then(|w| w.split('=').next()) == Some(&key)
                    })
                });
                if words.len() == before {
                    break;
                }
            }
            _ => {
                problems.push(at(
                    None,
                    clap_message(&e),
                    format!("see `{} --help`", leaf.usage()),
                ));
                break;
            }
        }
    }
    problems
}

/// The tables and keys of a file that name no command with a config file
/// (`path`: the table being walked).
fn unknown_tables(
    t: &toml::Table,
    path: &mut Vec<String>,
    leaves: &[Leaf<'_>],
    known: &str,
    out: &mut Vec<Problem>,
) {
    for (k, v) in t {
        let parent = path.join(".");
        path.push(k.clone());
        let name = path.join(".");
        let below: Vec<String> = leaves
            .iter()
            .map(Leaf::table)
            .filter(|l| l.starts_with(&format!("{name}.")))
            .collect();
        let is_leaf = leaves.iter().any(|l| l.table() == name);
        match v.as_table() {
            Some(_) if is_leaf => {}
            Some(sub) if !below.is_empty() => unknown_tables(sub, path, leaves, known, out),
            Some(_) => out.push(Problem {
                table: name,
                key: None,
                problem: "unknown table: no `qr` command reads it".to_string(),
                fix: format!("use one of {known}"),
            }),
            None if parent.is_empty() => out.push(Problem {
                table: String::new(),
                key: Some(k.clone()),
                problem: "a key outside any table".to_string(),
                fix: format!("put it in a command's table: {known}"),
            }),
            None => out.push(Problem {
                table: parent.clone(),
                key: Some(k.clone()),
                problem: format!("[{parent}] takes no options itself"),
                fix: format!(
                    "put options in its subcommands' tables: {}",
                    leaves
                        .iter()
                        .map(Leaf::table)
                        .filter(|l| l.starts_with(&format!("{parent}.")))
                        .map(|l| format!("[{l}]"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            }),
        }
        path.pop();
    }
}

/// Every problem of a parsed file (every table, or only `only`, a table
/// name like `kv-relay.upstream`), for `qr config check`: unknown tables and
/// keys, wrong types, values the options refuse, secrets, and what clap says
/// of each table as a whole (a missing required key, conflicting keys).
/// `root` is `qr`'s clap command.
pub(crate) fn check(root: Command, doc: &toml::Table, only: Option<&str>) -> Vec<Problem> {
    let root = built(root);
    let leaves = leaves(&root);
    let known = || {
        leaves
            .iter()
            .map(|l| format!("[{}]", l.table()))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut problems = Vec::new();
    if only.is_none() {
        unknown_tables(doc, &mut Vec::new(), &leaves, &known(), &mut problems);
    }
    for leaf in &leaves {
        let name = leaf.table();
        if only.is_some_and(|o| o != name) {
            continue;
        }
        let Some(table) = find_table(doc, &leaf.path) else {
            if only.is_some() {
                problems.push(Problem {
                    table: name.clone(),
                    key: None,
                    problem: "the file has no such table".to_string(),
                    fix: format!("add a [{name}] table"),
                });
            }
            continue;
        };
        let (words, mut p) = check_keys(leaf, table, &root);
        let bad: Vec<String> = p.iter().filter_map(|p| p.key.clone()).collect();
        problems.append(&mut p);
        problems.extend(check_together(leaf, &root, words, &bad));
    }
    problems
}

/// The tables a file holds that commands read (for `qr config check`'s
/// `ok` line).
pub(crate) fn tables_in(root: Command, doc: &toml::Table) -> Vec<String> {
    let root = built(root);
    leaves(&root)
        .iter()
        .filter(|l| find_table(doc, &l.path).is_some())
        .map(Leaf::table)
        .collect()
}

/// The command line `argv` (with the program name) with the options of its
/// `--config` file, if its command has one: each key the command line and
/// the environment do not set becomes `--key=value` words right after the
/// subcommand path. `root` is `qr`'s clap command. An unreadable file, a
/// missing table or a bad key is an error naming the file, the table, the
/// key and the fix; a command line clap cannot make sense of is returned
/// unchanged for the parser to report.
pub(crate) fn apply(root: Command, argv: Vec<OsString>) -> Result<Vec<OsString>, String> {
    // Ignoring errors is a global setting: set before building, so that it
    // reaches the subcommands' subcommands.
    let partial = built(root.clone().ignore_errors(true));
    let root = built(root);
    let Ok(pre) = partial.try_get_matches_from(&argv) else {
        return Ok(argv);
    };
    let (mut m, mut cmd, mut path) = (&pre, &root, Vec::new());
    while let Some((name, sub)) = m.subcommand() {
        let Some(c) = cmd.find_subcommand(name) else {
            return Ok(argv);
        };
        path.push(name.to_string());
        (m, cmd) = (sub, c);
    }
    if !cmd.get_arguments().any(|a| a.get_id() == OPTION) {
        return Ok(argv);
    }
    let Some(file) = m.get_raw(OPTION).and_then(|mut v| v.next()) else {
        return Ok(argv);
    };
    let file = PathBuf::from(file);
    let shown = file.display();
    let doc = read(&file).map_err(|e| format!("--config {e}"))?;
    let leaf = Leaf { path, cmd };
    let Some(table) = find_table(&doc, &leaf.path) else {
        let has = tables_in(root.clone(), &doc);
        return Err(format!(
            "--config {shown}: no [{}] table for `{}` (the file has: {}); fix: add one, or \
             give the right file",
            leaf.table(),
            leaf.usage(),
            if has.is_empty() {
                "none".to_string()
            } else {
                has.iter()
                    .map(|t| format!("[{t}]"))
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        ));
    };
    let (words, problems) = check_keys(&leaf, table, &root);
    if !problems.is_empty() {
        return Err(problems
            .iter()
            .map(|p| format!("--config {shown}: {p}"))
            .collect::<Vec<_>>()
            .join("\n"));
    }
    let extra: Vec<OsString> = words
        .into_iter()
        .filter(|(id, _)| {
            !matches!(
                m.value_source(id),
                Some(ValueSource::CommandLine | ValueSource::EnvVariable)
            )
        })
        .flat_map(|(_, w)| w)
        .map(OsString::from)
        .collect();
    // Right after the subcommand path: the words naming each subcommand, in
    // order (only global options come before them).
    let mut at = 1;
    for name in &leaf.path {
        match argv[at..].iter().position(|a| a == name.as_str()) {
            Some(i) => at += i + 1,
            None => return Ok(argv),
        }
    }
    let mut out = argv;
    out.splice(at..at, extra);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};

    /// A small `qr`: a leaf, a command with sides, a secret with its file.
    #[derive(Debug, Parser)]
    #[command(name = "qr")]
    struct Cli {
        #[arg(long, global = true, default_value = "text")]
        log_format: String,
        #[command(subcommand)]
        cmd: Sub,
    }

    #[derive(Debug, clap::Subcommand)]
    enum Sub {
        Serve(Serve),
        Relay {
            #[command(subcommand)]
            side: Side,
        },
        /// Reads no config file.
        Demo,
    }

    #[derive(Debug, clap::Args)]
    #[command(arg(option()))]
    struct Serve {
        #[arg(long)]
        ip: std::net::IpAddr,
        #[arg(long, default_value_t = 7000)]
        port: u16,
        #[arg(long)]
        json: bool,
        #[arg(long = "name")]
        names: Vec<String>,
        #[arg(long, value_parser = ["soft", "sim"], default_value = "soft")]
        provider: String,
    }

    #[derive(Debug, clap::Subcommand)]
    enum Side {
        Up(Up),
    }

    #[derive(Debug, clap::Args)]
    #[command(arg(option()))]
    struct Up {
        #[arg(
            long,
            required_unless_present = "sentinel",
            conflicts_with = "sentinel"
        )]
        master: Vec<String>,
        #[arg(long)]
        sentinel: Vec<String>,
        #[arg(long, env = "QR_TEST_CONFIG_PASSWORD", hide_env_values = true)]
        password: Option<String>,
        #[arg(long)]
        password_file: Option<PathBuf>,
        #[arg(long, env = "QR_TEST_CONFIG_USER")]
        user: Option<String>,
    }

    fn doc(s: &str) -> toml::Table {
        s.parse().unwrap()
    }

    fn file(dir: &tempfile::TempDir, text: &str) -> PathBuf {
        let f = dir.path().join("qr.toml");
        std::fs::write(&f, text).unwrap();
        f
    }

    fn applied(argv: &[&str]) -> Result<Vec<String>, String> {
        apply(Cli::command(), argv.iter().map(OsString::from).collect())
            .map(|v| v.into_iter().map(|s| s.into_string().unwrap()).collect())
    }

    #[test]
    fn tables_come_from_the_commands_with_config() {
        assert_eq!(table_names(&built(Cli::command())), ["serve", "relay.up"]);
        assert_eq!(
            tables_in(Cli::command(), &doc("[relay.up]\nmaster = ['a:1']\n")),
            ["relay.up"]
        );
    }

    #[test]
    fn types_map_to_words() {
        let w = |k, v: &str| words("k", k, &doc(&format!("v = {v}"))["v"]);
        assert_eq!(w(Kind::Flag, "true").unwrap(), ["--k"]);
        assert!(w(Kind::Flag, "false").unwrap().is_empty());
        assert!(w(Kind::Flag, "\"yes\"")
            .unwrap_err()
            .0
            .contains("is a flag"));
        assert_eq!(w(Kind::Single, "\"a b\"").unwrap(), ["--k=a b"]);
        assert_eq!(w(Kind::Single, "42").unwrap(), ["--k=42"]);
        assert!(w(Kind::Single, "[1]").unwrap_err().0.contains("one value"));
        assert!(w(Kind::Single, "true")
            .unwrap_err()
            .0
            .contains("found a boolean"));
        assert!(w(Kind::Single, "{ a = 1 }")
            .unwrap_err()
            .0
            .contains("a table"));
        assert_eq!(w(Kind::Many, "['a', 2]").unwrap(), ["--k=a", "--k=2"]);
        assert_eq!(w(Kind::Many, "'a'").unwrap(), ["--k=a"]);
        assert!(w(Kind::Many, "[true]").unwrap_err().0.contains("boolean"));
    }

    #[test]
    fn file_fills_in_and_the_command_line_wins() {
        let dir = tempfile::tempdir().unwrap();
        let f = file(
            &dir,
            "[serve]\nip = '127.0.0.1'\nport = 7100\njson = true\nname = ['a', 'b']\n\
             [relay.up]\nmaster = ['m:1']\nuser = 'file'\n",
        );
        let f = f.to_str().unwrap();
        let argv = applied(&["qr", "--log-format", "json", "serve", "--config", f]).unwrap();
        assert_eq!(&argv[..4], ["qr", "--log-format", "json", "serve"]);
        let cli = Cli::try_parse_from(&argv).unwrap();
        let Sub::Serve(s) = cli.cmd else { panic!() };
        assert_eq!((s.port, s.json), (7100, true));
        assert_eq!(s.names, ["a", "b"]);
        assert_eq!(cli.log_format, "json");
        // Single values, lists and `--key=value` spellings on the command line win.
        let argv = applied(&["qr", "serve", "--config", f, "--port=7200", "--name", "c"]).unwrap();
        let Sub::Serve(s) = Cli::try_parse_from(&argv).unwrap().cmd else {
            panic!()
        };
        assert_eq!((s.port, &s.names[..]), (7200, &["c".to_string()][..]));
        assert_eq!(s.ip.to_string(), "127.0.0.1");
        // The environment beats the file, the command line beats both.
        std::env::set_var("QR_TEST_CONFIG_USER", "env");
        let up = |extra: &[&str]| {
            let mut a = vec!["qr", "relay", "up", "--config", f];
            a.extend(extra);
            let Sub::Relay { side: Side::Up(u) } =
                Cli::try_parse_from(applied(&a).unwrap()).unwrap().cmd
            else {
                panic!()
            };
            u
        };
        assert_eq!(up(&[]).user.as_deref(), Some("env"));
        assert_eq!(up(&["--user", "cli"]).user.as_deref(), Some("cli"));
        std::env::remove_var("QR_TEST_CONFIG_USER");
        assert_eq!(up(&[]).user.as_deref(), Some("file"));
        assert_eq!(up(&[]).master, ["m:1"]);
        // Without --config, or on a command without it, nothing changes.
        assert_eq!(applied(&["qr", "demo"]).unwrap(), ["qr", "demo"]);
        assert_eq!(
            applied(&["qr", "serve", "--ip", "::1"]).unwrap(),
            ["qr", "serve", "--ip", "::1"]
        );
    }

    #[test]
    fn apply_refuses_a_missing_table_and_bad_keys() {
        let dir = tempfile::tempdir().unwrap();
        let f = file(&dir, "[relay.up]\nmaster = ['m:1']\n");
        let e = applied(&["qr", "serve", "--config", f.to_str().unwrap()]).unwrap_err();
        assert!(
            e.contains("no [serve] table") && e.contains("[relay.up]"),
            "{e}"
        );
        let f = file(&dir, "[serve]\nip = '127.0.0.1'\nprot = 1\njson = 'yes'\n");
        let e = applied(&["qr", "serve", "--config", f.to_str().unwrap()]).unwrap_err();
        assert!(
            e.contains("[serve] key \"prot\"") && e.contains("did you mean \"port\""),
            "{e}"
        );
        assert!(e.contains("[serve] key \"json\""), "{e}");
        let e = applied(&["qr", "serve", "--config", "/nonexistent/qr.toml"]).unwrap_err();
        assert!(e.contains("/nonexistent/qr.toml"), "{e}");
    }

    #[test]
    fn unknown_keys_get_the_nearest_suggestion() {
        let keys = ["cache-max-bytes", "cache-dir", "metrics", "ip"];
        assert_eq!(nearest("cache-max-byte", &keys), Some("cache-max-bytes"));
        assert_eq!(nearest("metrcis", &keys), Some("metrics"));
        assert_eq!(nearest("cachedir", &keys), Some("cache-dir"));
        assert_eq!(nearest("upstream-credentials", &keys), None);
    }

    #[test]
    fn secrets_are_refused_with_their_fix() {
        let p = check(
            Cli::command(),
            &doc("[relay.up]\nmaster = ['m:1']\npassword = 'hunter2'\n"),
            None,
        );
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(p[0].key.as_deref(), Some("password"));
        assert!(p[0].fix.contains("password-file") && p[0].fix.contains("QR_TEST_CONFIG_PASSWORD"));
        assert!(!p[0].to_string().contains("hunter2"));
        // The real KV relay's passwords, and their file options.
        let real = check(
            crate::Cli::command(),
            &doc(
                "[kv-relay.upstream]\nip = '10.0.0.1'\nmaster = ['m:6379']\nservice-port = 7000\n\
                 dir = '/var/lib/x'\ncert = 'c'\nkey = 'k'\nca = 'a'\nmaster-password = 'x'\n\
                 sentinel-password = 'y'\n",
            ),
            None,
        );
        let keys: Vec<_> = real.iter().filter_map(|p| p.key.as_deref()).collect();
        assert_eq!(keys, ["master-password", "sentinel-password"], "{real:?}");
        assert!(real[0].fix.contains("master-password-file"), "{real:?}");
        assert!(real[0].fix.contains("QR_KV_MASTER_PASSWORD"), "{real:?}");
    }

    #[test]
    fn check_reports_every_problem() {
        let p = check(
            Cli::command(),
            &doc(
                "stray = 1\n[serve]\nport = 'x'\nprovider = 'verbs'\nlog-format = 'json'\n\
                 [relay.up]\nmaster = ['a:1']\nsentinel = ['b:2']\n[relay.down]\nx = 1\n\
                 [nothing]\n",
            ),
            None,
        );
        let lines: Vec<String> = p.iter().map(ToString::to_string).collect();
        let has = |s: &str| lines.iter().any(|l| l.contains(s));
        assert!(has("key \"stray\": a key outside any table"), "{lines:#?}");
        assert!(has("[relay.down] unknown table"), "{lines:#?}");
        assert!(has("[nothing] unknown table"), "{lines:#?}");
        assert!(has("[serve] key \"port\": invalid value 'x'"), "{lines:#?}");
        assert!(
            has("[serve] key \"provider\": invalid value 'verbs'") && has("use one of: soft, sim")
        );
        assert!(
            has("[serve] key \"log-format\": --log-format is a global option"),
            "{lines:#?}"
        );
        assert!(has("[serve] key \"ip\": missing"), "{lines:#?}");
        assert!(
            has("[relay.up] key \"master\"") || has("[relay.up] key \"sentinel\""),
            "{lines:#?}"
        );
        assert_eq!(lines.len(), 8, "{lines:#?}");
        // Only one table.
        let p = check(
            Cli::command(),
            &doc("[serve]\nip = '::1'\n[nothing]\n"),
            Some("serve"),
        );
        assert!(p.is_empty(), "{p:?}");
        let p = check(
            Cli::command(),
            &doc("[serve]\nip = '::1'\n"),
            Some("relay.up"),
        );
        assert_eq!(p[0].problem, "the file has no such table");
    }
}
