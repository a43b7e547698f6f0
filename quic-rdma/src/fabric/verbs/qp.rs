//! The verbs UD queue pair: creation, state transitions, recovery.

use std::collections::VecDeque;
use std::io;
use std::ptr;
use std::sync::Arc;
use std::task::Waker;

use rdma_sys::*;
use slab::Slab;

use super::device::{mtu_from_ibv, Device, GidEntry, GidKind};
use super::notify::{NotifyShared, VerbsNotifier};
use crate::fabric::{
    check_qkey, AhAttr, AhId, AsyncEvent, Completion, FabricError, Gid, Memory, ProviderDrops,
    QpAttr, RecvWr, Region, SendWr, UdQueuePair, WcOpcode, WcStatus, DEFAULT_QKEY,
};

/// Completions polled per `ibv_poll_cq` call.
const POLL_BATCH: usize = 32;

/// How to open a [`VerbsQp`].
#[derive(Clone, Debug)]
pub struct VerbsOptions {
    /// Device name (`rxe0`, `mlx5_0`); the first device when `None`.
    pub device: Option<String>,
    /// Port number (1-based).
    pub port: u8,
    /// Source GID to use; when `None`, the first RoCE v2 GID, IPv4-mapped preferred.
    pub gid: Option<Gid>,
    /// Q_Key the QP accepts (must not be privileged).
    pub qkey: u32,
    /// P_Key table index.
    pub pkey_index: u16,
    /// Send queue depth requested.
    pub max_send_wr: u32,
    /// Receive queue depth requested.
    pub max_recv_wr: u32,
    /// Inline data requested (the device may grant more, or refuse).
    pub max_inline: u32,
}

impl Default for VerbsOptions {
    fn default() -> Self {
        VerbsOptions {
            device: None,
            port: 1,
            gid: None,
            qkey: DEFAULT_QKEY,
            pkey_index: 0,
            max_send_wr: 1024,
            max_recv_wr: 4096,
            max_inline: 64,
        }
    }
}

/// A send queue entry not yet retired by a polled completion.
struct SqEntry {
    wr_id: u64,
    ah: AhId,
}

/// Port counters at open time: drops are reported as deltas.
#[derive(Clone, Copy, Default)]
struct PortBaseline {
    bad_pkey: u32,
    qkey_viol: u32,
}

/// A UD queue pair on libibverbs (see the [module docs](super)).
pub struct VerbsQp {
    dev: Arc<Device>,
    notify: Arc<NotifyShared>,
    qp: *mut ibv_qp,
    port: u8,
    /// P_Key index the QP was brought up with (again on `recover`).
    pkey_index: u16,
    gid_index: u32,
    attr: QpAttr,
    /// Registered MRs; the region's lkey maps back to its MR for deregistration.
    mrs: Vec<*mut ibv_mr>,
    /// Address handles with their in-flight send count.
    ahs: Slab<(*mut ibv_ah, u32)>,
    sq: VecDeque<SqEntry>,
    recv_posted: usize,
    /// Completions polled by `arm`, handed out by the next `poll_*_cq`.
    send_stash: VecDeque<Completion>,
    recv_stash: VecDeque<Completion>,
    /// Async events read while recovering, other than the QP's own failure.
    events: VecDeque<AsyncEvent>,
    /// Scratch for building WR chains (no allocation per post after warm-up).
    send_wrs: Vec<ibv_send_wr>,
    recv_wrs: Vec<ibv_recv_wr>,
    sges: Vec<ibv_sge>,
    wcs: Vec<ibv_wc>,
    baseline: PortBaseline,
    oversize_sent: u64,
}

// SAFETY: the raw pointers are libibverbs objects owned by this VerbsQp; libibverbs
// is thread-safe, and `&mut self` serialises every mutation of our own state.
unsafe impl Send for VerbsQp {}

impl std::fmt::Debug for VerbsQp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsQp")
            .field("device", &self.dev.name)
            .field("port", &self.port)
            .field("gid_index", &self.gid_index)
            .field("attr", &self.attr)
            .finish()
    }
}

fn os_err(what: &str, rc: i32) -> FabricError {
    let e = if rc > 0 {
        io::Error::from_raw_os_error(rc)
    } else {
        io::Error::last_os_error()
    };
    FabricError::QpError(format!("{what}: {e}"))
}

/// A zeroed ibv_wc (plain data: integers and a union of integers).
fn zeroed_wc() -> ibv_wc {
    // SAFETY: every field of ibv_wc is an integer; all-zero is valid.
    unsafe { std::mem::zeroed() }
}

