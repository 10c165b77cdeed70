//! The layout of a store: which file lives where (see the table in [`super`]), how names are parsed
//! back, temporary names, and the checks of names that come from callers or manifests. No I/O.

use crate::error::StorageError;
use cutline_core::{CheckpointId, Generation, OperatorId, SubtaskIndex};
use std::sync::atomic::{AtomicU64, Ordering};

pub(crate) const CHECKPOINTS_DIR: &str = "checkpoints";
pub(crate) const MANIFEST_NAME: &str = "_MANIFEST";
pub(crate) const GENERATIONS_DIR: &str = "generations";
pub(super) const META_PATH: &str = "job.meta";
pub(super) const FINISHED_PATH: &str = "FINISHED";
pub(super) const STATS_DIR: &str = "stats";

pub(crate) fn checkpoint_dir(id: CheckpointId) -> String {
    format!("{CHECKPOINTS_DIR}/chk-{:020}", id.0)
}

pub(super) fn manifest_path(id: CheckpointId) -> String {
    format!("{}/{MANIFEST_NAME}", checkpoint_dir(id))
}

pub(super) fn task_state_path(id: CheckpointId, operator: &OperatorId, subtask: SubtaskIndex) -> String {
    format!("{}/{}-{}.state", checkpoint_dir(id), operator, subtask.0)
}

pub(super) fn stats_path(id: CheckpointId) -> String {
    format!("{STATS_DIR}/chk-{:020}", id.0)
}

pub(super) fn parse_checkpoint_dir(name: &str) -> Option<CheckpointId> {
    parse_padded(name, "chk-").map(CheckpointId)
}

pub(crate) fn generation_path(generation: Generation) -> String {
    format!("{GENERATIONS_DIR}/gen-{:020}", generation.0)
}

pub(super) fn parse_generation_name(name: &str) -> Option<Generation> {
    parse_padded(name, "gen-").map(Generation)
}

/// `<prefix><20 digits>` -> the number.
fn parse_padded(name: &str, prefix: &str) -> Option<u64> {
    let digits = name.strip_prefix(prefix)?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// A fresh temporary name for a file that will be renamed to `name`.
pub(crate) fn temp_name(name: &str) -> String {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    format!(".{name}.{}-{seq}.tmp", std::process::id())
}

pub(crate) fn is_temp_name(name: &str) -> bool {
    name.starts_with('.') && name.ends_with(".tmp")
}

pub(super) fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

pub(super) fn validate_operator_id(operator: &OperatorId) -> Result<(), StorageError> {
    let s = operator.as_str();
    let ok = !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(StorageError::InvalidOperatorId(s.to_string()))
    }
}

/// A file reference from a manifest must stay inside the store.
pub(super) fn validate_file_ref(file: &str) -> Result<(), StorageError> {
    let ok = !file.contains('\\') && file.split('/').all(|part| !part.is_empty() && part != "." && part != "..");
    if ok {
        Ok(())
    } else {
        Err(StorageError::InvalidPath(file.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoint_dir_names_roundtrip_and_junk_is_rejected() {
        for id in [0u64, 1, 42, u64::MAX] {
            let dir = checkpoint_dir(CheckpointId(id));
            let name = dir.rsplit('/').next().unwrap();
            assert_eq!(name.len(), 24);
            assert_eq!(parse_checkpoint_dir(name), Some(CheckpointId(id)));
        }
        for junk in
            ["chk-12", "chk-0000000000000000000x", "chk-99999999999999999999", "chk--0000000000000000001", "notes", ""]
        {
            assert_eq!(parse_checkpoint_dir(junk), None, "{junk}");
        }
    }

    #[test]
    fn generation_record_names_roundtrip_and_junk_is_rejected() {
        assert_eq!(generation_path(Generation(7)), "generations/gen-00000000000000000007");
        for g in [0u64, 1, 42, u64::MAX] {
            let path = generation_path(Generation(g));
            let name = path.rsplit('/').next().unwrap();
            assert_eq!(parse_generation_name(name), Some(Generation(g)));
        }
        let temp = temp_name("gen-00000000000000000007");
        for junk in ["gen-7", "chk-00000000000000000007", "gen-0000000000000000000x", temp.as_str(), ""] {
            assert_eq!(parse_generation_name(junk), None, "{junk}");
        }
    }

    #[test]
    fn operator_ids_are_restricted_to_safe_characters() {
        for ok in ["a", "map.1", "A-b_c.9", "..", "-"] {
            assert!(validate_operator_id(&OperatorId::new(ok)).is_ok(), "{ok}");
        }
        for bad in ["", "a/b", "a\\b", "a b", "ü", "a:b", "x\n"] {
            assert!(matches!(
                validate_operator_id(&OperatorId::new(bad)),
                Err(StorageError::InvalidOperatorId(s)) if s == bad
            ));
        }
    }

    #[test]
    fn file_references_must_stay_inside_the_store() {
        for ok in ["checkpoints/chk-1/a.state", "x"] {
            assert!(validate_file_ref(ok).is_ok(), "{ok}");
        }
        for bad in ["", "/etc/passwd", "../x", "a/../b", "a//b", "a/./b", "a\\b", "a/"] {
            assert!(validate_file_ref(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn temp_names_are_recognised_and_never_collide_with_real_names() {
        let a = temp_name(MANIFEST_NAME);
        assert!(is_temp_name(&a));
        assert_ne!(a, temp_name(MANIFEST_NAME));
        for real in [MANIFEST_NAME, "job.meta", "FINISHED", ".x-0.state", "op-3.state"] {
            assert!(!is_temp_name(real), "{real}");
        }
    }
}
