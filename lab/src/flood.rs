//! A spoofed SYN flood: TCP SYNs with random source addresses (from given IPv4 prefixes),
//! ports and sequence numbers, sent through a raw socket (`IPPROTO_RAW`, which implies
//! `IP_HDRINCL`) with `sendmmsg` in batches, as fast as one thread can or at a set rate.
//!
//! Only addresses inside 198.18.0.0/15 may be used, and the test that floods must route the
//! replies (SYN-ACKs, SYN cookies, resets) of the node to an address of the client namespace
//! that drops them ([`route_replies`]), so nothing leaves the test's namespaces and the node
//! does not resolve a neighbour for every spoofed address.

use std::{
    net::{Ipv4Addr, SocketAddrV4},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use crate::netns::Netns;

/// An IPv4 prefix sources are drawn from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Prefix {
    pub base: Ipv4Addr,
    pub len: u8,
}

impl Prefix {
    pub const fn new(base: Ipv4Addr, len: u8) -> Self {
        Self { base, len }
    }

    /// The prefix as `ip route` writes it.
    pub fn cidr(&self) -> String {
        format!("{}/{}", self.base, self.len)
    }

    fn contains_only_test_addresses(&self) -> bool {
        let lo = u32::from(self.base) & mask(self.len);
        let hi = lo | !mask(self.len);
        let (start, end) = (
            u32::from(Ipv4Addr::new(198, 18, 0, 0)),
            u32::from(Ipv4Addr::new(198, 19, 255, 255)),
        );
        lo >= start && hi <= end
    }

    fn pick(&self, r: u64) -> u32 {
        let m = mask(self.len);
        (u32::from(self.base) & m) | (r as u32 & !m)
    }
}

fn mask(len: u8) -> u32 {
    if len == 0 { 0 } else { u32::MAX << (32 - len) }
}

/// What to send.
#[derive(Clone, Debug)]
pub struct FloodConfig {
    pub target: SocketAddrV4,
    /// Sources are drawn uniformly from these prefixes (one picked uniformly per SYN).
    pub sources: Vec<Prefix>,
    /// SYNs per second; `None` as fast as the thread can send.
    pub rate: Option<f64>,
    /// Pin the sending thread to this CPU.
    pub cpu: Option<usize>,
    pub seed: u64,
}

/// A running flood; [`Flood::stop`] ends it and says what was sent.
pub struct Flood {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    start: Instant,
    handle: Option<thread::JoinHandle<()>>,
}

/// What a flood sent.
#[derive(Clone, Copy, Debug)]
pub struct FloodStats {
    pub sent: u64,
    pub secs: f64,
}

impl FloodStats {
    pub fn rate(&self) -> f64 {
        self.sent as f64 / self.secs.max(1e-9)
    }
}

/// Route the node's replies to every address of `prefixes` to `via` (an address of the
/// client namespace): it receives them on its veth and drops them (they are not its own,
/// and it does not forward), and the node resolves one neighbour instead of one per
/// spoofed source.
pub fn route_replies(node: &Netns, prefixes: &[Prefix], via: Ipv4Addr) {
    for p in prefixes {
        node.ip(&["route", "replace", &p.cidr(), "via", &via.to_string()]);
    }
}

const BATCH: usize = 64;
/// IPv4 header, TCP header with the options a Linux client sends (MSS, SACK permitted,
/// timestamps, window scale).
const LEN: usize = 20 + 40;

impl Flood {
    /// Start flooding from inside `ns`.
    pub fn start_in(ns: &Netns, cfg: FloodConfig) -> Self {
        assert!(!cfg.sources.is_empty(), "a flood needs source prefixes");
        for p in &cfg.sources {
            assert!(
                p.contains_only_test_addresses(),
                "flood sources must lie in 198.18.0.0/15: {}",
                p.cidr()
            );
        }
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicU64::new(0));
        let (s, n) = (stop.clone(), sent.clone());
        let handle = ns.spawn(move || {
            if let Some(cpu) = cfg.cpu {
                crate::load::pin_current_thread(cpu);
            }
            send_loop(&cfg, &s, &n);
        });
        Self {
            stop,
            sent,
            start: Instant::now(),
            handle: Some(handle),
        }
    }

    /// SYNs sent so far.
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    pub fn stop(mut self) -> FloodStats {
        self.finish()
    }

    fn finish(&mut self) -> FloodStats {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            h.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
        }
        FloodStats {
            sent: self.sent(),
            secs: self.start.elapsed().as_secs_f64(),
        }
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