impl VerbsQp {
    /// Open a device, pick the GID, create a UD QP and move it to RTS.
    ///
    /// With no RDMA device (or no kernel RDMA support: `ibv_get_device_list`
    /// fails with `ENOSYS`) this is [`FabricError::NoDevice`], whose message
    /// names the alternatives (`soft`, `sim`, loading `rdma_rxe`).
    pub fn open(opts: &VerbsOptions) -> Result<VerbsQp, FabricError> {
        check_qkey(opts.qkey)?;
        let dev = Arc::new(Device::open(
            opts.device.as_deref(),
            opts.max_send_wr.max(1),
            opts.max_recv_wr.max(1),
        )?);
        let port = dev.query_port(opts.port)?;
        if port.state != ibv_port_state::IBV_PORT_ACTIVE {
            return Err(FabricError::QpError(format!(
                "port {} of {} is not active (state {})",
                opts.port, dev.name, port.state
            )));
        }
        let active_mtu = mtu_from_ibv(port.active_mtu).ok_or_else(|| {
            FabricError::QpError(format!("unknown active MTU enum {}", port.active_mtu))
        })?;
        let table = dev.gid_table(opts.port, port.gid_tbl_len.max(0) as u32);
        let entry = select_gid(&table, opts.gid).ok_or_else(|| match opts.gid {
            Some(g) => FabricError::QpError(format!(
                "GID {g} is not a RoCE v2 GID of {} port {} (table: {table:?})",
                dev.name, opts.port
            )),
            None => FabricError::QpError(format!(
                "{} port {} has no RoCE v2 GID (is the netdev up with an IP address?)",
                dev.name, opts.port
            )),
        })?;
        let pkey = dev.query_pkey(opts.port, opts.pkey_index).unwrap_or(0xFFFF);

        // SAFETY: ibv_qp_init_attr is plain data (pointers and integers); zero is valid.
        let mut init: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        init.send_cq = dev.send_cq;
        init.recv_cq = dev.recv_cq;
        init.qp_type = ibv_qp_type::IBV_QPT_UD;
        init.sq_sig_all = 0;
        init.cap.max_send_wr = opts.max_send_wr;
        init.cap.max_recv_wr = opts.max_recv_wr;
        init.cap.max_send_sge = 1;
        init.cap.max_recv_sge = 1;
        init.cap.max_inline_data = opts.max_inline;
        // SAFETY: valid PD; `init` outlives the call; CQs belong to the same context.
        let qp = unsafe { ibv_create_qp(dev.pd, &mut init) };
        if qp.is_null() {
            return Err(os_err("ibv_create_qp(UD)", 0));
        }
        let notify = Arc::new(NotifyShared::new(dev.clone()));
        let mut me = VerbsQp {
            dev,
            notify,
            qp,
            port: opts.port,
            pkey_index: opts.pkey_index,
            gid_index: entry.index,
            attr: QpAttr {
                // SAFETY: `qp` is valid.
                qpn: unsafe { (*qp).qp_num },
                qkey: opts.qkey,
                pkey,
                gid: entry.gid,
                active_mtu,
                max_inline: init.cap.max_inline_data,
                max_send_wr: init.cap.max_send_wr,
                max_recv_wr: init.cap.max_recv_wr,
            },
            mrs: Vec::new(),
            ahs: Slab::new(),
            sq: VecDeque::new(),
            recv_posted: 0,
            send_stash: VecDeque::new(),
            recv_stash: VecDeque::new(),
            events: VecDeque::new(),
            send_wrs: Vec::new(),
            recv_wrs: Vec::new(),
            sges: Vec::new(),
            wcs: (0..POLL_BATCH).map(|_| zeroed_wc()).collect(),
            baseline: PortBaseline {
                bad_pkey: port.bad_pkey_cntr,
                qkey_viol: port.qkey_viol_cntr,
            },
            oversize_sent: 0,
        };
        // From here on, Drop cleans up.
        me.bring_up(opts.pkey_index)?;
        me.read_back_caps()?;
        tracing::info!(device = %me.dev.name, port = me.port, gid = %me.attr.gid,
            gid_index = me.gid_index, qpn = me.attr.qpn, mtu = me.attr.active_mtu.bytes(),
            max_inline = me.attr.max_inline, "verbs UD QP ready");
        Ok(me)
    }

