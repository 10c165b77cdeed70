//! Tests of the stores. Every scenario runs against both [`crate::LocalDirStore`] and
//! [`crate::MemStore`] through the same `&dyn CheckpointStore`, via [`Harness`], which also gives raw
//! access to the files underneath (to simulate crashes and corruption).

mod faulty;
mod gc;
mod generations;
mod local;
mod scenarios;

use crate::{CheckpointStore, LocalDirStore, Manifest, MemStore, TaskStateHandle};
use cutline_core::{CheckpointId, Generation};
use std::path::Path;
use std::sync::Arc;

type RawPut = Box<dyn Fn(&str, &[u8])>;
type RawGet = Box<dyn Fn(&str) -> Option<Vec<u8>>>;
type RawList = Box<dyn Fn() -> Vec<String>>;

/// A store under test plus raw access to its files, by path relative to the root.
pub(crate) struct Harness {
    pub name: &'static str,
    pub store: Arc<dyn CheckpointStore>,
    put_raw: RawPut,
    get_raw: RawGet,
    files: RawList,
    _dir: Option<tempfile::TempDir>,
}

impl Harness {
    pub fn mem() -> Harness {
        let store = Arc::new(MemStore::new());
        let (put, get, list) = (store.clone(), store.clone(), store.clone());
        Harness {
            name: "mem",
            store,
            put_raw: Box::new(move |p, b| put.raw_put(p, b)),
            get_raw: Box::new(move |p| get.raw_get(p)),
            files: Box::new(move || list.paths()),
            _dir: None,
        }
    }

    pub fn local() -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("store");
        let store = Arc::new(LocalDirStore::open(&root).unwrap());
        let (r1, r2, r3) = (root.clone(), root.clone(), root);
        Harness {
            name: "local",
            store,
            put_raw: Box::new(move |p, b| {
                let path = r1.join(p);
                std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                std::fs::write(path, b).unwrap();
            }),
            get_raw: Box::new(move |p| std::fs::read(r2.join(p)).ok()),
            files: Box::new(move || {
                let mut out = Vec::new();
                walk(&r3, "", &mut out);
                out.sort();
                out
            }),
            _dir: Some(dir),
        }
    }

    pub fn both() -> [Harness; 2] {
        [Harness::mem(), Harness::local()]
    }

    /// An empty store of the same kind.
    pub fn fresh(&self) -> Harness {
        match self.name {
            "mem" => Harness::mem(),
            _ => Harness::local(),
        }
    }

    pub fn put_raw(&self, path: &str, bytes: &[u8]) {
        (self.put_raw)(path, bytes)
    }

    pub fn get_raw(&self, path: &str) -> Option<Vec<u8>> {
        (self.get_raw)(path)
    }

    /// All files under the root, sorted.
    pub fn files(&self) -> Vec<String> {
        (self.files)()
    }

    /// Every file with its bytes.
    pub fn snapshot(&self) -> Vec<(String, Vec<u8>)> {
        let files = self.files();
        files
            .into_iter()
            .map(|p| {
                let bytes = self.get_raw(&p).unwrap();
                (p, bytes)
            })
            .collect()
    }

    pub fn flip_byte(&self, path: &str, at: usize) {
        let mut bytes = self.get_raw(path).unwrap();
        bytes[at] ^= 0xFF;
        self.put_raw(path, &bytes);
    }
}

fn walk(root: &Path, rel: &str, out: &mut Vec<String>) {
    for entry in std::fs::read_dir(root.join(rel)).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().into_string().unwrap();
        let child = if rel.is_empty() { name } else { format!("{rel}/{name}") };
        if entry.file_type().unwrap().is_dir() {
            walk(root, &child, out);
        } else {
            out.push(child);
        }
    }
}

pub(crate) fn manifest(id: u64, tasks: Vec<TaskStateHandle>) -> Manifest {
    manifest_of_generation(id, 1, tasks)
}

pub(crate) fn manifest_of_generation(id: u64, generation: u64, tasks: Vec<TaskStateHandle>) -> Manifest {
    Manifest::new("job-fingerprint", CheckpointId(id), Generation(generation), 1_000 + id, false, tasks)
}

pub(crate) fn dir_of(id: u64) -> String {
    crate::store::layout::checkpoint_dir(CheckpointId(id))
}
