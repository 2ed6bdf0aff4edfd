//! Accepting on the endpoints without being overrun: a cap on the connections served at
//! once, and a pause after a failed accept.
//!
//! The cap is a permit taken *before* `accept`: past it, new clients wait in the kernel's
//! listen backlog (and are served in turn as earlier connections end) instead of each
//! taking a task, a buffer and a file descriptor. A failed accept that is about the
//! process, not the connection (EMFILE, ENFILE, ENOBUFS, ENOMEM), fails again at once if
//! retried, so the loop pauses, 100 ms doubling to 1 s, instead of spinning a CPU and the
//! log; the log says it at most every [`SAY_EVERY`].

use std::{
    os::fd::{AsRawFd, RawFd},
    pin::Pin,
    task::{Context, Poll},
    time::{Duration, Instant},
};

use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    sync::OwnedSemaphorePermit,
};

/// The first pause after a failed accept.
pub const FIRST_PAUSE: Duration = Duration::from_millis(100);
/// The longest pause: the endpoint answers again within this of a descriptor coming free.
pub const MAX_PAUSE: Duration = Duration::from_secs(1);
/// A failing accept is logged at most this often (with how many failures went unsaid).
pub const SAY_EVERY: Duration = Duration::from_secs(10);

/// What to do after a failed accept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Failed {
    /// Wait this long before accepting again (zero: at once).
    pub pause: Duration,
    /// `Some(n)`: log this failure, and the `n` since the last one logged.
    pub say: Option<u64>,
}

/// The pause and the log's rate limit across failed accepts.
#[derive(Debug, Default)]
pub struct Backoff {
    pause: Option<Duration>,
    said: Option<Instant>,
    unsaid: u64,
}

impl Backoff {
    /// An accept succeeded: the next failure pauses [`FIRST_PAUSE`] again.
    pub fn succeeded(&mut self) {
        self.pause = None;
    }

    /// An accept failed with `errno` at `now`.
    pub fn failed(&mut self, errno: Option<i32>, now: Instant) -> Failed {
        // An aborted or interrupted connection is that connection's failure: the next one
        // is accepted at once.
        let pause = if matches!(
            errno,
            Some(libc::ECONNABORTED | libc::EINTR | libc::EAGAIN | libc::EPROTO)
        ) {
            Duration::ZERO
        } else {
            let next = self.pause.map_or(FIRST_PAUSE, |p| (p * 2).min(MAX_PAUSE));
            self.pause = Some(next);
            next
        };
        let say = match self.said {
            Some(at) if now.duration_since(at) < SAY_EVERY => {
                self.unsaid += 1;
                None
            }
            _ => {
                self.said = Some(now);
                Some(std::mem::take(&mut self.unsaid))
            }
        };
        Failed { pause, say }
    }
}

/// An accepted connection holding its endpoint's permit until it is dropped (when its
/// task ends).
pub struct Held<C> {
    conn: C,
    _permit: OwnedSemaphorePermit,
}

impl<C> Held<C> {
    pub fn new(conn: C, permit: OwnedSemaphorePermit) -> Self {
        Self {
            conn,
            _permit: permit,
        }
    }
}

impl<C: AsRawFd> AsRawFd for Held<C> {
    fn as_raw_fd(&self) -> RawFd {
        self.conn.as_raw_fd()
    }
}

impl<C: AsyncRead + Unpin> AsyncRead for Held<C> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.conn).poll_read(cx, buf)
    }
}

impl<C: AsyncWrite + Unpin> AsyncWrite for Held<C> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.conn).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.conn).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.conn).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.conn).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.conn.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_descriptors_pauses_doubling_to_a_second_and_resets_on_success() {
        let mut b = Backoff::default();
        let t0 = Instant::now();
        let pauses: Vec<u64> = (0..6)
            .map(|_| b.failed(Some(libc::EMFILE), t0).pause.as_millis() as u64)
            .collect();
        assert_eq!(pauses, [100, 200, 400, 800, 1000, 1000]);
        b.succeeded();
        assert_eq!(b.failed(Some(libc::ENFILE), t0).pause, FIRST_PAUSE);
        // An error the kernel gives no number for pauses as well.
        assert_eq!(b.failed(None, t0).pause, Duration::from_millis(200));
    }

    #[test]
    fn a_failed_connection_is_retried_at_once_and_keeps_the_pause() {
        let mut b = Backoff::default();
        let t0 = Instant::now();
        b.failed(Some(libc::EMFILE), t0);
        assert_eq!(b.failed(Some(libc::ECONNABORTED), t0).pause, Duration::ZERO);
        assert_eq!(
            b.failed(Some(libc::EMFILE), t0).pause,
            Duration::from_millis(200)
        );
    }

    #[test]
    fn failures_are_said_at_most_every_ten_seconds_with_the_count_unsaid() {
        let mut b = Backoff::default();
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        assert_eq!(b.failed(Some(libc::EMFILE), at(0)).say, Some(0));
        assert_eq!(b.failed(Some(libc::EMFILE), at(100)).say, None);
        assert_eq!(b.failed(Some(libc::EMFILE), at(9_999)).say, None);
        assert_eq!(b.failed(Some(libc::EMFILE), at(10_000)).say, Some(2));
        assert_eq!(b.failed(Some(libc::EMFILE), at(10_001)).say, None);
    }
}