    fn modify(
        &mut self,
        attr: &mut ibv_qp_attr,
        mask: ibv_qp_attr_mask,
        what: &str,
    ) -> Result<(), FabricError> {
        // SAFETY: valid QP; `attr` is initialised for every bit of `mask`.
        let rc = unsafe { ibv_modify_qp(self.qp, attr, mask.0 as i32) };
        if rc != 0 {
            return Err(os_err(what, rc));
        }
        Ok(())
    }

    /// RESET → INIT (P_Key index, port, Q_Key) → RTR → RTS (SQ PSN).
    fn bring_up(&mut self, pkey_index: u16) -> Result<(), FabricError> {
        // SAFETY: ibv_qp_attr is plain data; zero is valid.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_INIT;
        a.pkey_index = pkey_index;
        a.port_num = self.port;
        a.qkey = self.attr.qkey;
        self.modify(
            &mut a,
            ibv_qp_attr_mask::IBV_QP_STATE
                | ibv_qp_attr_mask::IBV_QP_PKEY_INDEX
                | ibv_qp_attr_mask::IBV_QP_PORT
                | ibv_qp_attr_mask::IBV_QP_QKEY,
            "modify_qp(INIT)",
        )?;
        a.qp_state = ibv_qp_state::IBV_QPS_RTR;
        self.modify(&mut a, ibv_qp_attr_mask::IBV_QP_STATE, "modify_qp(RTR)")?;
        a.qp_state = ibv_qp_state::IBV_QPS_RTS;
        a.sq_psn = rand::random::<u32>() & 0xFF_FFFF;
        self.modify(
            &mut a,
            ibv_qp_attr_mask::IBV_QP_STATE | ibv_qp_attr_mask::IBV_QP_SQ_PSN,
            "modify_qp(RTS)",
        )
    }

    /// What the QP granted, from `ibv_query_qp` (the authoritative numbers).
    fn read_back_caps(&mut self) -> Result<(), FabricError> {
        // SAFETY: plain data; zero is valid.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut init: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        // SAFETY: valid QP and out-pointers.
        let rc = unsafe {
            ibv_query_qp(
                self.qp,
                &mut a,
                ibv_qp_attr_mask::IBV_QP_CAP.0 as i32,
                &mut init,
            )
        };
        if rc != 0 {
            return Err(os_err("ibv_query_qp", rc));
        }
        self.attr.max_inline = init.cap.max_inline_data;
        self.attr.max_send_wr = init.cap.max_send_wr;
        self.attr.max_recv_wr = init.cap.max_recv_wr;
        Ok(())
    }

    /// A notifier for async callers (see [`notify`](super::notify)).
    pub fn notifier(&self) -> VerbsNotifier {
        VerbsNotifier {
            shared: self.notify.clone(),
        }
    }

    /// The completion channel's fd (same as `notifier().fd()`).
    pub fn event_fd(&self) -> std::os::fd::RawFd {
        self.dev.channel_fd()
    }

    /// Device name.
    pub fn device_name(&self) -> &str {
        &self.dev.name
    }

    /// Port number.
    pub fn port(&self) -> u8 {
        self.port
    }

    /// Index of the source GID in the port's GID table.
    pub fn gid_index(&self) -> u32 {
        self.gid_index
    }

    /// The port's GID table (RoCE types included).
    pub fn gid_table(&self) -> Result<Vec<GidEntry>, FabricError> {
        let p = self.dev.query_port(self.port)?;
        Ok(self.dev.gid_table(self.port, p.gid_tbl_len.max(0) as u32))
    }

    /// Sends posted and not yet retired by a polled completion.
    pub fn sends_outstanding(&self) -> usize {
        self.sq.len()
    }

    /// Receives posted and not yet completed.
    pub fn recvs_posted(&self) -> usize {
        self.recv_posted
    }

    /// Move the QP to the error state: the device stops writing into receive
    /// buffers and flushes every outstanding WR (completions `WrFlushErr`).
    pub fn quiesce(&mut self) -> Result<(), FabricError> {
        // SAFETY: plain data; zero is valid.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_ERR;
        self.modify(&mut a, ibv_qp_attr_mask::IBV_QP_STATE, "modify_qp(ERR)")
    }

