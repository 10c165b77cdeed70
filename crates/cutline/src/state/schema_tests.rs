//! Tests of [`StateSchema`] and [`Evolve`]: old bytes read into changed types.

use super::*;
use std::collections::BTreeMap;

mod old {
    use serde::{Deserialize, Serialize};
    #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
    pub enum Kind {
        Plain,
        Weighted(u32),
        Named { name: String, score: i64 },
    }
    #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
    pub struct State {
        pub count: u64,
        pub total: i64,
        pub label: Option<String>,
        pub by_key: std::collections::BTreeMap<u32, f64>,
        pub pair: (u8, bool),
    }
}

mod new {
    use serde::{Deserialize, Serialize};
    #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
    pub enum Kind {
        Plain,
        Weighted(u32),
        Named { name: String, score: i64 },
    }
    /// A field added with a default, one renamed with an alias, one removed (`pair`).
    #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
    pub struct State {
        #[serde(alias = "count")]
        pub events: u64,
        pub total: i64,
        pub label: Option<String>,
        pub by_key: std::collections::BTreeMap<u32, f64>,
        #[serde(default)]
        pub added: Vec<String>,
    }
    #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
    pub struct Retyped {
        pub count: String,
    }
    #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
    pub struct NoDefault {
        pub count: u64,
        pub required: u64,
    }
}

fn sample() -> old::State {
    old::State {
        count: 300,
        total: -7,
        label: Some("x".into()),
        by_key: BTreeMap::from([(1, 0.5), (70_000, -2.0)]),
        pair: (200, true),
    }
}

#[test]
fn a_top_level_enum_is_traced_whole_and_a_nested_one_leaves_the_name_alone() {
    let s = StateSchema::of::<old::Kind>();
    let (_, registry): (Format, Registry) =
        serde_json::from_value(s.shape.clone().expect("a top-level enum is traced")).unwrap();
    let Some(ContainerFormat::Enum(variants)) = registry.get("Kind") else { panic!("{registry:?}") };
    assert_eq!(variants.len(), 3);
    assert_eq!(StateSchema::decode(&s.encode()).unwrap(), s, "the schema round-trips its encoding");
    let bytes = postcard::to_allocvec(&old::Kind::Named { name: "n".into(), score: -1 }).unwrap();
    let (k, _): (new::Kind, _) = Evolve::new(&s).unwrap().unwrap().take(&bytes).unwrap();
    assert_eq!(k, new::Kind::Named { name: "n".into(), score: -1 });
    let nested = StateSchema::of::<(u64, Vec<old::Kind>)>();
    assert!(nested.shape.is_none() && nested.type_name.contains("Kind"), "{nested:?}");
    assert!(Evolve::new(&nested).unwrap().is_none());
}

#[test]
fn a_compatible_change_reads_the_old_bytes() {
    let old_schema = StateSchema::of::<(u64, old::State)>();
    let new_schema = StateSchema::of::<(u64, new::State)>();
    assert!(!old_schema.same_as(&new_schema));
    assert!(old_schema.same_as(&StateSchema::of::<(u64, old::State)>()));
    let mut bytes = postcard::to_allocvec(&(42u64, sample())).unwrap();
    bytes.extend(postcard::to_allocvec(&(43u64, sample())).unwrap());
    let evolve = Evolve::new(&old_schema).unwrap().unwrap();
    let ((k, v), rest): ((u64, new::State), _) = evolve.take(&bytes).unwrap();
    assert_eq!(k, 42);
    let s = sample();
    assert_eq!(v, new::State { events: s.count, total: s.total, label: s.label, by_key: s.by_key, added: vec![] });
    let ((k, _), rest): ((u64, new::State), _) = evolve.take(rest).unwrap();
    assert_eq!((k, rest.len()), (43, 0), "the reader stops exactly at the next entry");
}

#[test]
fn an_incompatible_change_is_an_error_not_a_value() {
    let old_schema = StateSchema::of::<(u64, old::State)>();
    let bytes = postcard::to_allocvec(&(1u64, sample())).unwrap();
    let evolve = Evolve::new(&old_schema).unwrap().unwrap();
    let e = evolve.take::<(u64, new::Retyped)>(&bytes).expect_err("u64 is no String");
    assert!(e.contains("invalid type"), "{e}");
    let e = evolve.take::<(u64, new::NoDefault)>(&bytes).expect_err("no default");
    assert!(e.contains("missing field `required`"), "{e}");
    // Damaged bytes are an error too.
    assert!(evolve.take::<(u64, new::State)>(&bytes[..bytes.len() - 3]).is_err());
}
