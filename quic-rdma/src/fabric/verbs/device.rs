//! Device discovery and the device-wide verbs objects: context, protection domain,
//! completion channel and the two completion queues.
//!
//! [`Device`] is shared (`Arc`) between the [`VerbsQp`](super::VerbsQp) and its
//! [`VerbsNotifier`](super::VerbsNotifier), so the completion channel and CQs stay
//! alive as long as anyone can still read events from them.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::ptr;

use rdma_sys::*;

use crate::fabric::{FabricError, Gid, Mtu};

/// An RDMA device as `ibv_get_device_list` lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Kernel name (`rxe0`, `mlx5_0`, ...).
    pub name: String,
    /// Node GUID (host byte order).
    pub guid: u64,
}

/// A GID table entry of a port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GidEntry {
    /// Index in the port's GID table (the `sgid_index` of address handles).
    pub index: u32,
    /// The GID.
    pub gid: Gid,
    /// The GID's type as the kernel reports it, if readable.
    pub kind: GidKind,
}

/// RoCE GID types (`/sys/class/infiniband/<dev>/ports/<p>/gid_attrs/types/<i>`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GidKind {
    /// RoCE v2 (UDP/IP encapsulation): what quic-rdma speaks.
    RoceV2,
    /// RoCE v1 / InfiniBand.
    RoceV1OrIb,
    /// The kernel did not say.
    Unknown,
}