    /// The next async event of the device that concerns this QP or its port
    /// (`ibv_get_async_event` on the non-blocking async fd), acknowledged.
    fn read_async_event(&mut self) -> Option<AsyncEvent> {
        loop {
            // SAFETY: plain data; zero is valid.
            let mut ev: ibv_async_event = unsafe { std::mem::zeroed() };
            // SAFETY: valid context; its async fd is non-blocking, so this returns -1
            // (EAGAIN) when no event is pending.
            let rc = unsafe { ibv_get_async_event(self.dev.ctx, &mut ev) };
            if rc != 0 {
                return None;
            }
            let ty = ev.event_type;
            // SAFETY: the union member matches the event type class checked below.
            let (qp, port) = unsafe { (ev.element.qp, ev.element.port_num) };
            // SAFETY: each event is acknowledged once.
            unsafe { ibv_ack_async_event(&mut ev) };
            use ibv_event_type::*;
            let mapped = match ty {
                IBV_EVENT_PORT_ERR if port == i32::from(self.port) => Some(AsyncEvent::PortDown),
                IBV_EVENT_PORT_ACTIVE if port == i32::from(self.port) => {
                    Some(AsyncEvent::PortActive)
                }
                IBV_EVENT_GID_CHANGE if port == i32::from(self.port) => {
                    match self.dev.query_gid(self.port, self.gid_index) {
                        Some(g) if g != self.attr.gid && g != Gid::ZERO => {
                            self.attr.gid = g;
                            Some(AsyncEvent::GidChanged { new: g })
                        }
                        _ => None,
                    }
                }
                IBV_EVENT_QP_FATAL | IBV_EVENT_QP_REQ_ERR | IBV_EVENT_QP_ACCESS_ERR
                    if qp == self.qp =>
                {
                    Some(AsyncEvent::QpFatal)
                }
                IBV_EVENT_CQ_ERR | IBV_EVENT_DEVICE_FATAL => Some(AsyncEvent::QpFatal),
                other => {
                    tracing::debug!(event = ?other, "ignored async event");
                    None
                }
            };
            if mapped.is_some() {
                return mapped;
            }
        }
    }

    /// Discard every completion waiting in the stashes and on both CQs (the
    /// CQs are this QP's alone: each `VerbsQp` opens its own device context).
    fn discard_completions(&mut self) {
        self.send_stash.clear();
        self.recv_stash.clear();
        let mut scratch = VecDeque::new();
        for cq in [self.dev.send_cq, self.dev.recv_cq] {
            while self.poll_raw(cq, false, &mut scratch, POLL_BATCH) > 0 {
                scratch.clear();
            }
        }
    }

    /// Poll one CQ into `out`, converting completions.
    fn poll_raw(
        &mut self,
        cq: *mut ibv_cq,
        recv: bool,
        out: &mut VecDeque<Completion>,
        max: usize,
    ) -> usize {
        let want = max.min(POLL_BATCH);
        // SAFETY: valid CQ; `wcs` has POLL_BATCH initialised entries, want <= that.
        let n = unsafe { ibv_poll_cq(cq, want as i32, self.wcs.as_mut_ptr()) };
        if n < 0 {
            tracing::warn!(rc = n, recv, "ibv_poll_cq failed");
            return 0;
        }
        for wc in &self.wcs[..n as usize] {
            out.push_back(convert_wc(wc, recv));
        }
        n as usize
    }

    /// Retire send-queue entries up to and including `wr_id` (in-order completion).
    fn retire_sends(&mut self, wr_id: u64) {
        while let Some(e) = self.sq.pop_front() {
            if let Some(a) = self.ahs.get_mut(e.ah.0 as usize) {
                a.1 = a.1.saturating_sub(1);
            }
            if e.wr_id == wr_id {
                break;
            }
        }
    }

    fn region_addr(mem: &Memory, sge: &crate::fabric::Sge) -> Option<u64> {
        let r = mem.region(sge.region)?;
        let end = sge.offset as usize + sge.len as usize;
        (end <= r.len()).then(|| (r.addr() + sge.offset as usize) as u64)
    }
}

fn convert_wc(wc: &ibv_wc, recv: bool) -> Completion {
    let status = match wc.status {
        ibv_wc_status::IBV_WC_SUCCESS => WcStatus::Success,
        ibv_wc_status::IBV_WC_LOC_LEN_ERR => WcStatus::LocLenErr,
        ibv_wc_status::IBV_WC_LOC_PROT_ERR => WcStatus::LocProtErr,
        ibv_wc_status::IBV_WC_WR_FLUSH_ERR => WcStatus::WrFlushErr,
        other => {
            tracing::debug!(status = ?other, vendor_err = wc.vendor_err, recv, "work completion error");
            WcStatus::GeneralErr
        }
    };
    let with_imm = (wc.wc_flags & ibv_wc_flags::IBV_WC_WITH_IMM.0) != 0;
    Completion {
        wr_id: wc.wr_id,
        status,
        opcode: if recv { WcOpcode::Recv } else { WcOpcode::Send },
        byte_len: if recv { wc.byte_len } else { 0 },
        // SAFETY: the union's imm_data member is valid when WITH_IMM is set.
        imm: (recv && with_imm)
            .then(|| u32::from_be(unsafe { wc.imm_data_invalidated_rkey_union.imm_data })),
        src_qp: if recv { wc.src_qp & 0xFF_FFFF } else { 0 },
    }
}

