//! Criterion benchmarks of the pure core (no Redis): the decision of
//! `RL.TAKE` and `RL.WINDOW`, leases and the codec. Run with
//! `make bench-core` (`cargo bench --features system-alloc --bench core`):
//! the crate must use the system allocator outside Redis.
//!
//! Every benchmark starts each iteration from the same stored state (the
//! state is copied in, as the adapter copies it out of the key), so the
//! path measured never drifts (an allowed call stays allowed). States are
//! made through the public API (a few earlier calls), not by hand.
//!
//! Measurement times are short on purpose: the whole run takes well under
//! a minute on a 2-core machine. These numbers are the core's share of a
//! call; `bench/run.sh` measures whole calls inside Redis.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};

use rl::core::bucket::{Bucket, Rate};
use rl::core::codec;
use rl::core::lease::{format_id, Acquire, Leases};
use rl::core::penalty::{Penalty, PenaltyPolicy};
use rl::core::record::Record;
use rl::core::take::{decide, take, Request, TakeRequest};
use rl::core::window::{key_offset, Mode, Window, WindowState};

const NOW: i64 = 1_700_000_000_000;

/// `RL.TAKE key 3000 3000 60 COST 1 STRIKES 20 60 BOX 300 3600 86400`.
fn policy(threshold: u64) -> PenaltyPolicy {
    PenaltyPolicy {
        threshold,
        window_ms: 60_000,
        box_ms: [300_000, 3_600_000, 86_400_000],
        offenses_ttl_ms: 86_400_000,
        every: false,
    }
}

fn rate(capacity: u64, tokens: u64, period_ms: u64) -> Rate {
    Rate {
        capacity,
        tokens,
        period_ms,
    }
}

fn take_request(rates: &[Rate], threshold: u64) -> TakeRequest {
    let mut req = TakeRequest::new(rates, 1);
    req.penalty = Some(policy(threshold));
    req
}

/// The stored buckets after `calls` calls of `req`, one per 10 ms, ending
/// 10 ms before `NOW`.
fn warmed_buckets(req: &TakeRequest, calls: i64) -> (Vec<Option<Bucket>>, Penalty) {
    let mut states = vec![None; req.limits.len()];
    let mut penalty = Penalty::default();
    for i in (1..=calls).rev() {
        take(&mut states, &mut penalty, req, NOW - 10 * i, 0);
    }
    (states, penalty)
}

fn bench_take(c: &mut Criterion) {
    let mut g = c.benchmark_group("take");

    // One bucket, allowed (a bucket that has been used: not full).
    let one = take_request(&[rate(3000, 3000, 60_000)], 20);
    let (states, penalty) = warmed_buckets(&one, 5);
    g.bench_function("one_bucket/allowed", |b| {
        b.iter(|| {
            let mut s = [states[0]];
            let mut p = penalty;
            black_box(take(&mut s, &mut p, black_box(&one), NOW, 0))
        })
    });

    // One bucket, throttled: empty, with STRIKES high enough never to trip,
    // so every call counts a strike (the penalty state changes).
    let tight = take_request(&[rate(1, 1, 3_600_000)], 1_000_000_000);
    let (states, penalty) = warmed_buckets(&tight, 3);
    g.bench_function("one_bucket/throttled", |b| {
        b.iter(|| {
            let mut s = [states[0]];
            let mut p = penalty;
            black_box(take(&mut s, &mut p, black_box(&tight), NOW, 0))
        })
    });

    // Boxed: the first key holds an active box; nothing else is read.
    let tripping = take_request(&[rate(1, 1, 3_600_000)], 1);
    let (states, penalty) = warmed_buckets(&tripping, 2);
    g.bench_function("one_bucket/boxed", |b| {
        b.iter(|| {
            let mut s = [states[0]];
            let mut p = penalty;
            black_box(take(&mut s, &mut p, black_box(&tripping), NOW, 0))
        })
    });

    // With one ALSO bucket (a tenant bucket), allowed.
    let also = take_request(
        &[rate(3000, 3000, 60_000), rate(100_000, 100_000, 60_000)],
        20,
    );
    let (states, penalty) = warmed_buckets(&also, 5);
    g.bench_function("also/allowed", |b| {
        b.iter(|| {
            let mut s = [states[0], states[1]];
            let mut p = penalty;
            black_box(take(&mut s, &mut p, black_box(&also), NOW, 0))
        })
    });

    // With one ALSO bucket, throttled by the ALSO bucket (the tenant is
    // empty), with strikes.
    let also_tight = take_request(
        &[rate(3000, 3000, 60_000), rate(1, 1, 3_600_000)],
        1_000_000_000,
    );
    let (states, penalty) = warmed_buckets(&also_tight, 3);
    g.bench_function("also/throttled", |b| {
        b.iter(|| {
            let mut s = [states[0], states[1]];
            let mut p = penalty;
            black_box(take(&mut s, &mut p, black_box(&also_tight), NOW, 0))
        })
    });

    // Building the request (what the parser does per call: a Vec today).
    let rates = [rate(3000, 3000, 60_000)];
    g.bench_function("request_new", |b| {
        b.iter(|| black_box(TakeRequest::new(black_box(&rates), 1)))
    });
    g.finish();
}

