use super::*;

/// Test shorthand: what a connector's error says.
trait Says {
    fn contains(&self, part: &str) -> bool;
}

impl Says for ConnectorError {
    fn contains(&self, part: &str) -> bool {
        self.message().contains(part)
    }
}

fn is_permanent(e: &ConnectorError) -> bool {
    e.is_permanent()
}

fn source(path: &std::path::Path) -> LineFileSource {
    let mut s = LineFileSource::new(path);
    s.open(0, 1, None).unwrap();
    s
}

/// Poll until the end; every line read, or the first error.
fn read_all(s: &mut LineFileSource) -> ConnectorResult<Vec<String>> {
    let mut out = Vec::new();
    while s.poll(&mut out, 1024)? != SourceStatus::Finished {}
    Ok(out)
}

/// The error that ends reading; the number of lines read if none does.
fn read_err(s: &mut LineFileSource, what: &str) -> ConnectorError {
    match read_all(s) {
        Ok(lines) => panic!("{what}: no error, {} lines read", lines.len()),
        Err(e) => e,
    }
}

#[test]
fn a_line_over_the_limit_is_a_permanent_failure_naming_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("in.txt");
    std::fs::write(&path, format!("short\n{}\nafter\n", "x".repeat(100))).unwrap();
    let mut s = LineFileSource::new(&path).with_max_line_bytes(64);
    s.open(0, 1, None).unwrap();
    let err = read_err(&mut s, "line 2 is too long");
    assert!(is_permanent(&err), "{err}");
    assert!(err.contains("line 2 of") && err.contains("longer than 64 bytes"), "{err}");
    assert_eq!(MAX_LINE_BYTES, 16 << 20, "the default limit");
}

#[test]
fn long_lines_are_read_exactly_and_a_batch_of_them_is_bounded_in_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("in.txt");
    let long: Vec<String> = (0..10).map(|i| format!("{i}{}", "y".repeat(300 << 10))).collect();
    let text = format!("{}\r\nshort\n{}", long.join("\n"), "last without newline");
    std::fs::write(&path, &text).unwrap();
    let mut s = source(&path);
    let mut all = Vec::new();
    loop {
        let mut out = Vec::new();
        let status = s.poll(&mut out, 1024).unwrap();
        let bytes: usize = out.iter().map(String::len).sum();
        assert!(bytes < MAX_BATCH_BYTES + (301 << 10), "a poll produced {bytes} bytes in {} lines", out.len());
        all.extend(out);
        if status == SourceStatus::Finished {
            break;
        }
    }
    let mut want = long.clone();
    want.push("short".into());
    want.push("last without newline".into());
    assert_eq!(all, want);
    assert_eq!(s.offset().byte, text.len() as u64);
}

#[test]
fn input_truncated_while_the_job_reads_it_is_a_permanent_failure_regression_truncated_input() {
    // The source read to the (new) end of a truncated file and reported it finished: the job ended
    // with output that matched neither file.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("in.txt");
    let lines: Vec<String> = (0..20_000).map(|i| format!("line {i}")).collect();
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    let mut s = source(&path);
    let mut out = Vec::new();
    s.poll(&mut out, 1024).unwrap();
    let read = s.offset().byte;
    std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(read / 2).unwrap();
    let err = read_err(&mut s, "the truncation is noticed");
    assert!(is_permanent(&err) && err.contains("truncated") && err.contains("in.txt"), "{err}");
    // Truncated ahead of the reader: what is left would read to its end, but it is not the input.
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    let mut s = source(&path);
    s.poll(&mut out, 10).unwrap();
    let ahead = 2 * READ_BUFFER_BYTES as u64; // beyond what the reader has buffered, short of the end
    assert!(ahead < std::fs::metadata(&path).unwrap().len());
    std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(ahead).unwrap();
    let err = read_err(&mut s, "the truncation ahead is noticed");
    assert!(is_permanent(&err) && err.contains("truncated"), "{err}");
}

#[test]
fn input_replaced_or_removed_while_the_job_reads_it_is_noticed_at_the_end() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("in.txt");
    std::fs::write(&path, "a b\nc d\n").unwrap();
    let mut out = Vec::new();
    // Replaced by another file (renamed over it).
    let mut s = source(&path);
    s.poll(&mut out, 1).unwrap();
    let other = dir.path().join("other.txt");
    std::fs::write(&other, "X Y\nc d\ne f\n").unwrap();
    std::fs::rename(&other, &path).unwrap();
    let err = read_err(&mut s, "replaced");
    assert!(is_permanent(&err) && err.contains("replaced"), "{err}");
    // Removed.
    let mut s = source(&path);
    s.poll(&mut out, 1).unwrap();
    std::fs::rename(&path, dir.path().join("moved.txt")).unwrap();
    let err = read_err(&mut s, "removed");
    assert!(is_permanent(&err) && err.contains("removed"), "{err}");
    std::fs::rename(dir.path().join("moved.txt"), &path).unwrap();
    // Unchanged: it finishes.
    let mut s = source(&path);
    assert_eq!(read_all(&mut s).unwrap(), ["X Y", "c d", "e f"]);
}

