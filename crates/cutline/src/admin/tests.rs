use super::*;
use crate::runtime::JobMetrics;
use cutline_core::barrier::CheckpointMode;
use cutline_core::coordinator::CheckpointConfig;
use std::io::Write;
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::Instant;

fn set(line: &str) -> Result<Vec<Setting>, String> {
    match parse_request(line)? {
        Request::Set(s) => Ok(s),
        other => panic!("{line:?} parsed as {other:?}"),
    }
}

#[test]
fn simple_requests_parse_with_or_without_newline() {
    assert_eq!(parse_request("status\n"), Ok(Request::Status));
    assert_eq!(parse_request("  config\r\n"), Ok(Request::Config));
    assert_eq!(parse_request("ping"), Ok(Request::Ping));
    assert_eq!(parse_request("stop"), Ok(Request::Stop));
    assert_eq!(parse_request("help"), Ok(Request::Help));
    assert!(parse_request("status now").unwrap_err().contains("takes no arguments"));
    assert!(parse_request("").unwrap_err().contains("empty"));
    assert!(parse_request("launch").unwrap_err().contains("unknown request"));
    assert!(parse_request("status\nstop").unwrap_err().contains("one line"));
}

#[test]
fn set_parses_every_key() {
    let s = set("set interval=200ms timeout=30s alignment-timeout=off unaligned=true mode=exactly-once max-concurrent=2 min-pause=0 tolerable-failures=3 max-aligned-bytes=1048576").unwrap();
    assert_eq!(
        s,
        vec![
            Setting::Interval(Some(200)),
            Setting::Timeout(30_000),
            Setting::AlignmentTimeout(None),
            Setting::Unaligned(true),
            Setting::Mode(CheckpointMode::ExactlyOnce),
            Setting::MaxConcurrent(2),
            Setting::MinPause(0),
            Setting::TolerableFailures(3),
            Setting::MaxAlignedBytes(Some(1 << 20)),
        ]
    );
    assert_eq!(set("set interval=off max-aligned-bytes=64KiB").unwrap()[1], Setting::MaxAlignedBytes(Some(65536)));
    assert_eq!(set("set mode=at-least-once").unwrap(), vec![Setting::Mode(CheckpointMode::AtLeastOnce)]);
    assert_eq!(set("set interval=2m").unwrap(), vec![Setting::Interval(Some(120_000))]);
}

#[test]
fn bad_set_requests_say_what_is_wrong() {
    let e = set("set").unwrap_err();
    assert!(e.contains("at least one") && e.contains("max-aligned-bytes"), "{e}");
    let e = set("set interval=5parsecs").unwrap_err();
    assert!(e.contains("5parsecs") && e.contains("interval"), "{e}");
    assert!(set("set speed=11").unwrap_err().contains("unknown setting \"speed\""));
    assert!(set("set interval").unwrap_err().contains("key=value"));
    assert!(set("set interval=1s interval=2s").unwrap_err().contains("twice"));
    assert!(set("set unaligned=maybe").unwrap_err().contains("true or false"));
    assert!(set("set mode=twice").unwrap_err().contains("exactly-once or at-least-once"));
    assert!(set("set max-concurrent=-1").unwrap_err().contains("whole number"));
    assert!(set("set max-concurrent=99999999999999999999999").unwrap_err().contains("too large"));
    assert!(set("set timeout=off").is_err(), "timeout cannot be off");
    assert_eq!(set("set interval=1.5s").map(|_| ()), Ok(()), "fractions of a unit are whole milliseconds");
    assert!(set("set interval=1.0005s").is_err(), "not a whole millisecond");
    assert!(set("set interval=ms").is_err());
    assert!(set("set interval=400d").is_err());
    assert!(set("set max-aligned-bytes=lots").unwrap_err().contains("whole number of bytes"));
}

