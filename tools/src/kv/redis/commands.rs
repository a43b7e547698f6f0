//! The commands the downstream relay's Redis port answers besides the
//! replication handshake (`AUTH`, `REPLCONF`, `PSYNC`, in `downstream`), so
//! that redis-cli, monitoring tools and people can look at it as at a Redis
//! master: `PING`, `ECHO`, `ROLE`, `INFO`, `CLIENT SETNAME|GETNAME|LIST|ID|
//! INFO|SETINFO`, `COMMAND` (no command table: an empty one) and `QUIT`.
//! Anything else, and any inline command (RESP spec, "Inline commands": a
//! line typed in telnet), is answered `-ERR` and counted
//! (`commands_refused`), and the connection stays open, as Redis keeps it
//! open after an unknown command.

use std::fmt::Write as _;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use super::clients::{Client, Clients, Registration};
use super::history::History;
use super::info::{self, Server, View};
use super::reply::{printable, Reply};
use super::resp::Command;
use crate::kv::metrics::Metrics;

/// What the port knows to answer with.
#[derive(Debug)]
pub struct Port {
    /// The process.
    pub server: Server,
    /// Its connections.
    pub clients: Arc<Clients>,
    /// The replication history it serves.
    pub history: Arc<History>,
    /// The relay's counters.
    pub metrics: Arc<Metrics>,
}

/// A command's answer, and whether the connection closes after it (`QUIT`).
#[derive(Debug, PartialEq, Eq)]
pub struct Answer {
    /// The reply.
    pub reply: Reply,
    /// Close the connection once the reply is written.
    pub close: bool,
}

impl Port {
    fn view<'a>(&'a self, clients: &'a [Client]) -> View<'a> {
        View {
            server: &self.server,
            clients,
            ids: self.history.get(),
            metrics: &self.metrics,
        }
    }

    fn refuse(&self, text: &str) -> Answer {
        self.metrics.commands_refused.fetch_add(1, Relaxed);
        Answer {
            reply: Reply::err(text),
            close: false,
        }
    }

    /// Answer `cmd` from connection `me` (a command with arguments that is
    /// not part of the replication handshake).
    pub fn answer(&self, me: &Registration, cmd: &Command) -> Answer {
        if cmd.inline {
            return self.refuse(
                "inline commands are not served by this replication relay; \
                 send RESP arrays (as redis-cli does)",
            );
        }
        let name = cmd.arg_lower(0).unwrap_or_default();
        let arity = |n: u64| -> Result<(), Answer> {
            if cmd.argc == n {
                Ok(())
            } else {
                Err(self.refuse(&format!("wrong number of arguments for '{name}' command")))
            }
        };
        let reply = match name.as_str() {
            "ping" => match cmd.argc {
                1 => Reply::Simple("PONG".into()),
                2 => match &cmd.args[1] {
                    Some(b) => Reply::bulk(b.to_vec()),
                    None => return self.refuse("argument too long for this relay"),
                },
                _ => return self.refuse("wrong number of arguments for 'ping' command"),
            },
            "echo" => {
                if let Err(a) = arity(2) {
                    return a;
                }
                match &cmd.args[1] {
                    Some(b) => Reply::bulk(b.to_vec()),
                    None => return self.refuse("argument too long for this relay"),
                }
            }
            "role" => {
                let clients = self.clients.list();
                info::role(&self.view(&clients))
            }
            "info" => {
                let clients = self.clients.list();
                let sections: Vec<String> =
                    (1..cmd.args.len()).filter_map(|i| cmd.arg(i)).collect();
                Reply::bulk(info::info(&self.view(&clients), &sections))
            }
            "client" => return self.client(me, cmd),
            "command" => match cmd.arg_lower(1).as_deref() {
                Some("count") => Reply::Int(0),
                _ => Reply::Array(Vec::new()),
            },
            "quit" => {
                return Answer {
                    reply: Reply::ok(),
                    close: true,
                }
            }
            _ => {
                return self.refuse(&format!(
                    "unknown command '{}', with args beginning with: (a replication relay \
                     serves PING, ECHO, ROLE, INFO, CLIENT, COMMAND, QUIT and replication)",
                    printable(&name, 64)
                ))
            }
        };
        Answer {
            reply,
            close: false,
        }
    }

