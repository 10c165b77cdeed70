//! `cutline bench nexmark`: one Nexmark query over generated events, with checkpoints at the given
//! interval and without, in alternating pairs; a rate is printed only when the rows committed are
//! as many as the query's batch reference gives (for q12, whose rows depend on timing, as many bids).

use crate::bench::timed_engine_run;
use anyhow::{bail, Result};
use cutline::Job;
use cutline_nexmark::{events, reference::reference, CountSink, Query};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Events/s of one run of `q` (checkpoints every `interval_ms`, or none), after checking its rows.
fn one_run(q: Query, n: u64, parallelism: u32, interval_ms: Option<u64>, want_rows: u64) -> Result<f64> {
    let committed = Arc::new(AtomicU64::new(0));
    let job = Job::new(format!("nexmark-{q}"));
    job.set_parallelism(parallelism);
    q.build(events(&job, n, parallelism)).sink("out", CountSink::new(committed.clone()));
    let graph = job.build()?;
    let secs = timed_engine_run(&graph, &format!("nexmark-{q}"), interval_ms)?;
    let got = committed.load(Ordering::SeqCst);
    if got != want_rows {
        bail!("{q} committed {got} rows, its batch reference gives {want_rows}: no rate printed");
    }
    Ok(n as f64 / secs)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

pub(crate) fn bench_nexmark(q: Query, n: u64, parallelism: u32, interval: &str, reps: u32) -> Result<()> {
    if reps == 0 || n == 0 || parallelism == 0 {
        bail!("--reps, --events and --parallelism must be at least 1");
    }
    let interval_ms = crate::args::parse_interval(interval)?;
    let Some(interval_ms) = interval_ms else {
        bail!("--checkpoint-interval must be a duration: the benchmark compares it with checkpoints off")
    };
    let want: u64 = reference(q, n).iter().map(|r| r.weight()).sum();
    let (mut on, mut off) = (Vec::new(), Vec::new());
    for rep in 0..reps {
        let run = |interval| one_run(q, n, parallelism, interval, want);
        let (a, b) = if rep % 2 == 0 {
            let a = run(Some(interval_ms))?;
            (a, run(None)?)
        } else {
            let b = run(None)?;
            (run(Some(interval_ms))?, b)
        };
        println!("{q} rep {rep}: {a:.0} events/s with checkpoints every {interval}, {b:.0} without ({:.3})", a / b);
        on.push(a);
        off.push(b);
    }
    let (a, b) = (median(on), median(off));
    println!(
        "{q} events={n} parallelism={parallelism} rows={want}: median {a:.0} events/s with checkpoints every {interval}, {b:.0} without; on/off {:.3}",
        a / b
    );
    Ok(())
}