fn send_loop(cfg: &FloodConfig, stop: &AtomicBool, sent: &AtomicU64) {
    // SAFETY: plain socket call.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_RAW) };
    assert!(
        fd >= 0,
        "raw socket: {} (the flood needs root)",
        std::io::Error::last_os_error()
    );
    let mut rng = crate::load::XorShift::from_state(cfg.seed | 1);
    let mut bufs = [[0u8; LEN]; BATCH];
    let dst = libc::sockaddr_in {
        sin_family: libc::AF_INET as u16,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from(*cfg.target.ip()).to_be(),
        },
        sin_zero: [0; 8],
    };
    let mut iovs: Vec<libc::iovec> = Vec::with_capacity(BATCH);
    let start = Instant::now();
    let mut total = 0u64;
    while !stop.load(Ordering::Relaxed) {
        if let Some(rate) = cfg.rate {
            // Paced: never ahead of the schedule (by more than one batch).
            let due = (start.elapsed().as_secs_f64() * rate) as u64;
            if total >= due {
                let ahead = (total - due + 1) as f64 / rate;
                thread::sleep(Duration::from_secs_f64(ahead.min(0.01)));
                continue;
            }
        }
        iovs.clear();
        for buf in bufs.iter_mut() {
            let p = cfg.sources[(rng.next_u64() % cfg.sources.len() as u64) as usize];
            let src = p.pick(rng.next_u64());
            let r = rng.next_u64();
            write_syn(
                buf,
                src,
                u32::from(*cfg.target.ip()),
                1024 + (r as u16 % 64512),
                cfg.target.port(),
                (r >> 16) as u32,
                (r >> 48) as u16,
            );
            iovs.push(libc::iovec {
                iov_base: buf.as_mut_ptr().cast(),
                iov_len: LEN,
            });
        }
        let mut msgs: Vec<libc::mmsghdr> = iovs
            .iter_mut()
            .map(|iov| {
                // SAFETY: an all-zero msghdr is valid; the fields are set below.
                let mut h: libc::mmsghdr = unsafe { std::mem::zeroed() };
                h.msg_hdr.msg_name = (&raw const dst).cast_mut().cast();
                h.msg_hdr.msg_namelen = size_of::<libc::sockaddr_in>() as u32;
                h.msg_hdr.msg_iov = iov;
                h.msg_hdr.msg_iovlen = 1;
                h
            })
            .collect();
        // SAFETY: `msgs` points at live buffers and addresses for the call's duration.
        let n = unsafe { libc::sendmmsg(fd, msgs.as_mut_ptr(), msgs.len() as u32, 0) };
        if n > 0 {
            total += n as u64;
            sent.fetch_add(n as u64, Ordering::Relaxed);
        } else {
            // A full device queue (ENOBUFS): yield and go on.
            thread::yield_now();
        }
    }
    // SAFETY: our own descriptor.
    unsafe { libc::close(fd) };
}

/// Write one SYN (IPv4 header, TCP header with options) into `buf`.
fn write_syn(buf: &mut [u8; LEN], src: u32, dst: u32, sport: u16, dport: u16, seq: u32, id: u16) {
    buf[0] = 0x45;
    buf[1] = 0;
    buf[2..4].copy_from_slice(&(LEN as u16).to_be_bytes());
    buf[4..6].copy_from_slice(&id.to_be_bytes());
    buf[6..8].copy_from_slice(&0x4000u16.to_be_bytes());
    buf[8] = 64;
    buf[9] = 6;
    buf[10..12].fill(0);
    buf[12..16].copy_from_slice(&src.to_be_bytes());
    buf[16..20].copy_from_slice(&dst.to_be_bytes());
    let ip_sum = fold(sum(&buf[..20]));
    buf[10..12].copy_from_slice(&ip_sum.to_be_bytes());
    let t = &mut buf[20..];
    t[0..2].copy_from_slice(&sport.to_be_bytes());
    t[2..4].copy_from_slice(&dport.to_be_bytes());
    t[4..8].copy_from_slice(&seq.to_be_bytes());
    t[8..12].fill(0);
    t[12] = 10 << 4; // 40-byte header
    t[13] = 0x02; // SYN
    t[14..16].copy_from_slice(&64240u16.to_be_bytes());
    t[16..20].fill(0);
    // MSS 1460, SACK permitted, timestamps, NOP, window scale 7.
    t[20..40].copy_from_slice(&[
        2, 4, 0x05, 0xb4, 4, 2, 8, 10, 0, 0, 0, 1, 0, 0, 0, 0, 1, 3, 3, 7,
    ]);
    let pseudo = (src >> 16) + (src & 0xffff) + (dst >> 16) + (dst & 0xffff) + 6 + 40;
    let tcp_sum = fold(pseudo + sum(&buf[20..]));
    buf[36..38].copy_from_slice(&tcp_sum.to_be_bytes());
}

fn sum(bytes: &[u8]) -> u32 {
    bytes
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum()
}

fn fold(mut s: u32) -> u16 {
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_syn_has_valid_checksums_and_its_prefix() {
        let mut buf = [0u8; LEN];
        let p = Prefix::new(Ipv4Addr::new(198, 18, 10, 0), 25);
        let src = p.pick(0xffff_ffff);
        assert_eq!(Ipv4Addr::from(src), Ipv4Addr::new(198, 18, 10, 127));
        write_syn(
            &mut buf,
            src,
            u32::from(Ipv4Addr::new(198, 18, 0, 2)),
            40000,
            80,
            7,
            1,
        );
        let mut frame = vec![0u8; 12];
        frame.extend_from_slice(&0x0800u16.to_be_bytes());
        frame.extend_from_slice(&buf);
        crate::packet::verify_checksums(&frame).expect("valid checksums");
        assert!(p.contains_only_test_addresses());
        assert!(!Prefix::new(Ipv4Addr::new(10, 0, 0, 0), 8).contains_only_test_addresses());
        assert!(!Prefix::new(Ipv4Addr::new(198, 18, 0, 0), 14).contains_only_test_addresses());
    }
}
