//! `qr_fabric`: the provider an engine's queue pair lives on.
#![allow(non_camel_case_types)]

use quic_rdma::fabric::sim::{Faults, SimConfig, SimFabric};
use quic_rdma::fabric::Mtu;

use crate::config::qr_fabric_config;
use crate::error::{guard, QR_EINVAL, QR_ENOPROVIDER, QR_OK};
use crate::ptr::{put, read_versioned, text};

/// A fabric: for "sim", an in-process network shared by every engine made on it.
pub struct qr_fabric {
    pub(crate) sim: SimFabric,
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

/// Create a fabric from `cfg` into `*out`. Providers: "sim". ("soft" and
/// "verbs" return `QR_ENOPROVIDER` in this build.)
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
        if provider != "sim" {
            return Err(QR_ENOPROVIDER);
        }
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
            ..Faults::default()
        };
        let sim = SimFabric::new(SimConfig {
            mtu: mtu_of(c.mtu)?,
            faults,
            seed: c.seed,
            ..SimConfig::default()
        });
        let f = Box::into_raw(Box::new(qr_fabric { sim }));
        // SAFETY: `out` is writable by contract (null-checked by `put`).
        if let Err(e) = unsafe { put(out, f) } {
            // SAFETY: `f` came from Box::into_raw just above and was not shared.
            drop(unsafe { Box::from_raw(f) });
            return Err(e);
        }
        Ok(QR_OK)
    })
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