#[test]
fn a_restore_checks_the_last_line_read_is_still_there() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("in.txt");
    std::fs::write(&path, "one\ntwo\nthree\n").unwrap();
    let mut s = source(&path);
    let mut out = Vec::new();
    s.poll(&mut out, 2).unwrap();
    let at = s.offset();
    assert_eq!(at.last_line.map(|c| c.start), Some(4));
    // The same input: it resumes at line 3.
    let mut r = LineFileSource::new(&path);
    r.open(0, 1, Some(at.clone())).unwrap();
    assert_eq!(read_all(&mut r).unwrap(), ["three"]);
    // Same length, other content before the offset: refused, permanently.
    std::fs::write(&path, "one\nTWO\nthree\n").unwrap();
    let err = LineFileSource::new(&path).open(0, 1, Some(at.clone())).expect_err("changed");
    assert!(is_permanent(&err) && err.contains("line 2"), "{err}");
    // Shorter than the offset: refused, permanently.
    std::fs::write(&path, "one\n").unwrap();
    let err = LineFileSource::new(&path).open(0, 1, Some(at)).expect_err("shorter");
    assert!(is_permanent(&err) && err.contains("resumes at byte 8"), "{err}");
}

#[test]
fn offsets_of_checkpoints_taken_before_the_line_check_still_decode() {
    #[derive(Serialize)]
    struct OldLineOffset {
        byte: u64,
        line: u64,
    }
    let old = postcard::to_allocvec(&OldLineOffset { byte: 123, line: 7 }).unwrap();
    let decoded: LineOffset = postcard::from_bytes(&old).unwrap();
    assert_eq!(decoded, LineOffset { byte: 123, line: 7, last_line: None, read_before: vec![] });
    let new = LineOffset {
        byte: 123,
        line: 7,
        last_line: Some(LineCheck { start: 100, crc32: 0xdead_beef }),
        read_before: vec![],
    };
    let decoded: LineOffset = postcard::from_bytes(&postcard::to_allocvec(&new).unwrap()).unwrap();
    assert_eq!(decoded, new);
}

/// Subtasks read a file at their own pace and are restored (their offsets through postcard, as a
/// checkpoint keeps them) at random parallelisms, again and again: every line is read exactly once.
#[test]
fn random_rescales_read_every_line_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = 11u64;
    let mut rand = |bound: u64| {
        rng = crate::splitmix64(rng);
        rng % bound
    };
    for round in 0..60 {
        let lines = rand(300);
        let path = dir.path().join(format!("in-{round}"));
        let text: String = (0..lines).map(|i| format!("{i}\n")).collect();
        std::fs::write(&path, text).unwrap();
        let mut seen = vec![0u32; lines as usize];
        let mut p = 1 + rand(5) as u32;
        let mut offsets: Vec<Option<LineOffset>> = vec![None; p as usize];
        loop {
            let mut all_done = true;
            for s in 0..p {
                let mut src = LineFileSource::new(&path);
                src.open(s, p, offsets[s as usize].take()).unwrap();
                let mut out = Vec::new();
                let status = src.poll(&mut out, rand(20) as usize).unwrap();
                for l in out {
                    seen[l.parse::<usize>().unwrap()] += 1;
                }
                all_done &= status == SourceStatus::Finished;
                offsets[s as usize] =
                    Some(postcard::from_bytes(&postcard::to_allocvec(&src.offset()).unwrap()).unwrap());
            }
            if all_done {
                break;
            }
            if rand(3) == 0 {
                let old: Vec<LineOffset> = offsets.iter().map(|o| o.clone().unwrap()).collect();
                let new_p = 1 + rand(5) as u32;
                if let Ok(new) =
                    (0..new_p).map(|s| LineFileSource::rescale(old.clone(), s, new_p)).collect::<Result<Vec<_>, _>>()
                {
                    offsets = new;
                    p = new_p;
                }
            }
        }
        assert!(seen.iter().all(|c| *c == 1), "a line read twice or never: {seen:?}");
    }
}

#[test]
fn offsets_that_are_not_positions_in_one_file_are_a_damaged_checkpoint() {
    let at = |byte, line| LineOffset { byte, line, last_line: None, read_before: vec![] };
    let e = LineFileSource::rescale(vec![at(10, 2), at(5, 3)], 0, 1).unwrap_err();
    assert!(e.contains("damaged"), "{e}");
}
