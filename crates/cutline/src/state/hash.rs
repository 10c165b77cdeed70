//! The stable key hash that maps keys to key groups. The checkpoint format depends on it: the same key
//! must land in the same key group in every process and every version of cutline.

use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// A stable, fast 64-bit hasher: the same key hashes to the same key group in every process and every
/// version of cutline (the checkpoint format depends on it; do not change it without a format version).
#[derive(Clone, Copy, Default)]
pub struct StableHasher {
    h: u64,
}

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl Hasher for StableHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.write_u64(u64::from_le_bytes(c.try_into().expect("8 bytes")));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.write_u64(u64::from_le_bytes(w) ^ (rest.len() as u64) << 59);
        }
    }
    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.write_u64(i as u64)
    }
    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.write_u64(i as u64)
    }
    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.h = (self.h.rotate_left(5) ^ i).wrapping_mul(SEED);
    }
    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.write_u64(i as u64)
    }
    #[inline]
    fn finish(&self) -> u64 {
        splitmix64(self.h)
    }
}

/// The splitmix64 finaliser; also the benchmark's key generator.
#[inline]
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Stable hash of a key.
#[inline]
pub fn stable_hash<K: Hash + ?Sized>(key: &K) -> u64 {
    let mut h = StableHasher::default();
    key.hash(&mut h);
    h.finish()
}

#[inline]
pub(crate) fn key_group_of_hash(hash: u64, max_parallelism: u32) -> u32 {
    // The same as `%` (a 64-bit division costs tens of cycles per record; the default number of
    // key groups is a power of two).
    if max_parallelism.is_power_of_two() {
        (hash & (max_parallelism as u64 - 1)) as u32
    } else {
        (hash % max_parallelism as u64) as u32
    }
}

/// Hashes the key of a record (the key extractor composed with [`stable_hash`]).
pub(crate) type KeyHasher<T> = Arc<dyn Fn(&T) -> u64 + Send + Sync>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stable_hash_is_pinned() {
        // A change here moves every key's state to another key group in old checkpoints: it needs a
        // new snapshot format version.
        assert_eq!(stable_hash(&42u64), 0x1fbb_8ac5_2a8b_7f5e);
        assert_eq!(stable_hash("word"), 0x7a35_0187_28c5_fc18);
    }
}
