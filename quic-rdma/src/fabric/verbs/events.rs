//! Async events of the device (`ibv_get_async_event`): port up/down, GID change
//! and QP/CQ/device failures, filtered to the ones that concern one QP.

use rdma_sys::*;

use super::device::Device;
use crate::fabric::{AsyncEvent, Gid};

/// The next async event of the device that concerns QP `qp` or its `port`
/// (`ibv_get_async_event` on the non-blocking async fd), acknowledged. A GID
/// change of the GID at `gid_index` updates `gid` and is reported; events about
/// other QPs or ports are skipped.
pub(super) fn read_async_event(
    dev: &Device,
    qp: *mut ibv_qp,
    port: u8,
    gid_index: u32,
    gid: &mut Gid,
) -> Option<AsyncEvent> {
    loop {
        // SAFETY: plain data; zero is valid.
        let mut ev: ibv_async_event = unsafe { std::mem::zeroed() };
        // SAFETY: valid context; its async fd is non-blocking, so this returns -1
        // (EAGAIN) when no event is pending.
        let rc = unsafe { ibv_get_async_event(dev.ctx, &mut ev) };
        if rc != 0 {
            return None;
        }
        let ty = ev.event_type;
        // SAFETY: the union member matches the event type class checked below.
        let (ev_qp, ev_port) = unsafe { (ev.element.qp, ev.element.port_num) };
        // SAFETY: each event is acknowledged once.
        unsafe { ibv_ack_async_event(&mut ev) };
        use ibv_event_type::*;
        let mapped = match ty {
            IBV_EVENT_PORT_ERR if ev_port == i32::from(port) => Some(AsyncEvent::PortDown),
            IBV_EVENT_PORT_ACTIVE if ev_port == i32::from(port) => Some(AsyncEvent::PortActive),
            IBV_EVENT_GID_CHANGE if ev_port == i32::from(port) => {
                match dev.query_gid(port, gid_index) {
                    Some(g) if g != *gid && g != Gid::ZERO => {
                        *gid = g;
                        Some(AsyncEvent::GidChanged { new: g })
                    }
                    _ => None,
                }
            }
            IBV_EVENT_QP_FATAL | IBV_EVENT_QP_REQ_ERR | IBV_EVENT_QP_ACCESS_ERR if ev_qp == qp => {
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