#[test]
fn savepoint_requests_take_an_absolute_path_with_spaces() {
    assert_eq!(parse_request("savepoint"), Ok(Request::Savepoint { to: None, stop: false }));
    assert_eq!(
        parse_request("stop-with-savepoint to=/tmp/my savepoints/sp 1\n"),
        Ok(Request::Savepoint { to: Some("/tmp/my savepoints/sp 1".into()), stop: true })
    );
    assert!(parse_request("savepoint to=relative/dir").unwrap_err().contains("absolute"));
    assert!(parse_request("savepoint to=").unwrap_err().contains("needs a path"));
    assert!(parse_request("savepoint /tmp/x").unwrap_err().contains("to=PATH"));
}

#[test]
fn config_round_trips_through_set() {
    let cfg = CheckpointConfig {
        interval_ms: Some(1500),
        timeout_ms: 120_000,
        min_pause_ms: 0,
        max_concurrent: 2,
        tolerable_failures: 7,
        mode: CheckpointMode::ExactlyOnce,
        unaligned: true,
        alignment_timeout_ms: Some(3_600_000),
        max_aligned_bytes: Some(12345),
    };
    let line = format_config(&cfg);
    assert_eq!(
            line,
            "interval=1500ms timeout=2m min-pause=0ms max-concurrent=2 tolerable-failures=7 mode=exactly-once unaligned=true alignment-timeout=1h max-aligned-bytes=12345"
        );
    let back = apply_settings(&CheckpointConfig::default(), &set(&format!("set {line}")).unwrap()).unwrap();
    assert_eq!(format_config(&back), line);
    let keys: Vec<&str> = line.split(' ').map(|kv| kv.split_once('=').unwrap().0).collect();
    assert_eq!(keys, SETTING_KEYS);
}

#[test]
fn set_changes_only_the_named_keys_and_refuses_invalid_combinations() {
    let current = CheckpointConfig { interval_ms: Some(200), ..Default::default() };
    let new = apply_settings(&current, &set("set unaligned=true").unwrap()).unwrap();
    assert!(new.unaligned);
    assert_eq!(new.interval_ms, Some(200));
    assert_eq!(new.timeout_ms, current.timeout_ms);
    let e = apply_settings(&new, &set("set mode=at-least-once").unwrap()).unwrap_err();
    assert!(e.contains("exactly-once"), "{e}");
    // max-concurrent out of range is refused by the job's own check (regression: 4294967296 was taken).
    for n in [0usize, 17, 1 << 32] {
        let e = apply_settings(&current, &set(&format!("set max-concurrent={n}")).unwrap()).unwrap_err();
        assert_eq!(e, format!("max concurrent checkpoints must be at least 1 and at most 16, not {n}"));
    }
    assert_eq!(apply_settings(&current, &set("set max-concurrent=16").unwrap()).unwrap().max_concurrent, 16);
    let e = apply_settings(&current, &set("set interval=0").unwrap()).unwrap_err();
    assert!(e.contains("positive"), "{e}");
}

#[test]
fn durations_and_bytes_parse_and_format() {
    assert_eq!(parse_duration_ms("0"), Ok(0));
    assert_eq!(parse_duration_ms("0ms"), Ok(0));
    assert_eq!(parse_duration_ms("250ms"), Ok(250));
    assert_eq!(parse_duration_ms("3s"), Ok(3000));
    assert_eq!(parse_duration_ms("1h"), Ok(3_600_000));
    assert!(parse_duration_ms("+3s").is_err());
    assert!(parse_duration_ms("3").is_err(), "a unit is needed");
    assert_eq!(parse_duration_ms("1h 30m"), Ok(5_400_000));
    assert!(parse_duration_ms("500us").unwrap_err().contains("whole milliseconds"));
    assert!(parse_duration_ms("366days").unwrap_err().contains("at most a year"));
    assert_eq!(parse_optional_duration_ms("off"), Ok(None));
    for ms in [0, 1, 999, 1000, 61_000, 120_000, 7_200_000] {
        assert_eq!(parse_duration_ms(&format_duration_ms(ms)), Ok(ms));
    }
    assert_eq!(parse_optional_bytes("off"), Ok(None));
    assert_eq!(parse_optional_bytes("0"), Ok(Some(0)));
    assert_eq!(parse_optional_bytes("2MiB"), Ok(Some(2 << 20)));
    assert_eq!(parse_optional_bytes("10B"), Ok(Some(10)));
    assert!(parse_optional_bytes("MiB").is_err());
    assert!(parse_optional_bytes("20000000000GiB").is_err());
    assert_eq!(parse_optional_bytes("64KiB"), Ok(Some(64 << 10)));
    assert_eq!(parse_optional_bytes("2kB"), Ok(Some(2000)));
}

