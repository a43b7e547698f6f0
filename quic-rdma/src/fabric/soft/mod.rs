//! `soft`: userspace RoCEv2 UD over ordinary UDP sockets.
#![forbid(unsafe_code)]

pub mod codec;
mod port;
mod qp;

pub use port::{SoftConfig, SoftPort, SoftStats};
pub use qp::SoftQp;
