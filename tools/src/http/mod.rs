//! The one HTTP stack of `qr`: hyper, HTTP/1.1, behind [`crate::listener`]'s
//! connection cap and timeouts. The node agent's OCI API serves through
//! [`serve`]; every `/metrics` (and the KV relay's `/status`) through
//! [`serve_pages`].

mod access_log;
mod pages;
mod server;

pub use access_log::{AccessLog, Remote};

pub use pages::{serve_pages, Access, Page, METRICS_CONTENT_TYPE};
pub use server::{full, serve, Body};