#[test]
fn status_reports_settings_tasks_channels_and_checkpoints() {
    use crate::runtime::{CheckpointSummary, TaskReport};
    use crate::ChannelStats;
    use cutline_core::{CheckpointId, Generation};
    let m = JobMetrics {
        generation: Generation(2),
        config: CheckpointConfig { unaligned: true, ..Default::default() },
        tasks: vec![
            TaskReport { name: "lines#0".into(), backpressured_ms: 5, idle_ms: 7, ..Default::default() },
            TaskReport {
                name: "counts#0".into(),
                backpressured_ms: 0,
                idle_ms: 3,
                inputs: vec![ChannelStats {
                    name: "lines#0->counts#0".into(),
                    queued_batches: 3,
                    capacity_batches: 16,
                    high_water_batches: 16,
                    records: 0,
                }],
                ..Default::default()
            },
        ],
        checkpoints: vec![
            CheckpointSummary {
                checkpoint: CheckpointId(7),
                duration_ms: 12,
                bytes: 900,
                channel_state_bytes: 40,
                unaligned_tasks: 2,
                switched_tasks: 1,
                ..Default::default()
            },
            CheckpointSummary { checkpoint: CheckpointId(8), is_savepoint: true, ..Default::default() },
        ],
        checkpoints_completed: 8,
        checkpoints_failed: 1,
        failed: vec![crate::FailedCheckpoint {
            checkpoint: CheckpointId(6),
            reason: "expired after 60000 ms".into(),
            held_up_by: vec!["counts#0".into()],
        }],
        pending: vec![CheckpointId(9)],
        ..Default::default()
    };
    let s = format_status(&m);
    let lines: Vec<&str> = s.lines().collect();
    assert_eq!(lines[0], "job: gen-2, 8 checkpoints completed, 1 failed, in flight: chk-9");
    assert_eq!(lines[1], format!("settings: {}", format_config(&m.config)));
    assert!(s.contains("lines#0   backpressured        5 ms  idle        7 ms"), "{s}");
    assert!(s.contains("lines#0->counts#0     3/16   high 16"), "{s}");
    let chk: Vec<&str> = lines.iter().copied().filter(|l| l.trim_start().starts_with("chk-")).collect();
    assert_eq!(chk.len(), 2, "{s}");
    assert!(s.contains("  failed chk-6: expired after 60000 ms (held up by counts#0)\n"), "{s}");
    assert!(chk[0].contains("12 ms") && chk[0].contains("900 bytes") && chk[0].contains("40 in-flight bytes"));
    assert!(chk[0].contains("unaligned 2/2 tasks (1 switched)") && !chk[0].ends_with("savepoint"), "{s}");
    assert!(chk[1].ends_with("savepoint"), "{s}");
    let restarting = format_status(&JobMetrics { config: m.config.clone(), ..Default::default() });
    assert!(restarting.starts_with("job: restarting") && restarting.contains("none completed"), "{restarting}");
}

#[test]
fn ok_and_error_answers_are_told_apart() {
    // request_ok's answer handling, without a socket: an answer is parsed by prefix.
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("a.sock");
    let listener = UnixListener::bind(&sock).unwrap();
    let server = std::thread::spawn(move || {
        for answer in ["ok checkpoint=3 bytes=10 path=/x y\n", "error: no savepoint now: busy\n", "hello\n"] {
            let (mut s, _) = listener.accept().unwrap();
            let mut line = String::new();
            std::io::BufRead::read_line(&mut std::io::BufReader::new(&mut s), &mut line).unwrap();
            s.write_all(answer.as_bytes()).unwrap();
        }
    });
    assert_eq!(request_ok(&sock, "savepoint").unwrap(), "checkpoint=3 bytes=10 path=/x y");
    match request_ok(&sock, "savepoint") {
        Err(AdminError::Refused(r)) => assert_eq!(r, "no savepoint now: busy"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(request_ok(&sock, "status"), Err(AdminError::BadAnswer { .. })));
    server.join().unwrap();
}

#[test]
fn a_missing_socket_means_no_running_job_and_a_long_path_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("admin.sock");
    assert!(matches!(request(&sock, "status"), Err(AdminError::NotRunning { .. })));
    let long = dir.path().join("x".repeat(200)).join("admin.sock");
    let e = request(&long, "status").unwrap_err();
    assert!(matches!(e, AdminError::PathTooLong { .. }), "{e}");
    assert!(e.to_string().contains("shorter path"));
}

