//! [`KeyedState`]: a keyed operator's value state in the backend its job chose
//! ([`StateBackend`]): the copy-on-write table in memory, or the local store on disk (feature
//! `spill`). Both snapshot to the same [`ElementState`] and restore from it.

use crate::error::TaskError;
use crate::state::{Copies, CowMap, Encoded, Frozen, Key, StateBackend, StateImage, StateValue};
use cutline_core::{CheckpointId, KeyGroupRange};

/// A keyed operator's value state. (One per keyed operator, so the variants' sizes do not matter.)
#[allow(clippy::large_enum_variant)]
pub(crate) enum KeyedState<K, S> {
    Memory(CowMap<K, Option<S>>),
    #[cfg(feature = "spill")]
    Disk(crate::state::DiskMap<K, S>),
}

#[cfg_attr(not(feature = "spill"), allow(unused_variables))]
impl<K: Key, S: StateValue> KeyedState<K, S> {
    /// Empty state of operator `uid` for `range`, in `backend`; `name` names the task incarnation
    /// (unique across restarts and processes).
    pub fn new(
        backend: &StateBackend,
        uid: &str,
        name: &str,
        range: KeyGroupRange,
        max_parallelism: u32,
    ) -> Result<Self, TaskError> {
        let err = |message: String| TaskError::State { uid: uid.to_string(), message };
        backend.check().map_err(err)?;
        match backend {
            StateBackend::Memory => Ok(KeyedState::Memory(CowMap::incremental(range, max_parallelism))),
            #[cfg(feature = "spill")]
            StateBackend::Disk { dir, cache_entries } => Ok(KeyedState::Disk(
                crate::state::DiskMap::create(dir, name, range, max_parallelism, *cache_entries).map_err(err)?,
            )),
            #[cfg(not(feature = "spill"))]
            StateBackend::Disk { .. } => unreachable!("refused by check: {name}"),
        }
    }

    /// `k`'s state, if it has any, for reading and writing.
    #[inline(always)]
    pub fn get_mut(&mut self, uid: &str, k: &K) -> Result<Option<&mut Option<S>>, TaskError> {
        match self {
            KeyedState::Memory(m) => Ok(m.get_mut(k)),
            #[cfg(feature = "spill")]
            KeyedState::Disk(d) => d.get_mut(k).map_err(|m| failed(uid, m)),
        }
    }

    /// Set `k`'s state. Whether it had state.
    #[inline(always)]
    pub fn insert(&mut self, uid: &str, k: K, value: Option<S>) -> Result<bool, TaskError> {
        match self {
            KeyedState::Memory(m) => Ok(m.insert(k, value).is_some()),
            #[cfg(feature = "spill")]
            KeyedState::Disk(d) => d.insert(k, value).map_err(|m| failed(uid, m)),
        }
    }

    /// Remove `k`'s state.
    #[inline(always)]
    pub fn remove(&mut self, uid: &str, k: &K) -> Result<(), TaskError> {
        match self {
            KeyedState::Memory(m) => {
                m.remove(k);
                Ok(())
            }
            #[cfg(feature = "spill")]
            KeyedState::Disk(d) => d.insert(k.clone(), None).map(drop).map_err(|m| failed(uid, m)),
        }
    }

    /// A restore starts filling it (`true`) or is done (`false`).
    pub fn restoring(&mut self, uid: &str, on: bool) -> Result<(), TaskError> {
        match self {
            KeyedState::Memory(_) => Ok(()),
            #[cfg(feature = "spill")]
            KeyedState::Disk(d) => d.track_changes(!on).map_err(|m| failed(uid, m)),
        }
    }

    /// Whether a restore hands this backend each key group's records sorted and still encoded
    /// ([`restore_sorted`](Self::restore_sorted)) rather than key by key.
    pub fn restores_sorted(&self) -> bool {
        match self {
            KeyedState::Memory(_) => false,
            #[cfg(feature = "spill")]
            KeyedState::Disk(_) => true,
        }
    }

    /// Fill key group `kg` with `records` (encoded keys and values, sorted by key), during a
    /// restore, on a backend that [`restores_sorted`](Self::restores_sorted).
    pub fn restore_sorted(&mut self, uid: &str, kg: u32, records: &[(&[u8], &[u8])]) -> Result<(), TaskError> {
        match self {
            KeyedState::Memory(_) => Err(TaskError::State {
                uid: uid.to_string(),
                message: format!("restoring key group {kg} from encoded records into memory (a bug)"),
            }),
            #[cfg(feature = "spill")]
            KeyedState::Disk(d) => d.restore_sorted(kg, records).map_err(|m| failed(uid, m)),
        }
    }

    /// Pages copied and entries saved since the last call (memory only).
    pub fn take_copies(&mut self) -> Copies {
        match self {
            KeyedState::Memory(m) => m.take_copies(),
            #[cfg(feature = "spill")]
            KeyedState::Disk(_) => Copies::default(),
        }
    }

    /// The state at the barrier of `checkpoint`, as an image for the snapshot writer (incremental on
    /// top of `base` if the writer allows).
    pub fn image(
        &mut self,
        uid: &str,
        checkpoint: CheckpointId,
        base: Option<CheckpointId>,
    ) -> Result<Box<dyn StateImage>, TaskError> {
        match self {
            KeyedState::Memory(m) => {
                Ok(Box::new(KeyedImage { uid: uid.to_string(), frozen: m.freeze(checkpoint, base) }))
            }
            #[cfg(feature = "spill")]
            KeyedState::Disk(d) => {
                let frozen = d.freeze(checkpoint, base).map_err(|m| failed(uid, m))?;
                Ok(Box::new(crate::state::DiskImage { uid: uid.to_string(), frozen }))
            }
        }
    }

    /// Call `f` for every key with state until it returns false.
    pub fn for_each_mut(&mut self, uid: &str, f: impl FnMut(&K, &mut Option<S>) -> bool) -> Result<(), TaskError> {
        match self {
            KeyedState::Memory(m) => {
                m.for_each_mut(f);
                Ok(())
            }
            #[cfg(feature = "spill")]
            KeyedState::Disk(d) => d.for_each_mut(f).map_err(|m| failed(uid, m)),
        }
    }
}

#[cfg(feature = "spill")]
#[cold]
fn failed(uid: &str, message: String) -> TaskError {
    TaskError::State { uid: uid.to_string(), message }
}

/// In-memory keyed state as it was at a barrier: its pages, shared with the task.
struct KeyedImage<K, S> {
    uid: String,
    frozen: Frozen<K, Option<S>>,
}

impl<K: Key, S: StateValue> StateImage for KeyedImage<K, S> {
    fn encode(self: Box<Self>, incremental: bool) -> Result<Encoded, String> {
        self.frozen.encode(&self.uid, Option::as_ref, incremental).map(Encoded::from)
    }
}
