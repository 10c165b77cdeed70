//! What `cutline status` says.

use super::*;

#[derive(Debug)]
pub(crate) struct Status {
    pub(crate) completed: u64,
    /// The `key=value` settings line.
    pub(crate) settings: String,
    pub(crate) checkpoints: Vec<CheckpointLine>,
    pub(crate) text: String,
}

#[derive(Debug)]
pub(crate) struct CheckpointLine {
    pub(crate) id: u64,
    pub(crate) unaligned_tasks: u32,
    pub(crate) savepoint: bool,
}

pub(crate) fn parse_status(text: &str) -> Status {
    let job = text.lines().find(|l| l.starts_with("job: ")).unwrap_or_else(|| panic!("no job line in\n{text}"));
    let completed = job
        .split(", ")
        .find_map(|p| p.strip_suffix(" checkpoints completed"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no completed count in {job:?}"));
    let settings = text
        .lines()
        .find_map(|l| l.strip_prefix("settings: "))
        .unwrap_or_else(|| panic!("no settings line in\n{text}"))
        .to_string();
    let checkpoints = text
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("chk-"))
        .map(|rest| {
            let id = rest.split_whitespace().next().and_then(|n| n.parse().ok()).expect("checkpoint id");
            let unaligned_tasks = rest
                .split_once("unaligned ")
                .and_then(|(_, r)| r.split('/').next())
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("no unaligned count in {rest:?}"));
            CheckpointLine { id, unaligned_tasks, savepoint: rest.trim_end().ends_with("savepoint") }
        })
        .collect();
    Status { completed, settings, checkpoints, text: text.to_string() }
}

/// The job's status, or None while no job answers.
pub(crate) fn try_status(state: &Path) -> Option<Status> {
    let e = cli(&state_arg("status", state));
    e.status.success().then(|| parse_status(&e.stdout))
}

/// Wait until the job answers and has completed at least `n` checkpoints.
pub(crate) fn wait_for_checkpoints(run: &mut Running, state: &Path, n: u64) -> Status {
    wait_until(&format!("{n} completed checkpoints of {}", run.what), || {
        if let Some(s) = run.child.try_wait().expect("try_wait") {
            panic!("the run exited ({s}) before {n} checkpoints\n{}", run.logs());
        }
        try_status(state).filter(|s| s.completed >= n)
    })
}

/// The settings `cutline tune` prints (one `key=value` per line) as one line.
pub(crate) fn tuned(stdout: &str) -> String {
    stdout.lines().filter(|l| l.starts_with("  ")).map(str::trim).collect::<Vec<_>>().join(" ")
}

pub(crate) fn socket_of(state: &Path) -> PathBuf {
    state.join(cutline::admin::SOCKET_FILE)
}

/// `(device, inode)` of every file under `dir`, with its path (no symbolic links allowed).
pub(crate) fn files_under(dir: &Path) -> Vec<(PathBuf, (u64, u64))> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        // A running job's retention may remove files while they are listed: skip what vanished.
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for e in entries {
            let Ok(e) = e else { continue };
            let p = e.path();
            let Ok(m) = std::fs::symlink_metadata(&p) else { continue };
            assert!(!m.file_type().is_symlink(), "{} is a symbolic link", p.display());
            if m.is_dir() {
                todo.push(p);
            } else {
                out.push((p, (m.dev(), m.ino())));
            }
        }
    }
    out
}

/// The checkpoint id in a committed output file name `part-<uid>-<subtask>-<checkpoint>`.
pub(crate) fn part_checkpoint(name: &str) -> Option<u64> {
    name.strip_prefix("part-")?.rsplit('-').next()?.parse().ok()
}
