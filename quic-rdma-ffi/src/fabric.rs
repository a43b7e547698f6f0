//! `qr_fabric`: the provider an engine's queue pair lives on.
#![allow(non_camel_case_types)]

use std::net::IpAddr;

use quic_rdma::fabric::sim::{Faults, SimConfig, SimFabric, SimQpOptions};
use quic_rdma::fabric::soft::{SoftConfig, SoftPort};
use quic_rdma::fabric::{FabricError, Gid, Mtu, Provider, UdQueuePair, DEFAULT_QKEY};

use crate::config::qr_fabric_config;
use crate::error::{fail, guard, QR_EFABRIC, QR_EINVAL, QR_ENODEVICE, QR_ENOPROVIDER, QR_OK};
use crate::ptr::{put, read_versioned, text};

/// A fabric: for "sim", an in-process network shared by every engine made on
/// it; for "soft", userspace RoCEv2 over UDP (each engine opens its own port on
/// its GID's IP address, so engines in different processes talk); for
/// "verbs", an RDMA device (a RoCE NIC, kernel rxe) through libibverbs.
pub struct qr_fabric {
    pub(crate) kind: FabricKind,
}

pub(crate) enum FabricKind {
    Sim(SimFabric),
    Soft {
        mtu: Mtu,
    },
    #[cfg(feature = "verbs")]
    Verbs {
        device: Option<String>,
        port: u8,
    },
}

impl qr_fabric {
    /// A handle on an existing `sim` fabric, for a Rust program that shares
    /// the fabric with C code in the same process (for example a server on
    /// [`quic_rdma::engine::Engine`] serving a C client). Pass `&handle` where
    /// the C API takes a `const qr_fabric *`.
    pub fn from_sim(fabric: SimFabric) -> Self {
        qr_fabric {
            kind: FabricKind::Sim(fabric),
        }
    }

    /// A `soft` fabric handle (RoCEv2 over UDP) with active MTU `mtu`.
    pub fn soft(mtu: Mtu) -> Self {
        qr_fabric {
            kind: FabricKind::Soft { mtu },
        }
    }

    /// The `sim` fabric behind the handle; `None` for other providers.
    pub fn as_sim(&self) -> Option<&SimFabric> {
        match &self.kind {
            FabricKind::Sim(s) => Some(s),
            _ => None,
        }
    }

    /// A UD queue pair on the port whose GID is `gid_text` (an IP address).
    /// Errors are codes with the reason in `qr_last_error`.
    pub(crate) fn open_qp(&self, gid_text: &str) -> Result<Box<dyn UdQueuePair>, i32> {
        let ip: IpAddr = gid_text.parse().map_err(|_| {
            fail(
                QR_EINVAL,
                format!("gid {gid_text:?} is not an IPv4 or IPv6 address"),
            )
        })?;
        let gid: Gid = match ip {
            IpAddr::V4(v4) => v4.into(),
            IpAddr::V6(v6) => v6.into(),
        };
        Ok(match &self.kind {
            FabricKind::Sim(sim) => Box::new(
                sim.create_qp(gid, SimQpOptions::default())
                    .map_err(fabric_error)?,
            ),
            FabricKind::Soft { mtu } => {
                let port = SoftPort::open(SoftConfig {
                    mtu: *mtu,
                    ..SoftConfig::new(ip)
                })
                .map_err(|e| fail(QR_EFABRIC, format!("soft port on {ip}: {e}")))?;
                Box::new(port.create_qp(DEFAULT_QKEY).map_err(fabric_error)?)
            }
            #[cfg(feature = "verbs")]
            FabricKind::Verbs { device, port } => {
                use quic_rdma::fabric::verbs::{VerbsOptions, VerbsQp};
                let opts = VerbsOptions {
                    device: device.clone(),
                    port: *port,
                    gid: Some(gid),
                    ..VerbsOptions::default()
                };
                Box::new(VerbsQp::open(&opts).map_err(fabric_error)?)
            }
        })
    }
}

/// A provider error's code and reason: no device is `QR_ENODEVICE`, the rest
/// `QR_EFABRIC`; the message names the fix.
fn fabric_error(e: FabricError) -> i32 {
    match e {
        FabricError::NoDevice { .. } => fail(QR_ENODEVICE, e),
        e => fail(QR_EFABRIC, e),
    }
}

fn mtu_of(bytes: u32) -> Result<Mtu, i32> {
    Ok(match bytes {
        0 | 4096 => Mtu::M4096,
        2048 => Mtu::M2048,
        1024 => Mtu::M1024,
        512 => Mtu::M512,
        256 => Mtu::M256,
        _ => {
            return Err(fail(
                QR_EINVAL,
                format!("mtu {bytes} is not one of 256, 512, 1024, 2048, 4096"),
            ))
        }
    })
}