/// The GID to use: `want` if it is a RoCE v2 entry; else the first RoCE v2 GID,
/// IPv4-mapped first (RoCEv2 over IPv4 is what most fabrics route), then global
/// IPv6, then link-local.
pub fn select_gid(table: &[GidEntry], want: Option<Gid>) -> Option<GidEntry> {
    let v2 = table.iter().filter(|e| e.kind == GidKind::RoceV2);
    if let Some(w) = want {
        return v2.clone().find(|e| e.gid == w).copied();
    }
    let rank = |e: &&GidEntry| {
        if e.gid.is_ipv4() {
            0
        } else if e.gid.0[0] == 0xfe && e.gid.0[1] & 0xc0 == 0x80 {
            2
        } else {
            1
        }
    };
    v2.min_by_key(|e| (rank(e), e.index)).copied()
}

impl UdQueuePair for VerbsQp {
    fn attr(&self) -> &QpAttr {
        &self.attr
    }

    fn register(&mut self, region: &mut Region) -> Result<(), FabricError> {
        let access = ibv_access_flags::IBV_ACCESS_LOCAL_WRITE;
        // SAFETY: the region's memory is `len` valid bytes that never move (boxed
        // slice); the caller keeps it alive while the MR and any WR use it (see the
        // `verbs` module docs on drop order).
        let mr = unsafe {
            ibv_reg_mr(
                self.dev.pd,
                region.addr() as *mut std::ffi::c_void,
                region.len().max(1),
                access.0 as i32,
            )
        };
        if mr.is_null() {
            return Err(FabricError::Registration(format!(
                "ibv_reg_mr({} bytes): {}",
                region.len(),
                io::Error::last_os_error()
            )));
        }
        self.mrs.push(mr);
        // SAFETY: `mr` is valid.
        region.set_lkey(Some(unsafe { (*mr).lkey }));
        Ok(())
    }

    fn create_ah(&mut self, attr: &AhAttr) -> Result<AhId, FabricError> {
        // SAFETY: ibv_ah_attr is plain data; zero is valid.
        let mut a: ibv_ah_attr = unsafe { std::mem::zeroed() };
        a.is_global = 1;
        a.port_num = self.port;
        a.grh.dgid = ibv_gid { raw: attr.dgid.0 };
        a.grh.sgid_index = self.gid_index as u8;
        a.grh.flow_label = attr.flow_label & 0xF_FFFF;
        a.grh.hop_limit = attr.hop_limit;
        a.grh.traffic_class = attr.traffic_class;
        // SAFETY: valid PD; `a` is fully initialised.
        let ah = unsafe { ibv_create_ah(self.dev.pd, &mut a) };
        if ah.is_null() {
            let e = io::Error::last_os_error();
            return Err(match e.raw_os_error() {
                Some(libc::ENETUNREACH) | Some(libc::EHOSTUNREACH) => {
                    FabricError::Unreachable(attr.dgid)
                }
                _ => FabricError::QpError(format!("ibv_create_ah({}): {e}", attr.dgid)),
            });
        }
        Ok(AhId(self.ahs.insert((ah, 0)) as u32))
    }

    fn destroy_ah(&mut self, ah: AhId) -> Result<(), FabricError> {
        match self.ahs.get(ah.0 as usize) {
            None => Err(FabricError::InvalidAh(ah.0)),
            Some((_, inflight)) if *inflight > 0 => Err(FabricError::AhBusy(ah.0)),
            Some(_) => {
                let (p, _) = self.ahs.remove(ah.0 as usize);
                // SAFETY: `p` was created by ibv_create_ah and no WR in flight uses it.
                let rc = unsafe { ibv_destroy_ah(p) };
                if rc != 0 {
                    return Err(os_err("ibv_destroy_ah", rc));
                }
                Ok(())
            }
        }
    }

