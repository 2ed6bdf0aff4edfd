//! A backend's capacity measured with a closed loop ([`measure_capacity`]).

use std::{
    net::{IpAddr, SocketAddr},
    time::Duration,
};

use tokio::time::Instant;

use super::{
    client::{Outcome, Protocol, raise_nofile_limit, request},
    stats::{Counts, Record},
};

/// What [`measure_capacity`] found.
#[derive(Clone, Debug)]
pub struct Capacity {
    /// Completed requests per second over the measurement.
    pub rps: f64,
    /// Requests completed in the measurement window.
    pub completed: u64,
    /// Requests that failed (any outcome but ok) in the window.
    pub failed: u64,
    /// Median latency of the completed requests.
    pub p50: Option<Duration>,
}

/// Measure a backend's capacity with a closed loop: `concurrency` clients (use twice the
/// backend's workers, so its accept queue never runs dry) each sending one request after
/// another from `source` to `target` for 200 ms of warm-up plus `duration`; the rate of
/// completions within `duration` is the capacity. Runs in the calling thread's network
/// namespace (e.g. inside `pair.client.run(..)`); blocks.
pub fn measure_capacity(
    target: SocketAddr,
    source: IpAddr,
    concurrency: usize,
    duration: Duration,
) -> Capacity {
    measure_capacity_speaking(&Protocol::Line, target, source, concurrency, duration)
}

/// [`measure_capacity`] with clients that speak `protocol`.
pub fn measure_capacity_speaking(
    protocol: &Protocol,
    target: SocketAddr,
    source: IpAddr,
    concurrency: usize,
    duration: Duration,
) -> Capacity {
    const WARMUP: Duration = Duration::from_millis(200);
    raise_nofile_limit();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("building a runtime");
    runtime.block_on(async move {
        let t0 = Instant::now();
        let (from, to) = (t0 + WARMUP, t0 + WARMUP + duration);
        let mut clients = tokio::task::JoinSet::new();
        for _ in 0..concurrency.max(1) {
            let protocol = protocol.clone();
            clients.spawn(async move {
                let mut c = Counts::default();
                loop {
                    let start = Instant::now();
                    if start >= to {
                        break c;
                    }
                    let deadline = start + Duration::from_secs(2);
                    let (outcome, attempts, _) =
                        request(target, source, &protocol, deadline, 0).await;
                    let end = Instant::now();
                    if end >= from && end < to {
                        c.add(&Record {
                            class: 0,
                            start: Duration::ZERO,
                            outcome,
                            elapsed: end - start,
                            attempts,
                        });
                    }
                    if outcome != Outcome::Ok {
                        // Do not spin on a dead target.
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            });
        }
        let mut total = Counts::default();
        while let Some(c) = clients.join_next().await {
            total.merge(&c.expect("capacity client"));
        }
        Capacity {
            rps: total.ok as f64 / duration.as_secs_f64(),
            completed: total.ok,
            failed: total.failed(),
            p50: total.p50(),
        }
    })
}
