//! The sync lag benchmark (ignored by `cargo test`; run by
//! `bench/region_lag.sh`): three regions on loopback as in `regions.rs`,
//! steady `RL.QUOTA ... REGION` traffic in each, and probes: the time from
//! a call in one region to its component being visible (`RL.REGION READ`)
//! in each other region. Prints p50, p99 and the maximum.

mod common;

use common::regions::*;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

#[test]
#[ignore = "a benchmark: bench/region_lag.sh"]
fn sync_lag_under_load() {
    let rate = env_u64("RL_LAG_RATE", 1000); // calls per second per region
    let probes = env_u64("RL_LAG_PROBES", 300);
    let keys = env_u64("RL_LAG_KEYS", 1000);
    // Direct links: no test proxy in the path.
    let world = World::launch("region-lag", false, false);
    let stop = Arc::new(AtomicBool::new(false));
    let calls = Arc::new(AtomicU64::new(0));
    let load: Vec<_> = world
        .regions
        .iter()
        .map(|region| {
            let (mut con, stop, calls) = (region.con(), stop.clone(), calls.clone());
            std::thread::spawn(move || {
                let start = Instant::now();
                let mut i = 0u64;
                while !stop.load(Ordering::SeqCst) && start.elapsed() < Duration::from_secs(600) {
                    let key = format!("rl:{{load:{}}}:month", i % keys);
                    take(&mut *con, &key, 1_000_000_000, 1);
                    i += 1;
                    calls.fetch_add(1, Ordering::Relaxed);
                    // Paced: call i is due at i / rate seconds.
                    let due = Duration::from_micros(i * 1_000_000 / rate);
                    if let Some(wait) = due.checked_sub(start.elapsed()) {
                        std::thread::sleep(wait);
                    }
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(1));
    let mut cons = world.cons();
    let names: Vec<&str> = world.regions.iter().map(|r| r.name).collect();
    let mut lags: Vec<(String, Duration)> = Vec::new();
    let began = Instant::now();
    let calls_before = calls.load(Ordering::Relaxed);
    for p in 0..probes {
        let from = (p % 3) as usize;
        let key = format!("rl:{{probe:{p}}}:month");
        let t0 = Instant::now();
        assert!(take(&mut *cons[from], &key, 1_000_000_000, 1));
        let mut waiting: Vec<usize> = (0..3).filter(|r| *r != from).collect();
        while !waiting.is_empty() {
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "probe {p} never arrived"
            );
            waiting.retain(|&to| {
                let seen = components(&mut *cons[to], &key).get(names[from]) == Some(&(1, 0));
                if seen {
                    lags.push((format!("{}->{}", names[from], names[to]), t0.elapsed()));
                }
                !seen
            });
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    let achieved =
        (calls.load(Ordering::Relaxed) - calls_before) as f64 / began.elapsed().as_secs_f64();
    stop.store(true, Ordering::SeqCst);
    for t in load {
        t.join().expect("load thread");
    }
    let mut all: Vec<Duration> = lags.iter().map(|(_, d)| *d).collect();
    all.sort();
    let show = |d: Duration| format!("{:.2} ms", d.as_secs_f64() * 1000.0);
    println!(
        "sync lag: {} probes, load {achieved:.0} RL.QUOTA REGION calls/s over 3 regions ({} keys each)",
        all.len(),
        keys
    );
    println!(
        "  all links: p50 {}  p99 {}  max {}",
        show(percentile(&all, 0.5)),
        show(percentile(&all, 0.99)),
        show(*all.last().expect("probes"))
    );
    let mut pairs: Vec<String> = lags.iter().map(|(p, _)| p.clone()).collect();
    pairs.sort();
    pairs.dedup();
    for pair in pairs {
        let mut v: Vec<Duration> = lags
            .iter()
            .filter(|(p, _)| *p == pair)
            .map(|(_, d)| *d)
            .collect();
        v.sort();
        println!(
            "  {pair:<8} p50 {}  p99 {}  ({} probes)",
            show(percentile(&v, 0.5)),
            show(percentile(&v, 0.99)),
            v.len()
        );
    }
}