    fn post_send(&mut self, mem: &Memory, wrs: &[SendWr]) -> Result<(), (usize, FabricError)> {
        if wrs.is_empty() {
            return Ok(());
        }
        let room = (self.attr.max_send_wr as usize).saturating_sub(self.sq.len());
        // Validate first and post at most what fits: a chain is one doorbell.
        let mut take = 0;
        let mut failure = None;
        self.sges.clear();
        for wr in wrs {
            if take >= room {
                failure = Some(FabricError::QueueFull(self.sq.len()));
                break;
            }
            let Some(&(ah, _)) = self.ahs.get(wr.ah.0 as usize) else {
                failure = Some(FabricError::InvalidAh(wr.ah.0));
                break;
            };
            let _ = ah;
            if wr.flags.inline && wr.sge.len > self.attr.max_inline {
                failure = Some(FabricError::QpError(format!(
                    "inline send of {} bytes exceeds the granted max_inline_data {}",
                    wr.sge.len, self.attr.max_inline
                )));
                break;
            }
            // The library reads inline data (and the device non-inline data) at this
            // address: it must lie inside a region of `mem`.
            let Some(addr) = Self::region_addr(mem, &wr.sge) else {
                failure = Some(FabricError::QpError(format!(
                    "send buffer {:?} outside its region",
                    wr.sge
                )));
                break;
            };
            if wr.sge.len as usize > self.attr.active_mtu.bytes() {
                // The device drops it silently and completes it as success.
                self.oversize_sent += 1;
            }
            self.sges.push(ibv_sge {
                addr,
                length: wr.sge.len,
                lkey: wr.sge.lkey,
            });
            take += 1;
        }
        if take > 0 {
            self.send_wrs.clear();
            for (i, wr) in wrs[..take].iter().enumerate() {
                let ah = self.ahs[wr.ah.0 as usize].0;
                let mut flags = 0u32;
                if wr.flags.signaled {
                    flags |= ibv_send_flags::IBV_SEND_SIGNALED.0;
                }
                if wr.flags.inline {
                    flags |= ibv_send_flags::IBV_SEND_INLINE.0;
                }
                // SAFETY: ibv_send_wr is plain data (pointers, integers, unions of
                // those); zero is valid and every used field is set below.
                let mut w: ibv_send_wr = unsafe { std::mem::zeroed() };
                w.wr_id = wr.wr_id;
                w.sg_list = &mut self.sges[i];
                w.num_sge = 1;
                w.send_flags = flags;
                match wr.imm {
                    Some(imm) => {
                        w.opcode = ibv_wr_opcode::IBV_WR_SEND_WITH_IMM;
                        w.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
                    }
                    None => w.opcode = ibv_wr_opcode::IBV_WR_SEND,
                }
                w.wr.ud = ud_t {
                    ah,
                    remote_qpn: wr.remote_qpn,
                    remote_qkey: wr.remote_qkey,
                };
                self.send_wrs.push(w);
            }
            // Chain after the Vec stopped growing, so the pointers stay valid.
            for i in 0..take - 1 {
                let next: *mut ibv_send_wr = &mut self.send_wrs[i + 1];
                self.send_wrs[i].next = next;
            }
            self.send_wrs[take - 1].next = ptr::null_mut();
            let mut bad: *mut ibv_send_wr = ptr::null_mut();
            // SAFETY: the chain and its SGEs live in `self` for the call; SGE
            // addresses were checked against `mem`'s regions; AHs are live.
            let rc = unsafe { ibv_post_send(self.qp, self.send_wrs.as_mut_ptr(), &mut bad) };
            let posted = if rc == 0 {
                take
            } else {
                // SAFETY: on failure `bad` points into our chain.
                let idx = unsafe { bad.offset_from(self.send_wrs.as_ptr()) };
                let idx = usize::try_from(idx).unwrap_or(0).min(take);
                failure = Some(os_err("ibv_post_send", rc));
                idx
            };
            for wr in &wrs[..posted] {
                if let Some(a) = self.ahs.get_mut(wr.ah.0 as usize) {
                    a.1 += 1;
                }
                self.sq.push_back(SqEntry {
                    wr_id: wr.wr_id,
                    ah: wr.ah,
                });
            }
            if let Some(e) = failure {
                return Err((posted, e));
            }
            return Ok(());
        }
        match failure {
            Some(e) => Err((0, e)),
            None => Ok(()),
        }
    }

