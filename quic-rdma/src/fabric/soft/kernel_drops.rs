//! Datagrams the kernel dropped for a `soft` port's UDP socket, read in safe code.
//!
//! A datagram that finds the socket's receive buffer (`SO_RCVBUF`) full is
//! dropped by the kernel and never reaches userspace: a loss the provider cannot
//! see by reading. Linux counts these per socket (`sk_drops`). `SO_RXQ_OVFL`
//! would report the counter in a control message and `SO_MEMINFO` through
//! `getsockopt`, but neither quinn-udp nor socket2 exposes them and this module
//! has no `unsafe`; the same counter is the last column ("drops") of the
//! socket's row in `/proc/net/udp` (`udp6` for IPv6), found by its inode.

use std::net::UdpSocket;
use std::os::fd::AsRawFd;

/// Where to find one socket's kernel drop counter.
#[derive(Clone, Debug)]
pub(crate) struct KernelDrops {
    /// The socket's inode number (the `inode` column).
    inode: u64,
    /// `udp` or `udp6`.
    table: &'static str,
}

/// Column of the inode in `/proc/net/udp{,6}` rows (after `sl`, the two
/// addresses, `st`, the queues, the timer, `retrnsmt`, `uid` and `timeout`).
const INODE_COLUMN: usize = 9;
/// Column of the drop counter (after `ref` and `pointer`).
const DROPS_COLUMN: usize = 12;

impl KernelDrops {
    /// Locate `socket`'s counter; `None` without `/proc` (not Linux, or not mounted).
    pub(crate) fn locate(socket: &UdpSocket) -> Option<KernelDrops> {
        let link = std::fs::read_link(format!("/proc/self/fd/{}", socket.as_raw_fd())).ok()?;
        let inode = link
            .to_str()?
            .strip_prefix("socket:[")?
            .strip_suffix(']')?
            .parse()
            .ok()?;
        let table = if socket.local_addr().ok()?.is_ipv4() {
            "udp"
        } else {
            "udp6"
        };
        Some(KernelDrops { inode, table })
    }

    /// The socket's drop count now (0 if its row cannot be read). The network
    /// namespace of the calling thread is tried first (a socket opened inside a
    /// namespace a test thread entered), then the process's.
    pub(crate) fn read(&self) -> u64 {
        ["/proc/thread-self/net", "/proc/self/net"]
            .iter()
            .find_map(|dir| {
                let text = std::fs::read_to_string(format!("{dir}/{}", self.table)).ok()?;
                drops_of(&text, self.inode)
            })
            .unwrap_or(0)
    }
}

/// The drop column of the row of `inode` in a `/proc/net/udp{,6}` listing.
fn drops_of(text: &str, inode: u64) -> Option<u64> {
    text.lines().skip(1).find_map(|line| {
        let cols: Vec<&str> = line.split_whitespace().collect();
        if cols.get(INODE_COLUMN)?.parse::<u64>().ok()? != inode {
            return None;
        }
        cols.get(DROPS_COLUMN)?.parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_drops_column_of_our_row() {
        let text = "   sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops\n\
            \x20 161: 0100007F:12B7 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 4242 2 0000000000000000 0\n\
            \x20 162: 0200007F:12B7 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 777 2 0000000000000000 31\n";
        assert_eq!(drops_of(text, 777), Some(31));
        assert_eq!(drops_of(text, 4242), Some(0));
        assert_eq!(drops_of(text, 1), None);
    }

    #[test]
    fn finds_a_live_socket() {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        let k = KernelDrops::locate(&s).expect("Linux with /proc");
        let text = std::fs::read_to_string("/proc/self/net/udp").unwrap();
        assert_eq!(
            drops_of(&text, k.inode),
            Some(0),
            "row of inode {}",
            k.inode
        );
        assert_eq!(k.read(), 0);
    }
}