fn window_request(mode: Mode, limit: u64) -> Request<Window> {
    let key: &[u8] = b"rl:{w:000000012345}";
    let window = Window {
        limit,
        window_ms: 60_000,
        mode,
        offset_ms: key_offset(key, 60_000),
    };
    Request::new(&[window], 1)
}

fn bench_window(c: &mut Criterion) {
    let mut g = c.benchmark_group("window");
    for (name, mode) in [
        ("sliding", Mode::Sliding),
        ("exact", Mode::Exact),
        ("fixed", Mode::Fixed),
    ] {
        let req = window_request(mode, 3000);
        // 10 earlier calls, 1 s apart (an exact log of 10 entries).
        let mut states: Vec<Option<WindowState>> = vec![None];
        let mut penalty = Penalty::default();
        for i in (1..=10).rev() {
            decide(&mut states, &mut penalty, &req, NOW - 1000 * i, 0);
        }
        g.bench_function(format!("{name}/allowed"), |b| {
            b.iter_batched_ref(
                || (states.clone(), penalty),
                |(s, p)| black_box(decide(s, p, black_box(&req), NOW, 0)),
                BatchSize::SmallInput,
            )
        });
    }
    // EXACT by log length (the speed targets: at most O(log n) in its own entries).
    for entries in [10i64, 100, 1000] {
        let req = window_request(Mode::Exact, 10_000);
        let mut states: Vec<Option<WindowState>> = vec![None];
        let mut penalty = Penalty::default();
        for i in (1..=entries).rev() {
            decide(&mut states, &mut penalty, &req, NOW - 50 * i, 0);
        }
        g.bench_function(format!("exact/entries/{entries}"), |b| {
            b.iter_batched_ref(
                || (states.clone(), penalty),
                |(s, p)| black_box(decide(s, p, black_box(&req), NOW, 0)),
                BatchSize::SmallInput,
            )
        });
    }
    g.bench_function("key_offset", |b| {
        b.iter(|| black_box(key_offset(black_box(b"rl:{w:000000012345}"), 60_000)))
    });
    g.finish();
}

fn bench_lease(c: &mut Criterion) {
    let mut g = c.benchmark_group("lease");
    // A key with 3 live leases; acquire a 4th with a caller id, release it.
    let mut leases = Leases::new();
    for i in 0..3u64 {
        let id = format_id([i, i], NOW);
        leases.acquire(id.as_bytes(), 10, 60_000, NOW);
    }
    let id: &[u8] = b"req-8f2c0a7e";
    g.bench_function("acquire_release", |b| {
        b.iter_batched_ref(
            || leases.clone(),
            |l| {
                let granted = l.acquire(black_box(id), 10, 60_000, NOW);
                assert!(matches!(granted, Acquire::Granted { .. }));
                black_box(l.release(black_box(id), NOW))
            },
            BatchSize::SmallInput,
        )
    });
    // By the number of live leases (the speed targets: at most O(log n)).
    for held in [10u64, 100, 999] {
        let mut leases = Leases::new();
        for i in 0..held {
            let id = format_id([i, i], NOW);
            leases.acquire(id.as_bytes(), 1000, 60_000, NOW);
        }
        g.bench_function(format!("acquire_release/leases/{held}"), |b| {
            b.iter_batched_ref(
                || leases.clone(),
                |l| {
                    let granted = l.acquire(black_box(id), 1000, 60_000, NOW);
                    assert!(matches!(granted, Acquire::Granted { .. }));
                    black_box(l.release(black_box(id), NOW))
                },
                BatchSize::SmallInput,
            )
        });
    }
    g.bench_function("format_id", |b| {
        b.iter(|| black_box(format_id(black_box([7, 9]), NOW)))
    });
    g.finish();
}

fn bench_codec(c: &mut Criterion) {
    let mut g = c.benchmark_group("codec");
    // A typical RL.TAKE key: a used bucket plus penalty state (strikes).
    let req = take_request(&[rate(5, 5, 60_000)], 20);
    let (states, penalty) = warmed_buckets(&req, 8);
    let mut record = Record::default();
    record.bucket = states[0];
    record.penalty = Some(Box::new(penalty));
    let bytes = codec::encode(&record);
    assert_eq!(codec::decode(&bytes).as_ref(), Ok(&record));
    let mut bucket_only = Record::default();
    bucket_only.bucket = states[0];
    g.bench_function("encode", |b| {
        b.iter(|| black_box(codec::encode(black_box(&record))))
    });
    g.bench_function("decode", |b| {
        b.iter(|| black_box(codec::decode(black_box(&bytes))))
    });
    g.bench_function("round_trip/bucket_penalty", |b| {
        b.iter(|| black_box(codec::decode(&codec::encode(black_box(&record)))))
    });
    g.bench_function("round_trip/bucket", |b| {
        b.iter(|| black_box(codec::decode(&codec::encode(black_box(&bucket_only)))))
    });
    g.finish();
    eprintln!(
        "codec: bucket+penalty record = {} bytes, bucket-only = {} bytes",
        bytes.len(),
        codec::encode(&bucket_only).len()
    );
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_millis(1200))
        .sample_size(30)
        .without_plots()
}

criterion_group! {
    name = benches;
    config = config();
    targets = bench_take, bench_window, bench_lease, bench_codec
}
criterion_main!(benches);
