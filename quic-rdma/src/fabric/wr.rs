//! Work requests and completions (IBA chapter 11, the verbs `ibv_send_wr`/`ibv_wc`).

use super::{AhId, Qpn, Sge, Timestamp};

/// Flags of a send work request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SendFlags {
    /// Produce a completion (`IBV_SEND_SIGNALED`). With selective signaling only
    /// every Nth send is signaled; its completion retires every earlier send.
    pub signaled: bool,
    /// Copy the payload into the WQE at post time (`IBV_SEND_INLINE`): the buffer
    /// is free as soon as `post_send` returns. Only up to the granted `max_inline`.
    pub inline: bool,
}

/// A UD send work request.
#[derive(Clone, Copy, Debug)]
pub struct SendWr {
    /// Caller's identifier, echoed in the completion.
    pub wr_id: u64,
    /// The payload.
    pub sge: Sge,
    /// The address handle (destination GID and GRH fields).
    pub ah: AhId,
    /// Destination queue pair number.
    pub remote_qpn: Qpn,
    /// Destination Q_Key.
    pub remote_qkey: u32,
    /// Immediate data (opcode SEND_ONLY_WITH_IMMEDIATE when present).
    pub imm: Option<u32>,
    /// Signaled / inline.
    pub flags: SendFlags,
}

/// A receive work request: a buffer whose first 40 bytes receive the GRH.
#[derive(Clone, Copy, Debug)]
pub struct RecvWr {
    /// Caller's identifier, echoed in the completion.
    pub wr_id: u64,
    /// The buffer (GRH area + room for an MTU-sized payload).
    pub sge: Sge,
}

/// Completion status (subset of `ibv_wc_status` a UD QP can produce).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum WcStatus {
    /// The work request completed.
    Success,
    /// Local length error: the message did not fit the receive buffer.
    LocLenErr,
    /// Local protection error: the SGE's lkey or range was not registered.
    LocProtErr,
    /// The work request was flushed because the QP entered the error state.
    WrFlushErr,
    /// A fatal error of the QP.
    GeneralErr,
}

/// What kind of work request completed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WcOpcode {
    /// A send.
    Send,
    /// A receive.
    Recv,
}

/// A work completion.
#[derive(Clone, Copy, Debug)]
pub struct Completion {
    /// The work request's identifier.
    pub wr_id: u64,
    /// Outcome.
    pub status: WcStatus,
    /// Send or receive.
    pub opcode: WcOpcode,
    /// For receives: bytes written, *including* the 40-byte GRH area.
    pub byte_len: u32,
    /// For receives: the immediate data, if the opcode carried it.
    pub imm: Option<u32>,
    /// For receives: the sender's QPN (from the DETH).
    pub src_qp: Qpn,
    /// When the packet arrived / the send left, if the QP stamps completions
    /// ([`UdQueuePair::enable_timestamps`](super::UdQueuePair::enable_timestamps)).
    pub timestamp: Option<Timestamp>,
}

impl Completion {
    /// A successful send completion.
    pub fn send(wr_id: u64) -> Self {
        Completion {
            wr_id,
            status: WcStatus::Success,
            opcode: WcOpcode::Send,
            byte_len: 0,
            imm: None,
            src_qp: 0,
            timestamp: None,
        }
    }

    /// A posted receive flushed because its QP is in the error state.
    pub fn recv_flushed(wr_id: u64) -> Self {
        Completion {
            status: WcStatus::WrFlushErr,
            opcode: WcOpcode::Recv,
            ..Completion::send(wr_id)
        }
    }
}