/// What `ibv_get_device_list` returned, without opening anything.
///
/// A machine without kernel RDMA support (no `ib_uverbs`, so no
/// `/sys/class/infiniband_verbs`) makes libibverbs return NULL with `ENOSYS`;
/// that, and an empty list, are [`FabricError::NoDevice`].
pub fn list_devices() -> Result<Vec<DeviceInfo>, FabricError> {
    let mut n: i32 = 0;
    // SAFETY: `n` is a valid out-pointer; the returned list is freed below.
    let list = unsafe { ibv_get_device_list(&mut n) };
    if list.is_null() {
        let err = io::Error::last_os_error();
        let detail = match err.raw_os_error() {
            Some(libc::ENOSYS) => format!(
                "ibv_get_device_list: {err}: the kernel has no RDMA support (module ib_uverbs not loaded)"
            ),
            _ => format!("ibv_get_device_list failed: {err}"),
        };
        return Err(FabricError::NoDevice { detail });
    }
    let mut out = Vec::new();
    for i in 0..n.max(0) as usize {
        // SAFETY: `list` holds `n` valid device pointers until ibv_free_device_list.
        let dev = unsafe { *list.add(i) };
        if dev.is_null() {
            break;
        }
        // SAFETY: `dev` is a valid ibv_device; its name is a NUL-terminated C string.
        let name = unsafe { CStr::from_ptr(ibv_get_device_name(dev)) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: as above.
        let guid = u64::from_be(unsafe { ibv_get_device_guid(dev) });
        out.push(DeviceInfo { name, guid });
    }
    // SAFETY: `list` came from ibv_get_device_list and is freed exactly once.
    unsafe { ibv_free_device_list(list) };
    if out.is_empty() {
        return Err(FabricError::NoDevice {
            detail: "ibv_get_device_list returned no devices".into(),
        });
    }
    Ok(out)
}

/// The device-wide objects (see the module docs). Destroyed in reverse order of
/// creation when the last owner drops it; every QP, MR and AH made from it must be
/// gone by then (the [`VerbsQp`](super::VerbsQp) destroys its own before dropping
/// its reference).
pub(crate) struct Device {
    pub(crate) name: String,
    pub(crate) ctx: *mut ibv_context,
    pub(crate) pd: *mut ibv_pd,
    pub(crate) channel: *mut ibv_comp_channel,
    pub(crate) send_cq: *mut ibv_cq,
    pub(crate) recv_cq: *mut ibv_cq,
    /// An epoll set of the completion channel's fd and the async-event fd:
    /// readable when either is (see [`Device::readiness_fd`]).
    readiness: Option<OwnedFd>,
}

// SAFETY: libibverbs objects may be used from any thread (the library and its
// providers lock internally); the pointers are only freed in Drop, once.
unsafe impl Send for Device {}
// SAFETY: as above; shared use is limited to thread-safe calls (ibv_get_cq_event,
// ibv_ack_cq_events, ibv_req_notify_cq, ibv_poll_cq on distinct owners).
unsafe impl Sync for Device {}

fn last_err(what: &str) -> FabricError {
    FabricError::QpError(format!("{what}: {}", io::Error::last_os_error()))
}

/// An epoll instance watching `fds` for input, level-triggered: an epoll fd is
/// itself pollable, readable while any watched fd is, so a caller sleeps on
/// one descriptor for completions and async events alike.
fn epoll_of(fds: &[RawFd]) -> io::Result<OwnedFd> {
    // SAFETY: no pointers; returns a new fd or -1.
    let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if ep < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `ep` is a new fd that nothing else owns.
    let ep = unsafe { OwnedFd::from_raw_fd(ep) };
    for &fd in fds {
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: fd as u64,
        };
        // SAFETY: valid epoll fd, valid watched fd, `ev` lives across the call.
        if unsafe { libc::epoll_ctl(ep.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) } < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(ep)
}

/// Set O_NONBLOCK on a file descriptor the library owns.
fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on a valid fd with F_GETFL/F_SETFL has no memory effects.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

impl Device {
    /// Open `name` (or the first device) and create PD, channel and CQs.
    pub(crate) fn open(
        name: Option<&str>,
        send_cqe: u32,
        recv_cqe: u32,
    ) -> Result<Device, FabricError> {
        let devices = list_devices()?;
        let chosen = match name {
            Some(n) => {
                devices
                    .iter()
                    .find(|d| d.name == n)
                    .ok_or_else(|| FabricError::NoDevice {
                        detail: format!(
                            "no RDMA device named {n} (present: {})",
                            devices
                                .iter()
                                .map(|d| d.name.as_str())
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    })?
            }
            None => &devices[0],
        };
        let cname = CString::new(chosen.name.clone()).expect("device names have no NUL");
        let mut n = 0;
        // SAFETY: valid out-pointer; the list is freed below after the device is opened
        // (ibv_open_device keeps its own reference).
        let list = unsafe { ibv_get_device_list(&mut n) };
        if list.is_null() {
            return Err(FabricError::NoDevice {
                detail: format!("device list vanished: {}", io::Error::last_os_error()),
            });
        }
        let mut ctx = ptr::null_mut();
        for i in 0..n.max(0) as usize {
            // SAFETY: `list` holds `n` valid device pointers.
            let dev = unsafe { *list.add(i) };
            // SAFETY: `dev` is valid; its name is a C string.
            if unsafe { CStr::from_ptr(ibv_get_device_name(dev)) } == cname.as_c_str() {
                // SAFETY: `dev` is a valid device from the current list.
                ctx = unsafe { ibv_open_device(dev) };
                break;
            }
        }
        // SAFETY: freed once; contexts opened from it stay valid.
        unsafe { ibv_free_device_list(list) };
        if ctx.is_null() {
            return Err(last_err(&format!("ibv_open_device({})", chosen.name)));
        }
        let mut d = Device {
            name: chosen.name.clone(),
            ctx,
            pd: ptr::null_mut(),
            channel: ptr::null_mut(),
            send_cq: ptr::null_mut(),
            recv_cq: ptr::null_mut(),
            readiness: None,
        };
        // From here on, Drop releases whatever was created.
        // SAFETY: `ctx` is an open context.
        d.pd = unsafe { ibv_alloc_pd(d.ctx) };
        if d.pd.is_null() {
            return Err(last_err("ibv_alloc_pd"));
        }
        // SAFETY: as above.
        d.channel = unsafe { ibv_create_comp_channel(d.ctx) };
        if d.channel.is_null() {
            return Err(last_err("ibv_create_comp_channel"));
        }
        // SAFETY: `channel` is valid; its fd is owned by the library.
        set_nonblocking(unsafe { (*d.channel).fd })?;
        // SAFETY: `ctx` is valid; the async fd is owned by the library.
        set_nonblocking(unsafe { (*d.ctx).async_fd })?;
        // SAFETY: both fds belong to the library objects `d` owns.
        let fds = unsafe { [(*d.channel).fd, (*d.ctx).async_fd] };
        d.readiness = Some(
            epoll_of(&fds).map_err(|e| FabricError::QpError(format!("epoll for wake-ups: {e}")))?,
        );
        // SAFETY: valid context and channel; no cq_context.
        d.send_cq = unsafe { ibv_create_cq(d.ctx, send_cqe as i32, ptr::null_mut(), d.channel, 0) };
        if d.send_cq.is_null() {
            return Err(last_err("ibv_create_cq(send)"));
        }
        // SAFETY: as above.
        d.recv_cq = unsafe { ibv_create_cq(d.ctx, recv_cqe as i32, ptr::null_mut(), d.channel, 0) };
        if d.recv_cq.is_null() {
            return Err(last_err("ibv_create_cq(recv)"));
        }
        Ok(d)
    }

    /// The completion channel's file descriptor (non-blocking).
    /// The descriptor to sleep on: readable when the completion channel has
    /// an event (an armed CQ got a completion) or an async event is pending.
    pub(crate) fn readiness_fd(&self) -> BorrowedFd<'_> {
        self.readiness
            .as_ref()
            .expect("set when the device was opened")
            .as_fd()
    }

    pub(crate) fn channel_fd(&self) -> RawFd {
        // SAFETY: the channel lives as long as `self`.
        unsafe { (*self.channel).fd }
    }

    /// Consume every pending completion-channel event without blocking and
    /// acknowledge each (an unacknowledged event would block destroying its CQ).
    /// Returns how many there were. After this the channel's fd is readable
    /// again only when an armed CQ gets a completion.
    pub(crate) fn drain_channel(&self) -> usize {
        let mut n = 0;
        loop {
            let mut cq: *mut ibv_cq = ptr::null_mut();
            let mut ctx: *mut std::ffi::c_void = ptr::null_mut();
            // SAFETY: the channel is valid while `self` lives; its fd is non-blocking,
            // so this returns -1 (EAGAIN) when no event is pending.
            let rc = unsafe { ibv_get_cq_event(self.channel, &mut cq, &mut ctx) };
            if rc != 0 {
                return n;
            }
            // SAFETY: `cq` is the CQ the event came from (one of ours); ack it once.
            unsafe { ibv_ack_cq_events(cq, 1) };
            n += 1;
        }
    }

    /// The context's asynchronous-event file descriptor (non-blocking).
    pub(crate) fn async_fd(&self) -> RawFd {
        // SAFETY: the context lives as long as `self`.
        unsafe { (*self.ctx).async_fd }
    }

    /// Query a port.
    pub(crate) fn query_port(&self, port: u8) -> Result<ibv_port_attr, FabricError> {
        // SAFETY: ibv_port_attr is plain data; all-zero is a valid value.
        let mut attr: ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY: valid context and out-pointer of the right size.
        let rc = unsafe { ___ibv_query_port(self.ctx, port, &mut attr) };
        if rc != 0 {
            return Err(FabricError::QpError(format!(
                "ibv_query_port({}, {port}): {}",
                self.name,
                io::Error::from_raw_os_error(rc)
            )));
        }
        Ok(attr)
    }

    /// The device's completion clock mask (`ibv_device_attr_ex`); 0: the
    /// device has no completion clock (rxe).
    pub(crate) fn completion_timestamp_mask(&self) -> Result<u64, FabricError> {
        // SAFETY: both structs are plain data; all-zero is valid (and the
        // fallback to ibv_query_device fills only the `orig_attr` prefix).
        let (input, mut attr): (ibv_query_device_ex_input, ibv_device_attr_ex) =
            unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
        // SAFETY: valid context; in and out pointers to live structs of the right types.
        let rc = unsafe { ibv_query_device_ex(self.ctx, &input, &mut attr) };
        if rc != 0 {
            return Err(FabricError::QpError(format!(
                "ibv_query_device_ex({}): {}",
                self.name,
                io::Error::from_raw_os_error(rc)
            )));
        }
        Ok(attr.completion_timestamp_mask)
    }

    /// Read GID `index` of `port`.
    pub(crate) fn query_gid(&self, port: u8, index: u32) -> Option<Gid> {
        // SAFETY: ibv_gid is 16 plain bytes.
        let mut g: ibv_gid = unsafe { std::mem::zeroed() };
        // SAFETY: valid context and out-pointer.
        let rc = unsafe { ibv_query_gid(self.ctx, port, index as i32, &mut g) };
        if rc != 0 {
            return None;
        }
        // SAFETY: every bit pattern is a valid `raw` array.
        Some(Gid(unsafe { g.raw }))
    }

    /// The non-zero GIDs of `port`, with their types.
    pub(crate) fn gid_table(&self, port: u8, len: u32) -> Vec<GidEntry> {
        (0..len)
            .filter_map(|index| {
                let gid = self.query_gid(port, index).filter(|g| *g != Gid::ZERO)?;
                let path = format!(
                    "/sys/class/infiniband/{}/ports/{port}/gid_attrs/types/{index}",
                    self.name
                );
                let kind = match std::fs::read_to_string(path) {
                    Ok(s) if s.trim().eq_ignore_ascii_case("RoCE v2") => GidKind::RoceV2,
                    Ok(s) if !s.trim().is_empty() => GidKind::RoceV1OrIb,
                    _ => GidKind::Unknown,
                };
                Some(GidEntry { index, gid, kind })
            })
            .collect()
    }

    /// P_Key at `index` of `port` (host byte order).
    pub(crate) fn query_pkey(&self, port: u8, index: u16) -> Option<u16> {
        let mut pkey: u16 = 0;
        // SAFETY: valid context and out-pointer.
        let rc = unsafe { ibv_query_pkey(self.ctx, port, i32::from(index), &mut pkey) };
        (rc == 0).then_some(u16::from_be(pkey))
    }
}

impl Drop for Device {
    /// Runs only once the QP using these objects is gone: a QP that could not
    /// be destroyed keeps its Device alive for good (`VerbsQp`'s teardown). A
    /// failure here leaves the object to the library (which frees nothing it
    /// could not destroy), so it is only reported.
    fn drop(&mut self) {
        let report = |what: &str, rc: i32| {
            if rc != 0 {
                let error = errno_of(rc);
                tracing::warn!(device = %self.name, %error, "{what} failed");
            }
        };
        // SAFETY: each object was created by this Device, is destroyed once, in
        // reverse order of creation; the QP/MRs/AHs using them are already gone.
        unsafe {
            if !self.recv_cq.is_null() {
                report("ibv_destroy_cq(recv)", ibv_destroy_cq(self.recv_cq));
            }
            if !self.send_cq.is_null() {
                report("ibv_destroy_cq(send)", ibv_destroy_cq(self.send_cq));
            }
            if !self.channel.is_null() {
                report(
                    "ibv_destroy_comp_channel",
                    ibv_destroy_comp_channel(self.channel),
                );
            }
            if !self.pd.is_null() {
                report("ibv_dealloc_pd", ibv_dealloc_pd(self.pd));
            }
            report("ibv_close_device", ibv_close_device(self.ctx));
        }
    }
}

/// The IB MTU enumeration value as [`Mtu`].
pub(crate) fn mtu_from_ibv(m: ibv_mtu::Type) -> Option<Mtu> {
    Some(match m {
        ibv_mtu::IBV_MTU_256 => Mtu::M256,
        ibv_mtu::IBV_MTU_512 => Mtu::M512,
        ibv_mtu::IBV_MTU_1024 => Mtu::M1024,
        ibv_mtu::IBV_MTU_2048 => Mtu::M2048,
        ibv_mtu::IBV_MTU_4096 => Mtu::M4096,
        _ => return None,
    })
}

/// The error of a failed libibverbs call: `rc` is the errno when positive (as
/// `ibv_modify_qp` and the `ibv_destroy_*` calls return it), else `errno` is read.
/// Here, beside the device, because every verbs object's calls fail this way.
pub(super) fn errno_of(rc: i32) -> io::Error {
    if rc > 0 {
        io::Error::from_raw_os_error(rc)
    } else {
        io::Error::last_os_error()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::net::UnixStream;

    /// The epoll set is readable while any member is, and quiet once the
    /// member that was readable is drained: one descriptor to sleep on.
    #[test]
    fn epoll_of_is_readable_while_any_member_is() {
        let (mut a_tx, a_rx) = UnixStream::pair().unwrap();
        let (mut b_tx, b_rx) = UnixStream::pair().unwrap();
        a_rx.set_nonblocking(true).unwrap();
        b_rx.set_nonblocking(true).unwrap();
        let ep = epoll_of(&[a_rx.as_raw_fd(), b_rx.as_raw_fd()]).unwrap();
        let readable = || {
            let mut fds = [libc::pollfd {
                fd: ep.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            }];
            // SAFETY: one valid pollfd, zero timeout.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), 1, 0) };
            n == 1 && fds[0].revents & libc::POLLIN != 0
        };
        assert!(!readable());
        b_tx.write_all(b"event").unwrap();
        assert!(readable(), "the second member woke the set");
        let mut buf = [0u8; 16];
        std::io::Read::read(&mut &b_rx, &mut buf).unwrap();
        assert!(!readable(), "drained: quiet again");
        a_tx.write_all(b"x").unwrap();
        assert!(readable(), "the first member too");
    }
}
