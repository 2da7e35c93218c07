//! Group commit: durable appends per second as the number of concurrent writers grows.
//!
//! Each writer appends a 256-byte record and waits until it is durable (flush + fdatasync), as
//! a request handler does. With one flush per group, throughput should grow with concurrency
//! instead of staying at one write per fsync. Run: `cargo bench --bench wal_commit`.

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

struct Nothing;

impl wal::Replayer for Nothing {
    fn checkpoint(
        &mut self,
        _: u64,
        _: &mut dyn std::io::Read,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        Ok(())
    }
    fn record(&mut self, _: u64, _: &[u8]) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        Ok(())
    }
}

fn durable_appends(c: &mut Criterion) {
    let mut group = c.benchmark_group("durable_appends");
    group.sample_size(10).measurement_time(Duration::from_secs(5));
    for writers in [1usize, 8, 64] {
        let per_writer = 64usize;
        group.throughput(Throughput::Elements((writers * per_writer) as u64));
        let dir = tempfile::tempdir().unwrap();
        let (log, _) =
            wal::Wal::recover(wal::Config::default_for(dir.path()), &mut Nothing).unwrap();
        group.bench_with_input(BenchmarkId::from_parameter(writers), &writers, |b, &writers| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let start = Instant::now();
                    std::thread::scope(|s| {
                        for _ in 0..writers {
                            let log = log.clone();
                            s.spawn(move || {
                                for _ in 0..per_writer {
                                    log.append(vec![7u8; 256]).unwrap().wait().unwrap();
                                }
                            });
                        }
                    });
                    total += start.elapsed();
                }
                total
            });
        });
        let stats = log.stats();
        eprintln!(
            "writers={writers}: {} records in {} flushes ({:.1} records per flush, largest group {})",
            stats.records_flushed,
            stats.flushes,
            stats.records_flushed as f64 / stats.flushes.max(1) as f64,
            stats.batch_size_max
        );
    }
    group.finish();
}

criterion_group!(benches, durable_appends);
criterion_main!(benches);