    fn post_recv(&mut self, mem: &Memory, wrs: &[RecvWr]) -> Result<(), (usize, FabricError)> {
        if wrs.is_empty() {
            return Ok(());
        }
        let room = (self.attr.max_recv_wr as usize).saturating_sub(self.recv_posted);
        let mut failure = None;
        self.sges.clear();
        for wr in wrs {
            if self.sges.len() >= room {
                failure = Some(FabricError::QueueFull(self.recv_posted));
                break;
            }
            // The device writes here: it must lie inside a registered region of `mem`.
            let ok = mem.resolve(&wr.sge).is_some();
            let Some(addr) = Self::region_addr(mem, &wr.sge).filter(|_| ok) else {
                failure = Some(FabricError::QpError(format!(
                    "receive buffer {:?} not registered",
                    wr.sge
                )));
                break;
            };
            self.sges.push(ibv_sge {
                addr,
                length: wr.sge.len,
                lkey: wr.sge.lkey,
            });
        }
        let take = self.sges.len();
        if take == 0 {
            return Err((0, failure.expect("nothing taken means a failure")));
        }
        self.recv_wrs.clear();
        for (i, wr) in wrs[..take].iter().enumerate() {
            self.recv_wrs.push(ibv_recv_wr {
                wr_id: wr.wr_id,
                next: ptr::null_mut(),
                sg_list: &mut self.sges[i],
                num_sge: 1,
            });
        }
        for i in 0..take - 1 {
            let next: *mut ibv_recv_wr = &mut self.recv_wrs[i + 1];
            self.recv_wrs[i].next = next;
        }
        let mut bad: *mut ibv_recv_wr = ptr::null_mut();
        // SAFETY: the chain and SGEs live in `self` for the call; buffers lie in
        // registered regions that outlive the QP (`verbs` module docs).
        let rc = unsafe { ibv_post_recv(self.qp, self.recv_wrs.as_mut_ptr(), &mut bad) };
        let posted = if rc == 0 {
            take
        } else {
            // SAFETY: on failure `bad` points into our chain.
            let idx = unsafe { bad.offset_from(self.recv_wrs.as_ptr()) };
            failure = Some(os_err("ibv_post_recv", rc));
            usize::try_from(idx).unwrap_or(0).min(take)
        };
        self.recv_posted += posted;
        match failure {
            Some(e) => Err((posted, e)),
            None => Ok(()),
        }
    }

    fn poll_send_cq(&mut self, out: &mut [Completion]) -> usize {
        let mut stash = std::mem::take(&mut self.send_stash);
        if stash.len() < out.len() {
            let cq = self.dev.send_cq;
            let want = out.len() - stash.len();
            self.poll_raw(cq, false, &mut stash, want);
        }
        let n = stash.len().min(out.len());
        for (slot, c) in out.iter_mut().zip(stash.drain(..n)) {
            self.retire_sends(c.wr_id);
            *slot = c;
        }
        self.send_stash = stash;
        n
    }

    fn poll_recv_cq(&mut self, _mem: &mut Memory, out: &mut [Completion]) -> usize {
        let mut stash = std::mem::take(&mut self.recv_stash);
        if stash.len() < out.len() {
            let cq = self.dev.recv_cq;
            let want = out.len() - stash.len();
            self.poll_raw(cq, true, &mut stash, want);
        }
        let n = stash.len().min(out.len());
        for (slot, c) in out.iter_mut().zip(stash.drain(..n)) {
            *slot = c;
        }
        self.recv_posted -= n.min(self.recv_posted);
        self.recv_stash = stash;
        n
    }

    fn arm(&mut self, waker: &Waker) -> bool {
        self.notify.store(waker);
        // SAFETY: valid CQs of this device.
        let rc = unsafe {
            ibv_req_notify_cq(self.dev.send_cq, 0) | ibv_req_notify_cq(self.dev.recv_cq, 0)
        };
        if rc != 0 {
            tracing::warn!(rc, "ibv_req_notify_cq failed");
            return true;
        }
        // Completions that arrived before the CQs were armed raise no event: look.
        if self.send_stash.is_empty() {
            let cq = self.dev.send_cq;
            let mut s = std::mem::take(&mut self.send_stash);
            self.poll_raw(cq, false, &mut s, POLL_BATCH);
            self.send_stash = s;
        }
        if self.recv_stash.is_empty() {
            let cq = self.dev.recv_cq;
            let mut s = std::mem::take(&mut self.recv_stash);
            self.poll_raw(cq, true, &mut s, POLL_BATCH);
            self.recv_stash = s;
        }
        !self.send_stash.is_empty() || !self.recv_stash.is_empty()
    }

