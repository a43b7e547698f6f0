//! `soft`: userspace RoCEv2 UD over ordinary UDP sockets (docs/architecture.md §2, §6).
//!
//! Runs on any Linux host without RDMA hardware or the `rdma_rxe` module, between
//! processes and hosts, and speaks the RoCEv2 wire format of [`codec`] exactly, so
//! a `soft` endpoint talks to kernel rxe and RoCE NICs.
//!
//! ## Opening a port and a QP
//! ```no_run
//! use quic_rdma::fabric::soft::{SoftConfig, SoftPort};
//! use quic_rdma::fabric::{AhAttr, UdQueuePair, DEFAULT_QKEY};
//! // One UDP socket per port, bound to a specific IP (that IP is the GID).
//! let port = SoftPort::open(SoftConfig::new("192.0.2.10".parse().unwrap()))?;
//! let mut qp = port.create_qp(DEFAULT_QKEY)?; // any number of QPs per port
//! let ah = qp.create_ah(&AhAttr::new("::ffff:192.0.2.20".parse::<std::net::Ipv6Addr>().unwrap().into(), 0))?;
//! # let _ = ah;
//! # Ok::<(), quic_rdma::fabric::FabricError>(())
//! ```
//! Peers are found with [`crate::discovery`] (GID, QPN, Q_Key, UDP port over a
//! TCP service port). [`SoftConfig`] sets the bind port (4791 by default; another port,
//! or 0, for several processes per IP — then tell senders with
//! [`SoftPort::set_peer_port`]), the active MTU (default 4096), the ICRC policy,
//! P_Key and queue depths.
//!
//! ## How it maps the hardware model
//! - **Sends** are encoded and handed to the socket inside `post_send` (the "NIC"
//!   has no queue of its own), so send completions are immediate but still obey
//!   the trait's ordering: a signaled completion retires every earlier send and
//!   its AH reference. Sends above the active MTU are dropped, completed as
//!   success and counted in `oversize_sent`, as hardware does. A socket that stays
//!   full (`EAGAIN` after a short spin) or refuses a datagram loses the packet
//!   like a wire would; [`SoftStats`] counts both. The packets of one
//!   `post_send` to one destination leave in one `sendmsg` with UDP GSO
//!   ([`SoftConfig::gso_segments`]), gathered from iovecs — each packet's
//!   headers, its payload read in place from registered memory (as a NIC's
//!   DMA would: user space never copies it) and its pad + ICRC — and the
//!   kernel cuts them into the same datagrams, numbering their IPv4 IDs 0, 1,
//!   2, …, which each packet's ICRC was computed for, so strict receivers
//!   (kernel rxe, NICs) verify them.
//! - **Receives**: the port's QPs share one socket. Whichever QP polls reads a
//!   batch (`recvmmsg`, with GRO), checks each packet in hardware order —
//!   structure, ICRC, active MTU, destination QPN, P_Key, Q_Key, a posted receive,
//!   buffer length — and parks it, matched to its QP's next posted receive, in a
//!   pooled buffer. The owning QP's `poll_recv_cq` writes the 40-byte GRH area
//!   (rebuilt with [`crate::fabric::Grh::write`]) and the payload into its
//!   registered memory; `byte_len` includes the 40 bytes. Each drop is counted by
//!   cause in [`crate::fabric::ProviderDrops`] (`unknown_qpn`, `runt`, `malformed`
//!   and `bad_icrc` are per port, the rest per QP); the key checks are the rule
//!   every provider shares ([`crate::fabric::keys`]). Datagrams the kernel
//!   dropped because the socket's receive buffer was full are read from the
//!   kernel's per-socket counter into `kernel_rx_dropped` (per port).
//!   Buffers are recycled, so the steady state allocates nothing per packet.
//! - **ICRC policy** ([`codec::IcrcPolicy`], default `SolveIpv4Id`): the receiver
//!   rebuilds the IP/UDP headers from what the socket reports (source address and
//!   port, destination address via `IP_PKTINFO`, datagram length; DF assumed). The
//!   IPv4 identification is invisible, so it tries ID 0 (what Linux puts on an
//!   unconnected `IP_PMTUDISC_PROBE` datagram, i.e. every `soft` sender — checked
//!   on the real wire by a test) and otherwise solves for the ID that kernel rxe
//!   chose, leaving 16 check bits; the QUIC AEAD authenticates every payload byte
//!   regardless. IPv6 is verified at full strength. Details in [`codec`].
//! - **ECN / traffic class**: each datagram carries the AH's whole traffic class
//!   (DSCP + ECN) through an `IP_TOS`/`IPV6_TCLASS` control message on
//!   `sendmsg` (Linux 64-bit; elsewhere quinn-udp's path carries ECN only). On
//!   receive, quinn-udp's `IP_RECVTOS`/`IPV6_RECVTCLASS` reports the **ECN bits
//!   only**, so the GRH traffic class holds ECN with DSCP 0. Hop limit and flow
//!   label are not observable through a UDP socket: the GRH reports hop limit 64
//!   and flow label 0 (kernel rxe sends flow label 0 too).
//! - **Wake-ups**: no helper thread. [`SoftPort`] (and [`SoftQp`]) implement
//!   `AsFd`/`AsRawFd`: an async adapter wraps a clone of the port in
//!   `tokio::io::unix::AsyncFd`, and on readability polls the QPs. `arm(waker)`
//!   stores the waker — woken when *another* QP of the port parks a packet for
//!   this one — and returns `true` if packets are parked, send completions wait,
//!   or a datagram is queued on the socket (`MSG_PEEK`), in which case the caller
//!   polls again before sleeping.
//! - **No `unsafe`**: socket options, batched receive and received control
//!   messages come from `quinn-udp` (already a dependency of quinn); the send
//!   control message goes through `socket2`'s safe `sendmsg`.

#![forbid(unsafe_code)]

// Public only so the attack tests, the fuzz targets and the codec bench can
// forge and parse RoCEv2 packets; hidden from the docs: not API, it may
// change with the provider.
#[doc(hidden)]
pub mod codec;
mod config;
mod demux;
mod kernel_drops;
pub mod netdev;
mod port;
mod qp;
mod tx;

pub use config::SoftConfig;
pub use port::{SoftPort, SoftStats};
pub use qp::SoftQp;
