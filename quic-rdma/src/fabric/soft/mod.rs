//! `soft`: userspace RoCEv2 UD over ordinary UDP sockets.
#![forbid(unsafe_code)]

pub mod codec;