/// A job's control whose coordinator answers settings and metrics requests (`hung`: never answers).
fn fake_job(hung: bool) -> (crate::runtime::JobControl, std::thread::JoinHandle<()>) {
    use crate::runtime::control::Command;
    let (tx, rx) = crossbeam_channel::unbounded::<Command>();
    let job = std::thread::spawn(move || {
        for c in rx {
            if hung {
                std::thread::sleep(Duration::from_secs(3600));
            }
            match c {
                Command::CheckpointConfig(reply) => drop(reply.send(CheckpointConfig::default())),
                Command::Metrics { reply, .. } => drop(reply.send(JobMetrics::default())),
                _ => {}
            }
        }
    });
    (crate::runtime::JobControl::new(tx), job)
}

/// Send `bytes` on a new connection and read the whole answer.
fn raw_request(sock: &std::path::Path, bytes: &[u8]) -> String {
    let mut c = UnixStream::connect(sock).unwrap();
    c.write_all(bytes).unwrap();
    let mut answer = String::new();
    std::io::Read::read_to_string(&mut c, &mut answer).unwrap();
    answer
}

#[test]
fn a_request_line_is_limited_and_must_arrive() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("r.sock");
    let (control, _job) = fake_job(false);
    let _server = serve(control, &sock).unwrap();
    assert!(raw_request(&sock, &vec![b'x'; MAX_REQUEST_BYTES + 10]).contains("longer than"));
    // Silent: refused once the first byte is overdue.
    let t = Instant::now();
    assert!(raw_request(&sock, b"").contains("no request within"));
    assert!(t.elapsed() >= FIRST_BYTE_TIMEOUT && t.elapsed() < FIRST_BYTE_TIMEOUT + Duration::from_secs(1));
    // Trickling: refused once the whole line is overdue.
    let mut c = UnixStream::connect(&sock).unwrap();
    let t = Instant::now();
    c.write_all(b"pi").unwrap();
    let mut answer = String::new();
    std::io::Read::read_to_string(&mut c, &mut answer).unwrap();
    assert!(answer.contains("no complete request line"), "{answer}");
    assert!(t.elapsed() < REQUEST_READ_TIMEOUT + Duration::from_secs(1));
    assert!(raw_request(&sock, b"ping\n").starts_with("ok cutline"));
}

#[test]
fn idle_connections_do_not_lock_the_socket_out_regression_eight_idle() {
    // Eight idle connections held all eight handlers (each for its 2 s read timeout), so every
    // other request was answered `error: busy`; kept open in turn, they locked the socket out.
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("idle.sock");
    let (control, _job) = fake_job(false);
    let _server = serve(control, &sock).unwrap();
    let idle: Vec<UnixStream> = (0..MAX_WAITING_CONNECTIONS - 1).map(|_| UnixStream::connect(&sock).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(100));
    let t = Instant::now();
    for _ in 0..3 * MAX_CONNECTIONS {
        let a = request(&sock, "ping").unwrap();
        assert!(a.starts_with("ok cutline"), "{a}");
    }
    assert!(t.elapsed() < Duration::from_millis(900), "{:?}", t.elapsed());
    // More idle ones than may wait: the oldest are pushed out, requests still get through.
    let more: Vec<UnixStream> = (0..MAX_WAITING_CONNECTIONS).map(|_| UnixStream::connect(&sock).unwrap()).collect();
    assert!(request(&sock, "ping").unwrap().starts_with("ok cutline"));
    drop((idle, more));
}