    fn poll_event(&mut self) -> Option<AsyncEvent> {
        if let Some(ev) = self.events.pop_front() {
            return Some(ev);
        }
        self.read_async_event()
    }

    /// Error → Reset (the device forgets every outstanding WR) → Init → RTR →
    /// RTS with the original P_Key index, port and Q_Key; the QPN is unchanged.
    fn recover(&mut self) -> Result<(), FabricError> {
        // SAFETY: plain data; zero is valid.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_RESET;
        self.modify(&mut a, ibv_qp_attr_mask::IBV_QP_STATE, "modify_qp(RESET)")?;
        self.discard_completions();
        for (_, (_, inflight)) in self.ahs.iter_mut() {
            *inflight = 0;
        }
        self.sq.clear();
        self.recv_posted = 0;
        // A failure reported before the reset was about the QP just reset: drop
        // it, or it would reset the recovered QP again. Keep every other event.
        while let Some(ev) = self.read_async_event() {
            if ev != AsyncEvent::QpFatal {
                self.events.push_back(ev);
            }
        }
        self.bring_up(self.pkey_index)?;
        tracing::info!(
            qpn = self.attr.qpn,
            "verbs UD QP recovered from the error state"
        );
        Ok(())
    }

    fn drops(&self) -> ProviderDrops {
        let mut d = ProviderDrops {
            oversize_sent: self.oversize_sent,
            ..ProviderDrops::default()
        };
        // Port-wide counters (every QP of the port), as deltas since open.
        if let Ok(p) = self.dev.query_port(self.port) {
            d.bad_pkey = u64::from(p.bad_pkey_cntr.wrapping_sub(self.baseline.bad_pkey));
            d.bad_qkey = u64::from(p.qkey_viol_cntr.wrapping_sub(self.baseline.qkey_viol));
        }
        d
    }
}

impl Drop for VerbsQp {
    fn drop(&mut self) {
        // SAFETY: every object is ours and destroyed once: the QP first (no more DMA,
        // no WR references AHs or MRs), then AHs and MRs; the Device (CQs, channel,
        // PD, context) goes when the last Arc does.
        unsafe {
            ibv_destroy_qp(self.qp);
            for (ah, _) in self.ahs.drain() {
                ibv_destroy_ah(ah);
            }
            for mr in self.mrs.drain(..) {
                ibv_dereg_mr(mr);
            }
        }
        self.notify.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(index: u32, gid: &str, kind: GidKind) -> GidEntry {
        GidEntry {
            index,
            gid: gid.parse::<std::net::Ipv6Addr>().unwrap().into(),
            kind,
        }
    }

    #[test]
    fn gid_selection_prefers_v2_ipv4_mapped() {
        let t = [
            entry(0, "fe80::200:ff:fe00:0", GidKind::RoceV2),
            entry(1, "::ffff:127.0.0.1", GidKind::RoceV1OrIb),
            entry(2, "::ffff:127.0.0.1", GidKind::RoceV2),
            entry(3, "::1", GidKind::RoceV2),
        ];
        assert_eq!(select_gid(&t, None).unwrap().index, 2);
        assert_eq!(select_gid(&t[..1], None).unwrap().index, 0);
        assert_eq!(select_gid(&[t[0], t[3]], None).unwrap().index, 3);
        let want = "::1".parse::<std::net::Ipv6Addr>().unwrap().into();
        assert_eq!(select_gid(&t, Some(want)).unwrap().index, 3);
        assert!(select_gid(&t[..2], Some(want)).is_none());
    }

    /// On a machine without RDMA (this project's hosts and CI), opening fails with
    /// a clear NoDevice error naming the alternatives. In the rxe guest a device
    /// exists, so the test checks the other outcome there.
    #[test]
    fn open_without_device_is_no_device() {
        match VerbsQp::open(&VerbsOptions::default()) {
            Err(e @ FabricError::NoDevice { .. }) => {
                let msg = e.to_string();
                eprintln!("{msg}");
                assert!(msg.contains("no RDMA device"), "{msg}");
                assert!(msg.contains("--provider soft"), "{msg}");
                assert!(msg.contains("rdma_rxe"), "{msg}");
            }
            Err(other) => panic!("expected NoDevice, got {other}"),
            Ok(qp) => {
                assert!(std::path::Path::new("/sys/class/infiniband").exists());
                assert!(qp.attr().qpn > 0);
            }
        }
    }
}
