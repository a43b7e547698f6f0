//! Versioned configuration structs and the address type.
#![allow(non_camel_case_types)]

use std::ffi::c_char;

use quic_rdma::fabric::{Gid, UdAddr};

use crate::ptr::Versioned;

/// Accept every incoming connection.
pub const QR_ACCEPT_ALL: u32 = 0;
/// Refuse every incoming connection.
pub const QR_ACCEPT_REFUSE: u32 = 1;
/// Retry (validate the address) first, then accept.
pub const QR_ACCEPT_RETRY: u32 = 2;
/// Report `QR_EVENT_INCOMING` and let the application decide.
pub const QR_ACCEPT_MANUAL: u32 = 3;

/// A UD peer address: GID, queue pair number, Q_Key.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct qr_addr {
    /// The port's GID (an IPv6 address; IPv4-mapped for RoCEv2 over IPv4).
    pub gid: [u8; 16],
    /// Queue pair number (24 bits).
    pub qpn: u32,
    /// Q_Key.
    pub qkey: u32,
}

impl From<UdAddr> for qr_addr {
    fn from(a: UdAddr) -> Self {
        qr_addr {
            gid: a.gid.0,
            qpn: a.qpn,
            qkey: a.qkey,
        }
    }
}

impl From<qr_addr> for UdAddr {
    fn from(a: qr_addr) -> Self {
        UdAddr {
            gid: Gid(a.gid),
            qpn: a.qpn,
            qkey: a.qkey,
        }
    }
}

/// How to build a fabric (`qr_fabric_new`). Version 1.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct qr_fabric_config {
    /// `sizeof(qr_fabric_config)` as the caller knows it.
    pub struct_size: u32,
    /// Active MTU in bytes (256, 512, 1024, 2048 or 4096); 0 means 4096.
    pub mtu: u32,
    /// Provider name: "sim" (in-process fabric). NULL means "sim".
    pub provider: *const c_char,
    /// Seed of the sim's fault injection.
    pub seed: u64,
    /// sim: probability a packet is lost.
    pub loss: f64,
    /// sim: probability a packet is duplicated.
    pub duplicate: f64,
    /// sim: probability a packet is reordered.
    pub reorder: f64,
}

// SAFETY: repr(C), first field u32 struct_size, fields valid when zeroed.
unsafe impl Versioned for qr_fabric_config {
    // Every field of version 1 is needed to read it.
    const V1_SIZE: usize = size_of::<qr_fabric_config>();
}

/// How to build an engine (`qr_engine_new`). Version 1.
///
/// A server sets `cert_der`/`key_der` (its certificate and PKCS#8 key, DER);
/// a client sets `ca_der` (the root it trusts, DER). Both may be set.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct qr_engine_config {
    /// `sizeof(qr_engine_config)` as the caller knows it.
    pub struct_size: u32,
    /// One of `QR_ACCEPT_*`.
    pub accept_policy: u32,
    /// The GID of the port to open the queue pair on, as text ("fd00::1", "10.0.0.1").
    pub gid: *const c_char,
    /// The 20-bit routing key of this endpoint's connection IDs (a larger
    /// value is refused with `QR_EINVAL`, never masked).
    pub routing_key: u32,
    /// Reserved: must be zero (`QR_EINVAL` otherwise), so a later version
    /// can give it a meaning.
    pub reserved: u32,
    /// Server certificate, DER (NULL: not a server).
    pub cert_der: *const u8,
    /// Length of `cert_der`.
    pub cert_der_len: usize,
    /// Server private key, PKCS#8 DER.
    pub key_der: *const u8,
    /// Length of `key_der`.
    pub key_der_len: usize,
    /// Trusted root certificate for connecting, DER (NULL: not a client).
    pub ca_der: *const u8,
    /// Length of `ca_der`.
    pub ca_der_len: usize,
}

// SAFETY: repr(C), first field u32 struct_size, fields valid when zeroed.
unsafe impl Versioned for qr_engine_config {
    // Every field of version 1 is needed to read it.
    const V1_SIZE: usize = size_of::<qr_engine_config>();
}
