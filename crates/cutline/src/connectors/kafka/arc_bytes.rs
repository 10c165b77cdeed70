//! Serde for the records of a [`super::KafkaTxn`]: an `Arc<Vec<u8>>` as one byte string, so a
//! checkpoint holds them as they are and a commit shares them without a copy.

use serde::{Deserializer, Serializer};
use std::sync::Arc;
pub fn serialize<S: Serializer>(v: &Arc<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_bytes(v)
}
pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Arc<Vec<u8>>, D::Error> {
    struct V;
    impl<'de> serde::de::Visitor<'de> for V {
        type Value = Vec<u8>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("bytes")
        }
        fn visit_bytes<E>(self, v: &[u8]) -> Result<Vec<u8>, E> {
            Ok(v.to_vec())
        }
        fn visit_byte_buf<E>(self, v: Vec<u8>) -> Result<Vec<u8>, E> {
            Ok(v)
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut a: A) -> Result<Vec<u8>, A::Error> {
            let mut out = Vec::new();
            while let Some(b) = a.next_element()? {
                out.push(b);
            }
            Ok(out)
        }
    }
    d.deserialize_byte_buf(V).map(Arc::new)
}