    fn client(&self, me: &Registration, cmd: &Command) -> Answer {
        let sub = cmd.arg_lower(1).unwrap_or_default();
        let reply = match (sub.as_str(), cmd.argc) {
            ("setname", 3) => {
                let Some(name) = cmd.arg(2) else {
                    return self.refuse("argument too long for this relay");
                };
                // Redis allows printable ASCII without spaces (`validateClientName`).
                if !name.bytes().all(|b| (b'!'..=b'~').contains(&b)) {
                    return self.refuse(
                        "Client names cannot contain spaces, newlines or special characters.",
                    );
                }
                me.update(|c| c.name = (!name.is_empty()).then_some(name));
                Reply::ok()
            }
            ("getname", 2) => Reply::Bulk(me.get().and_then(|c| c.name).map(String::into_bytes)),
            ("id", 2) => Reply::Int(me.id() as i64),
            ("list", 2) => {
                let mut text = String::new();
                for c in self.clients.list() {
                    text.push_str(&list_line(&c));
                }
                Reply::bulk(text)
            }
            ("info", 2) => Reply::bulk(me.get().map(|c| list_line(&c)).unwrap_or_default()),
            // Client libraries announce themselves this way and ignore errors;
            // there is nothing to keep.
            ("setinfo", 4) => Reply::ok(),
            _ => {
                return self.refuse(&format!(
                    "unknown subcommand or wrong number of arguments for '{}'. Try CLIENT HELP.",
                    printable(&sub, 64)
                ))
            }
        };
        Answer {
            reply,
            close: false,
        }
    }
}

/// One `CLIENT LIST` line (Redis's field names; those the relay has no
/// value for are left out). `flags=S` marks a replica, as on a Redis master.
fn list_line(c: &Client) -> String {
    let mut s = String::new();
    let addr = |a: Option<std::net::SocketAddr>| a.map_or_else(|| "?".into(), |a| a.to_string());
    let _ = writeln!(
        s,
        "id={} addr={} laddr={} name={} age={} idle={} flags={} db=0 cmd={}",
        c.id,
        addr(c.addr),
        addr(c.laddr),
        c.name.as_deref().unwrap_or(""),
        c.since.elapsed().as_secs(),
        c.active.elapsed().as_secs(),
        if c.replica.is_some() { "S" } else { "N" },
        c.last_cmd,
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::redis::resp::{encode_command, Parser};

    fn port() -> Port {
        Port {
            server: Server::new(6380, 16),
            clients: Arc::default(),
            history: Arc::default(),
            metrics: Arc::default(),
        }
    }

    fn ask(p: &Port, me: &Registration, wire: &[u8]) -> Answer {
        let mut out = Vec::new();
        Parser::for_clients().feed(wire, &mut out).unwrap();
        p.answer(me, &out[0])
    }

    #[test]
    fn answers_what_tools_ask_and_refuses_the_rest_politely() {
        let p = port();
        let me = p.clients.register(7, None, None);
        let a = ask(&p, &me, &encode_command(&[b"PING"]));
        assert_eq!(a.reply, Reply::Simple("PONG".into()));
        let a = ask(&p, &me, &encode_command(&[b"echo", b"hi"]));
        assert_eq!(a.reply, Reply::bulk("hi"));
        let a = ask(&p, &me, &encode_command(&[b"CLIENT", b"SETNAME", b"mon"]));
        assert_eq!(a.reply, Reply::ok());
        let a = ask(&p, &me, &encode_command(&[b"CLIENT", b"GETNAME"]));
        assert_eq!(a.reply, Reply::bulk("mon"));
        let Reply::Bulk(Some(list)) = ask(&p, &me, &encode_command(&[b"CLIENT", b"LIST"])).reply
        else {
            panic!()
        };
        assert!(String::from_utf8(list).unwrap().starts_with("id=7 "));
        assert_eq!(p.metrics.commands_refused.load(Relaxed), 0);
        for wire in [
            b"PING\r\n".to_vec(),
            encode_command(&[b"FLUSHALL"]),
            encode_command(&[b"CLIENT", b"SETNAME", b"has space"]),
            encode_command(&[b"CLIENT", b"KILL", b"x"]),
            encode_command(&[b"ECHO"]),
        ] {
            let a = ask(&p, &me, &wire);
            assert!(
                matches!(a.reply, Reply::Error(ref e) if e.starts_with("ERR ")),
                "{a:?}"
            );
            assert!(!a.close);
        }
        assert_eq!(p.metrics.commands_refused.load(Relaxed), 5);
        assert!(ask(&p, &me, &encode_command(&[b"QUIT"])).close);
    }
}