/// Create a fabric from `cfg` into `*out`. Providers: "sim" (in-process, with
/// the fault knobs of the config), "soft" (RoCEv2 over UDP; the fault knobs
/// must be zero) and "verbs" (an RDMA device: `device`, `port`; in a library
/// built with the `verbs` feature, else `QR_ENOPROVIDER`). With no RDMA
/// device, the first `qr_engine_new` on a verbs fabric returns
/// `QR_ENODEVICE`, `qr_last_error` naming the fix.
///
/// Returns: `QR_OK` with the fabric in `*out`; `QR_ENULL`, `QR_EINVAL` (a bad
/// field: MTU, probabilities, port, `reserved`, `struct_size`),
/// `QR_ENOPROVIDER` (unknown provider, or verbs not built in), `QR_EPANIC`;
/// `qr_last_error` says why.
///
/// # Safety
/// `cfg` points to a `qr_fabric_config` of at least `cfg->struct_size` bytes
/// whose `provider` and `device` are NULL or NUL-terminated strings; `out` is
/// writable.
#[no_mangle]
pub unsafe extern "C" fn qr_fabric_new(
    cfg: *const qr_fabric_config,
    out: *mut *mut qr_fabric,
) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract above.
        let c = unsafe { read_versioned(cfg, "qr_fabric_config") }?;
        if c.reserved != 0 {
            return Err(fail(QR_EINVAL, "qr_fabric_config.reserved must be 0"));
        }
        let provider = if c.provider.is_null() {
            "sim"
        } else {
            // SAFETY: non-null and NUL-terminated by contract.
            unsafe { text(c.provider) }?
        };
        let no_faults = c.loss == 0.0 && c.duplicate == 0.0 && c.reorder == 0.0;
        let provider: Provider = provider.parse().map_err(|e| fail(QR_ENOPROVIDER, e))?;
        let kind = match provider {
            Provider::Sim => FabricKind::Sim(sim_fabric(&c, mtu_of(c.mtu)?)?),
            Provider::Soft if no_faults => FabricKind::Soft {
                mtu: mtu_of(c.mtu)?,
            },
            Provider::Soft => return Err(fail(QR_EINVAL, "soft has no fault injection: use sim")),
            // SAFETY: `device` is NULL or NUL-terminated by contract.
            Provider::Verbs => unsafe { verbs_kind(&c, no_faults) }?,
        };
        let f = Box::into_raw(Box::new(qr_fabric { kind }));
        // SAFETY: `out` is writable by contract (null-checked by `put`).
        if let Err(e) = unsafe { put(out, f) } {
            // SAFETY: `f` came from Box::into_raw just above and was not shared.
            drop(unsafe { Box::from_raw(f) });
            return Err(e);
        }
        Ok(QR_OK)
    })
}

/// The verbs fabric of `c`.
///
/// # Safety
/// `c.device` is NULL or NUL-terminated.
#[cfg(feature = "verbs")]
unsafe fn verbs_kind(c: &qr_fabric_config, no_faults: bool) -> Result<FabricKind, i32> {
    if !no_faults || c.mtu != 0 {
        return Err(fail(
            QR_EINVAL,
            "verbs: mtu and the fault knobs must be 0 (the port's active MTU applies)",
        ));
    }
    let device = if c.device.is_null() {
        None
    } else {
        // SAFETY: non-null and NUL-terminated by contract.
        Some(unsafe { text(c.device) }?.to_owned())
    };
    let port = match c.port {
        0 => 1,
        p @ 1..=255 => p as u8,
        p => return Err(fail(QR_EINVAL, format!("port {p} is above 255"))),
    };
    Ok(FabricKind::Verbs { device, port })
}

/// Without the `verbs` feature: not available, and says how to get it.
///
/// # Safety
/// None needed; `unsafe` only to match the feature's signature.
#[cfg(not(feature = "verbs"))]
unsafe fn verbs_kind(_: &qr_fabric_config, _: bool) -> Result<FabricKind, i32> {
    Err(fail(
        QR_ENOPROVIDER,
        "this library was built without verbs: cargo build --release -p quic-rdma-ffi \
         --features verbs (needs libibverbs-dev; link with -libverbs)",
    ))
}

fn sim_fabric(c: &qr_fabric_config, mtu: Mtu) -> Result<SimFabric, i32> {
    let p = |x: f64| {
        if (0.0..=1.0).contains(&x) {
            Ok(x)
        } else {
            Err(fail(
                QR_EINVAL,
                "loss, duplicate and reorder are probabilities in [0, 1]",
            ))
        }
    };
    let faults = Faults {
        loss: p(c.loss)?,
        duplicate: p(c.duplicate)?,
        reorder: p(c.reorder)?,
        // The config has no hold time: reordered packets are held back by
        // the sim's default, and the sim's wire thread delivers them.
        reorder_delay: Faults::DEFAULT_REORDER_DELAY,
        ..Faults::default()
    };
    Ok(SimFabric::new(SimConfig {
        mtu,
        faults,
        seed: c.seed,
        ..SimConfig::default()
    }))
}

/// Free a fabric. Engines made on it keep working (they share it); NULL is a no-op.
///
/// # Safety
/// `f` is NULL or came from `qr_fabric_new` and is not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn qr_fabric_free(f: *mut qr_fabric) {
    guard(|| {
        if !f.is_null() {
            // SAFETY: from `qr_fabric_new` (Box::into_raw) and never freed before, by contract.
            drop(unsafe { Box::from_raw(f) });
        }
        Ok(QR_OK)
    });
}
