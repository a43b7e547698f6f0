//! Test support, shared by the crate's unit tests and `tests/c_api_alloc.rs`
//! (included there by `#[path]`): a client and a server engine on one `sim`
//! fabric, made and connected through the C API alone.
#![allow(dead_code)]

use super::*;

/// Two connected engines and the fabric under them, freed on drop.
pub(crate) struct SimPair {
    pub(crate) fabric: *mut qr_fabric,
    pub(crate) client: *mut qr_engine,
    pub(crate) server: *mut qr_engine,
    /// The connection's id on the client and on the server.
    pub(crate) cconn: u64,
    pub(crate) sconn: u64,
    /// Room for one poll's events.
    pub(crate) ev: Vec<qr_event>,
}

impl SimPair {
    /// A fabric seeded with `seed`, the engines on it (the server with a
    /// self-signed certificate the client trusts), and the handshake done on
    /// both sides.
    pub(crate) fn connected(seed: u64) -> SimPair {
        SimPair::connected_with(seed, std::ptr::null(), std::ptr::null())
    }

    /// As [`SimPair::connected`], the client's and the server's engine built
    /// with `client_opts` / `server_opts` (`qr_engine_config.options`; NULL: none).
    pub(crate) fn connected_with(
        seed: u64,
        client_opts: *const qr_engine_options,
        server_opts: *const qr_engine_options,
    ) -> SimPair {
        let fc = qr_fabric_config {
            struct_size: size_of::<qr_fabric_config>() as u32,
            mtu: 4096,
            provider: c"sim".as_ptr(),
            seed,
            loss: 0.0,
            duplicate: 0.0,
            reorder: 0.0,
            device: std::ptr::null(),
            port: 0,
            reserved: 0,
        };
        let mut fabric = std::ptr::null_mut();
        // SAFETY: a whole config with a NUL-terminated provider; `fabric` writable.
        assert_eq!(unsafe { qr_fabric_new(&fc, &mut fabric) }, QR_OK);
        let (mut cert, mut key) = (vec![0u8; 8192], vec![0u8; 8192]);
        let (mut cl, mut kl) = (0usize, 0usize);
        // SAFETY: buffers of the capacities given; lengths writable.
        let rc = unsafe {
            qr_tls_selfsigned(
                c"localhost".as_ptr(),
                cert.as_mut_ptr(),
                cert.len(),
                &mut cl,
                key.as_mut_ptr(),
                key.len(),
                &mut kl,
            )
        };
        assert_eq!(rc, QR_OK);
        let engine = |gid: &std::ffi::CStr, server: bool| {
            // SAFETY: all-zero is a valid config (null pointers, zero numbers).
            let mut c: qr_engine_config = unsafe { std::mem::zeroed() };
            c.struct_size = size_of::<qr_engine_config>() as u32;
            c.gid = gid.as_ptr();
            c.routing_key = if server { 0x11 } else { 0x22 };
            c.options = if server { server_opts } else { client_opts };
            if server {
                (c.cert_der, c.cert_der_len) = (cert.as_ptr(), cl);
                (c.key_der, c.key_der_len) = (key.as_ptr(), kl);
            } else {
                (c.ca_der, c.ca_der_len) = (cert.as_ptr(), cl);
            }
            let mut e = std::ptr::null_mut();
            // SAFETY: `fabric` is live, `c` valid with live buffers, `e` writable.
            assert_eq!(unsafe { qr_engine_new(fabric, &c, &mut e) }, QR_OK);
            e
        };
        let server = engine(c"fd00::a1", true);
        let client = engine(c"fd00::a2", false);
        let mut p = SimPair {
            fabric,
            client,
            server,
            cconn: 0,
            sconn: 0,
            ev: vec![qr_event::default(); 64],
        };
        let mut sa = qr_addr::default();
        // SAFETY: live engine; `sa` and the id are writable; the name is NUL-terminated.
        unsafe {
            assert_eq!(qr_engine_local_addr(p.server, &mut sa), QR_OK);
            assert_eq!(
                qr_connect(p.client, &sa, c"localhost".as_ptr(), &mut p.cconn),
                QR_OK
            );
        }
        let mut connected = false;
        for _ in 0..1_000_000 {
            if connected && p.sconn != 0 {
                break;
            }
            let cconn = p.cconn;
            connected |= p
                .poll(true)
                .iter()
                .any(|e| e.kind == QR_EVENT_CONNECTED && e.conn == cconn);
            if let Some(e) = p.poll(false).iter().find(|e| e.kind == QR_EVENT_CONNECTED) {
                p.sconn = e.conn;
            }
        }
        assert!(connected && p.sconn != 0, "handshake");
        p
    }

    /// Poll the client's engine (or the server's) once at time 0; its events.
    pub(crate) fn poll(&mut self, client: bool) -> &[qr_event] {
        let e = if client { self.client } else { self.server };
        // SAFETY: live engine; `ev` holds 64 events of this size.
        let n = unsafe {
            qr_engine_poll_at(
                e,
                0,
                self.ev.as_mut_ptr(),
                self.ev.len(),
                size_of::<qr_event>(),
            )
        };
        assert!(n >= 0, "poll: {n}");
        &self.ev[..n as usize]
    }
}

impl Drop for SimPair {
    fn drop(&mut self) {
        // SAFETY: from qr_engine_new / qr_fabric_new, freed once.
        unsafe {
            qr_engine_free(self.client);
            qr_engine_free(self.server);
            qr_fabric_free(self.fabric);
        }
    }
}
