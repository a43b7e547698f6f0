//! A `sim` fabric made through the C API (`qr_fabric_new`) with reordering on
//! delivers every packet, some of them out of order. (It used to lose every
//! reordered packet: the sim held them for a delivery thread it never started.)

use std::collections::BTreeSet;
use std::net::Ipv6Addr;
use std::time::{Duration, Instant};

use quic_rdma::fabric::sim::{SimFabric, SimQp, SimQpOptions};
use quic_rdma::fabric::Gid;
use quic_rdma::socket::{SocketConfig, UdSocket};
use quic_rdma_ffi::{qr_fabric_config, qr_fabric_free, qr_fabric_new, QR_OK};

/// The sim fabric behind a `qr_fabric` built by the C API with `reorder`.
fn c_api_sim_fabric(reorder: f64) -> SimFabric {
    let cfg = qr_fabric_config {
        struct_size: size_of::<qr_fabric_config>() as u32,
        mtu: 4096,
        provider: c"sim".as_ptr(),
        seed: 9,
        loss: 0.0,
        duplicate: 0.0,
        reorder,
        device: std::ptr::null(),
        port: 0,
        reserved: 0,
    };
    let mut f = std::ptr::null_mut();
    // SAFETY: `cfg` is a whole qr_fabric_config whose provider is a NUL-terminated
    // string; `f` is a writable pointer.
    assert_eq!(unsafe { qr_fabric_new(&cfg, &mut f) }, QR_OK);
    // SAFETY: `f` came from qr_fabric_new just above and is live.
    let sim = unsafe { &*f }.as_sim().expect("a sim fabric").clone();
    // SAFETY: from qr_fabric_new, freed once; the clone keeps the fabric alive.
    unsafe { qr_fabric_free(f) };
    sim
}

fn sock(f: &SimFabric, n: u16) -> UdSocket<SimQp> {
    let gid: Gid = Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, n).into();
    let qp = f.create_qp(gid, SimQpOptions::default()).unwrap();
    UdSocket::new(qp, SocketConfig::default()).unwrap()
}

/// A short-header QUIC-looking datagram carrying `seq`.
fn datagram(seq: u16) -> Vec<u8> {
    let mut d = vec![0u8; 1200];
    d[..4].copy_from_slice(&[0x40, 0x11, 0x22, 0x33]);
    d[4..6].copy_from_slice(&seq.to_be_bytes());
    d
}

#[test]
fn c_api_reorder_delivers_every_packet_reordered() {
    const N: u16 = 400;
    let f = c_api_sim_fabric(0.25);
    let mut a = sock(&f, 1);
    let mut b = sock(&f, 2);
    let to = b.local_addr();
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut sent = 0;
    while got.len() < usize::from(N) && Instant::now() < deadline {
        // Send in bursts the receive queue can hold, so nothing is lost to
        // starvation: every missing packet would be the wire's fault.
        while sent < N && usize::from(sent) - got.len() < 64 {
            a.send(to, 0, &datagram(sent), None).unwrap();
            sent += 1;
        }
        b.recv(usize::MAX, |r| {
            got.push(u16::from_be_bytes([r.data[4], r.data[5]]));
        });
        std::thread::sleep(Duration::from_micros(200));
    }
    let stats = f.stats();
    assert!(stats.reordered > 0, "{stats:?}");
    assert_eq!(
        got.len(),
        usize::from(N),
        "every packet arrives ({stats:?}, {} still on the wire)",
        f.in_flight()
    );
    let distinct: BTreeSet<u16> = got.iter().copied().collect();
    assert_eq!(distinct, (0..N).collect(), "each packet exactly once");
    assert!(
        got.windows(2).any(|w| w[0] > w[1]),
        "some packets overtook others"
    );
    assert_eq!(b.stats().provider.no_recv_posted, 0);
}
