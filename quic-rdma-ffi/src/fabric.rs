//! `qr_fabric`: the provider an engine's queue pair lives on.
#![allow(non_camel_case_types)]

use quic_rdma::fabric::sim::{Faults, SimConfig, SimFabric};
use quic_rdma::fabric::Mtu;

use crate::config::qr_fabric_config;
use crate::error::{guard, QR_EINVAL, QR_ENOPROVIDER, QR_OK};
use crate::ptr::{put, read_versioned, text};

/// A fabric: for "sim", an in-process network shared by every engine made on
/// it; for "soft", userspace RoCEv2 over UDP (each engine opens its own port on
/// its GID's IP address, so engines in different processes talk).
pub struct qr_fabric {
    pub(crate) kind: FabricKind,
}

pub(crate) enum FabricKind {
    Sim(SimFabric),
    Soft { mtu: Mtu },
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
            FabricKind::Soft { .. } => None,
        }
    }

    pub(crate) fn mtu(&self) -> Mtu {
        match &self.kind {
            FabricKind::Sim(s) => s.config().mtu,
            FabricKind::Soft { mtu } => *mtu,
        }
    }
}

fn mtu_of(bytes: u32) -> Result<Mtu, i32> {
    Ok(match bytes {
        0 | 4096 => Mtu::M4096,
        2048 => Mtu::M2048,
        1024 => Mtu::M1024,
        512 => Mtu::M512,
        256 => Mtu::M256,
        _ => return Err(QR_EINVAL),
    })
}

/// Create a fabric from `cfg` into `*out`. Providers: "sim" (in-process, with
/// the fault knobs of the config) and "soft" (RoCEv2 over UDP; the fault knobs
/// must be zero). Others ("verbs") return `QR_ENOPROVIDER`.
///
/// # Safety
/// `cfg` points to a `qr_fabric_config` of at least `cfg->struct_size` bytes
/// whose `provider` is NULL or a NUL-terminated string; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn qr_fabric_new(
    cfg: *const qr_fabric_config,
    out: *mut *mut qr_fabric,
) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract above.
        let c = unsafe { read_versioned(cfg) }?;
        let provider = if c.provider.is_null() {
            "sim"
        } else {
            // SAFETY: non-null and NUL-terminated by contract.
            unsafe { text(c.provider) }?
        };
        let mtu = mtu_of(c.mtu)?;
        let kind = match provider {
            "sim" => FabricKind::Sim(sim_fabric(&c, mtu)?),
            "soft" if c.loss == 0.0 && c.duplicate == 0.0 && c.reorder == 0.0 => {
                FabricKind::Soft { mtu }
            }
            "soft" => return Err(QR_EINVAL),
            _ => return Err(QR_ENOPROVIDER),
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

fn sim_fabric(c: &qr_fabric_config, mtu: Mtu) -> Result<SimFabric, i32> {
    {
        let p = |x: f64| {
            if (0.0..=1.0).contains(&x) {
                Ok(x)
            } else {
                Err(QR_EINVAL)
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
