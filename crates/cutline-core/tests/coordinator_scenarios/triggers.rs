//! Periodic triggering.

use super::*;

#[test]
#[rustfmt::skip] // scenarios read as prose: one step per call, grouped by instant
fn first_checkpoint_of_a_generation_waits_one_interval() {
    let mut s = job().start_at(1000);
    s.quiet_until(1099)
        .at(1100).tick().expect_trigger(1)
        .at(1130).complete(1)
        .quiet_until(1199)
        .at(1200).tick().expect_trigger(2);
}

/// Trigger times of a job ticked every 10 ms up to `until`, where every checkpoint completes `takes`
/// ms after its trigger (never, for `None`).
pub(crate) fn trigger_times(cfg: CheckpointConfig, takes: Option<u64>, until: u64) -> Vec<u64> {
    let tasks = [TaskId(0), TaskId(1)];
    let mut c: Coordinator<Report> = Coordinator::new(
        cfg,
        Generation(1),
        tasks,
        [TaskId(0)],
        CheckpointId(1),
        CheckpointId(1_000_000),
        None,
        TimeMs(0),
    );
    let mut due: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    let mut times = Vec::new();
    let mut out = Vec::new();
    for now in (0..=until).step_by(10) {
        for id in due.remove(&now).unwrap_or_default() {
            for t in tasks {
                let ack = Event::Acked {
                    generation: Generation(1),
                    checkpoint: CheckpointId(id),
                    task: t,
                    report: report(1, id, t.0),
                };
                c.handle(TimeMs(now), ack, &mut out).unwrap();
            }
            let done = Event::ManifestCommitted { checkpoint: CheckpointId(id) };
            c.handle(TimeMs(now), done, &mut out).unwrap();
        }
        c.handle(TimeMs(now), Event::Tick, &mut out).unwrap();
        for d in out.drain(..) {
            if let Decision::Trigger { barrier } = d {
                times.push(now);
                if let Some(ms) = takes {
                    due.entry(now + ms).or_default().push(barrier.checkpoint.0);
                }
            }
        }
    }
    times
}

#[test]
fn periodic_triggers_follow_interval_min_pause_and_max_concurrent() {
    struct Row {
        what: &'static str,
        interval: u64,
        min_pause: u64,
        max_concurrent: usize,
        timeout: u64,
        takes: Option<u64>,
        triggers: &'static [u64],
    }
    #[rustfmt::skip]
    let table = [
        Row { what: "fast checkpoints: one per interval, the first after one interval",
              interval: 100, min_pause: 0, max_concurrent: 1, timeout: 1000, takes: Some(30),
              triggers: &[100, 200, 300, 400, 500, 600, 700] },
        Row { what: "a slow checkpoint holds the only slot; the next goes when it ends",
              interval: 100, min_pause: 0, max_concurrent: 1, timeout: 1000, takes: Some(150),
              triggers: &[100, 250, 400, 550, 700] },
        Row { what: "min pause counts from the end of the previous checkpoint",
              interval: 100, min_pause: 80, max_concurrent: 1, timeout: 1000, takes: Some(50),
              triggers: &[100, 230, 360, 490, 620] },
        Row { what: "a min pause shorter than the gap changes nothing",
              interval: 100, min_pause: 40, max_concurrent: 1, timeout: 1000, takes: Some(50),
              triggers: &[100, 200, 300, 400, 500, 600, 700] },
        Row { what: "two in flight: a third waits for a free slot",
              interval: 100, min_pause: 0, max_concurrent: 2, timeout: 1000, takes: Some(250),
              triggers: &[100, 200, 350, 450, 600, 700] },
        Row { what: "three in flight are enough: the interval alone decides",
              interval: 100, min_pause: 0, max_concurrent: 3, timeout: 1000, takes: Some(250),
              triggers: &[100, 200, 300, 400, 500, 600, 700] },
        Row { what: "a checkpoint that never completes holds its slot until it times out",
              interval: 100, min_pause: 0, max_concurrent: 1, timeout: 250, takes: None,
              triggers: &[100, 350, 600] },
        Row { what: "a short interval with many in flight: concurrent triggers keep the 50 ms gap",
              interval: 10, min_pause: 0, max_concurrent: 16, timeout: 1000, takes: Some(250),
              triggers: &[10, 60, 110, 160, 210, 260, 310, 360, 410, 460, 510, 560, 610, 660] },
        Row { what: "a short interval with none in flight: the interval alone decides",
              interval: 10, min_pause: 0, max_concurrent: 16, timeout: 1000, takes: Some(10),
              triggers: &[10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110, 120, 130, 140, 150, 160, 170,
                          180, 190, 200, 210, 220, 230, 240, 250, 260, 270, 280, 290, 300, 310, 320,
                          330, 340, 350, 360, 370, 380, 390, 400, 410, 420, 430, 440, 450, 460, 470,
                          480, 490, 500, 510, 520, 530, 540, 550, 560, 570, 580, 590, 600, 610, 620,
                          630, 640, 650, 660, 670, 680, 690, 700] },
    ];
    for row in table {
        let cfg = CheckpointConfig {
            interval_ms: Some(row.interval),
            timeout_ms: row.timeout,
            min_pause_ms: row.min_pause,
            max_concurrent: row.max_concurrent,
            tolerable_failures: 3,
            mode: CheckpointMode::ExactlyOnce,
            ..Default::default()
        };
        assert_eq!(trigger_times(cfg, row.takes, 700), row.triggers, "{}", row.what);
    }
}

#[test]
#[rustfmt::skip] // scenarios read as prose: one step per call, grouped by instant
fn max_concurrent_caps_checkpoints_in_flight() {
    let mut s = job().max_concurrent(2).start();
    s.at(100).tick().expect_trigger(1)
        .at(200).tick().expect_trigger(2)
        .quiet_until(450) // two in flight: no third however long we wait
        .expect_pending(&[1, 2])
        .at(460).complete(1) // the older completes; the newer stays in flight
        .expect_pending(&[2])
        .tick().expect_trigger(3)
        .expect_pending(&[2, 3]);
}

#[test]
#[rustfmt::skip] // scenarios read as prose: one step per call, grouped by instant
fn min_pause_runs_from_the_end_of_the_previous_checkpoint() {
    let mut s = job().min_pause(90).start();
    s.at(100).tick().expect_trigger(1)
        .at(150).complete(1)
        .quiet_until(239) // the interval passed at 200, the pause only at 240
        .at(240).tick().expect_trigger(2)
        .at(260).decline(0, 2).expect_abort(2, declined(0)) // an abort is an end too
        .quiet_until(349)
        .at(350).tick().expect_trigger(3);
}