#[test]
fn status_of_a_hung_job_fails_in_seconds_regression_600_s() {
    // `cutline status` against a job whose coordinator did not answer waited up to 600 s, and so did
    // the handler thread on the job's side.
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("hung.sock");
    let (control, _job) = fake_job(true);
    let _server = serve(control, &sock).unwrap();
    let t = Instant::now();
    let a = request(&sock, "status").unwrap();
    assert!(a.starts_with("error:") && a.contains("did not answer within"), "{a}");
    assert!(t.elapsed() < crate::runtime::CONTROL_ANSWER_TIMEOUT + Duration::from_secs(2), "{:?}", t.elapsed());
    // A server that accepts and never answers (a job suspended with SIGSTOP): the client gives up.
    let stopped = dir.path().join("stopped.sock");
    let _listener = UnixListener::bind(&stopped).unwrap();
    let t = Instant::now();
    let e = request(&stopped, "status").unwrap_err();
    assert!(matches!(e, AdminError::Timeout { .. }) && e.to_string().contains("hung or stopped"), "{e}");
    assert!(t.elapsed() < QUICK_ANSWER_TIMEOUT + Duration::from_secs(2), "{:?}", t.elapsed());
    assert_eq!(answer_timeout("savepoint to=/x"), DEFAULT_ANSWER_TIMEOUT);
    assert_eq!(answer_timeout("status"), QUICK_ANSWER_TIMEOUT);
}

#[test]
fn the_socket_is_owner_only_and_other_users_are_refused() {
    use std::os::unix::fs::PermissionsExt;
    assert!(super::peer::allowed(1000, 1000) && super::peer::allowed(0, 1000));
    assert!(!super::peer::allowed(1001, 1000));
    // Under /tmp, not $TMPDIR (which may be private), so that another user can reach the directory.
    let dir = tempfile::Builder::new().prefix("cutline-admin-").tempdir_in("/tmp").unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let sock = dir.path().join("admin.sock");
    let (control, _job) = fake_job(false);
    let _server = serve(control, &sock).unwrap();
    let mode = std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the socket file is owner-only");
    assert_eq!(super::peer::peer_uid(&UnixStream::connect(&sock).unwrap()).unwrap(), super::peer::own_uid());
    assert!(request(&sock, "ping").unwrap().starts_with("ok"), "the owner gets in");
    if super::peer::own_uid() != 0 {
        eprintln!("the other-user half of this test needs root (it connects as user nobody)");
        return;
    }
    // Another user: the file's mode keeps it out... (the client is this test binary, run as user
    // nobody, in `connect_as_another_user_when_asked`)
    let as_nobody = |sock: &std::path::Path| {
        use std::os::unix::process::CommandExt;
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "admin::tests::connect_as_another_user_when_asked", "--nocapture", "--test-threads=1"])
            .env(CONNECT_AS_CLIENT, sock)
            .uid(65534)
            .gid(65534)
            .output()
            .expect("the test binary runs as nobody");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let out = as_nobody(&sock);
    assert!(out.contains("connect: Permission denied"), "{out}");
    // ...and were the mode opened, the peer check still would.
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o666)).unwrap();
    let out = as_nobody(&sock);
    assert!(out.contains("error: user 65534 may not control this job"), "{out}");
}

/// Set to a socket path: [`connect_as_another_user_when_asked`] connects there, sends `ping` and
/// prints what happened (the other-user half of the socket test runs this binary as user nobody).
const CONNECT_AS_CLIENT: &str = "CUTLINE_TEST_CONNECT_AS_CLIENT";

#[test]
fn connect_as_another_user_when_asked() {
    use std::io::{Read, Write};
    let Some(sock) = std::env::var_os(CONNECT_AS_CLIENT) else { return };
    match UnixStream::connect(&sock) {
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => println!("connect: Permission denied"),
        Err(e) => println!("connect: {e}"),
        Ok(mut s) => {
            // The server may refuse (answer and close) before the request is written: a write error
            // here is part of the refusal, and the answer is still there to read.
            let _ = s.write_all(b"ping\n");
            let mut answer = String::new();
            if let Err(e) = s.read_to_string(&mut answer) {
                println!("read: {e}");
            }
            println!("{answer}");
        }
    }
}
