//! What `qr devices` shows of each RDMA device: limits (`ibv_query_device`),
//! ports (`ibv_query_port`: state, link layer, MTUs), GID tables with their
//! types and netdevs, and the inline size a UD queue pair is granted.

use std::ffi::CStr;
use std::io;

use rdma_sys::*;

use super::device::{list_devices, mtu_from_ibv, Device, GidEntry};
use super::qp::{VerbsOptions, VerbsQp};
use crate::fabric::{FabricError, Mtu};

// verbs.h's anonymous enum (IBV_LINK_LAYER_*), which the bindings leave out.
const LINK_LAYER_INFINIBAND: u8 = 1;
const LINK_LAYER_ETHERNET: u8 = 2;

/// One RDMA device as `qr devices` reports it.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct DeviceReport {
    /// Kernel name (`rxe0`, `mlx5_0`).
    pub name: String,
    /// Node GUID (host byte order).
    pub guid: u64,
    /// Firmware version, as the driver reports it (may be empty).
    pub fw_ver: String,
    /// Most queue pairs the device supports.
    pub max_qp: u32,
    /// Most work requests per queue.
    pub max_qp_wr: u32,
    /// Most completion-queue entries per CQ.
    pub max_cqe: u32,
    /// Most scatter/gather entries per work request.
    pub max_sge: u32,
    /// Inline bytes a UD queue pair on port 1 was granted (`None`: no QP
    /// could be opened, e.g. no RoCE v2 GID yet).
    pub max_inline_ud: Option<u32>,
    /// Its ports.
    pub ports: Vec<PortReport>,
}

/// One port of a device.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct PortReport {
    /// Port number (1-based).
    pub port: u8,
    /// `ACTIVE`, `DOWN`, `INIT`, `ARMED`, `ACTIVE_DEFER` or `NOP`.
    pub state: &'static str,
    /// `Ethernet` (RoCE), `InfiniBand`, or `unknown`.
    pub link_layer: &'static str,
    /// Active MTU (what a UD message may carry).
    pub active_mtu: Option<Mtu>,
    /// Largest MTU the port supports.
    pub max_mtu: Option<Mtu>,
    /// Non-empty GID table entries with their types.
    pub gids: Vec<GidEntry>,
    /// Netdev of each GID entry (by index), where the kernel says.
    pub netdevs: Vec<(u32, String)>,
}

/// Describe every RDMA device; `NoDevice` (with the reason) when there is none.
pub fn describe_devices() -> Result<Vec<DeviceReport>, FabricError> {
    list_devices()?
        .into_iter()
        .map(|d| describe(&d.name, d.guid))
        .collect()
}

fn describe(name: &str, guid: u64) -> Result<DeviceReport, FabricError> {
    let dev = Device::open(Some(name), 16, 16)?;
    // SAFETY: plain data; all-zero is valid.
    let mut a: ibv_device_attr = unsafe { std::mem::zeroed() };
    // SAFETY: open context, out-pointer of the right type.
    let rc = unsafe { ibv_query_device(dev.ctx, &mut a) };
    if rc != 0 {
        return Err(FabricError::QpError(format!(
            "ibv_query_device({name}): {}",
            io::Error::from_raw_os_error(rc)
        )));
    }
    // SAFETY: the driver fills fw_ver with a NUL-terminated string (zeroed before).
    let fw_ver = unsafe { CStr::from_ptr(a.fw_ver.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    let mut ports = Vec::new();
    for port in 1..=a.phys_port_cnt {
        let p = dev.query_port(port)?;
        let gids = dev.gid_table(port, p.gid_tbl_len.max(0) as u32);
        let netdevs = gids
            .iter()
            .filter_map(|g| {
                let path = format!(
                    "/sys/class/infiniband/{name}/ports/{port}/gid_attrs/ndevs/{}",
                    g.index
                );
                let nd = std::fs::read_to_string(path).ok()?;
                Some((g.index, nd.trim().to_string()))
            })
            .collect();
        ports.push(PortReport {
            port,
            state: port_state(p.state),
            link_layer: match p.link_layer {
                LINK_LAYER_ETHERNET => "Ethernet",
                LINK_LAYER_INFINIBAND => "InfiniBand",
                _ => "unknown",
            },
            active_mtu: mtu_from_ibv(p.active_mtu),
            max_mtu: mtu_from_ibv(p.max_mtu),
            gids,
            netdevs,
        });
    }
    drop(dev);
    let max_inline_ud = VerbsQp::open(&VerbsOptions {
        device: Some(name.to_string()),
        ..VerbsOptions::default()
    })
    .ok()
    .map(|qp| crate::fabric::UdQueuePair::attr(&qp).max_inline);
    let nonneg = |v: i32| v.max(0) as u32;
    Ok(DeviceReport {
        name: name.to_string(),
        guid,
        fw_ver,
        max_qp: nonneg(a.max_qp),
        max_qp_wr: nonneg(a.max_qp_wr),
        max_cqe: nonneg(a.max_cqe),
        max_sge: nonneg(a.max_sge),
        max_inline_ud,
        ports,
    })
}

fn port_state(s: ibv_port_state::Type) -> &'static str {
    use ibv_port_state::*;
    match s {
        IBV_PORT_ACTIVE => "ACTIVE",
        IBV_PORT_DOWN => "DOWN",
        IBV_PORT_INIT => "INIT",
        IBV_PORT_ARMED => "ARMED",
        IBV_PORT_ACTIVE_DEFER => "ACTIVE_DEFER",
        _ => "NOP",
    }
}
