//! The structure of a state type, recorded with its state so that a changed type is noticed at
//! restore ([`StateSchema`]), and the slow path that reads state written with another structure
//! ([`Evolve`]): the old bytes are decoded by the old structure into a self-describing value, which
//! the new type deserialises by field name. So serde's own rules decide what is compatible: a new
//! field needs `#[serde(default)]`, a renamed one `#[serde(alias = "old")]`, a removed one is
//! ignored; anything else is an error that names both types.
//!
//! The structure comes from tracing the type's `Deserialize` (the `serde-reflection` crate). A type
//! it cannot trace completely (a hand-written `Deserialize` that validates, an enum nested inside
//! it) is recorded by name only: a change of its name is refused, a change that keeps the name is
//! not noticed (as before schemas were recorded).

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_reflection::{ContainerFormat, Format, Registry, Tracer, TracerConfig, VariantFormat};

/// Containers nested deeper than this are refused when old state is read (no stack overflow on a
/// damaged or recursive schema).
const MAX_DEPTH: usize = 64;

/// A state type: its name, and its structure (a `(Format, Registry)` of `serde-reflection`, kept as
/// JSON: the tracer's own types are not `Send`) when it can be traced.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct StateSchema {
    pub type_name: String,
    pub shape: Option<Value>,
}

impl StateSchema {
    /// The schema of `T`. Its structure is recorded when `T` can be traced completely: a
    /// hand-written `Deserialize` that validates, and an enum nested inside the type (the tracer
    /// explores the variants of the top-level type only), leave the name alone.
    pub fn of<T: DeserializeOwned>() -> StateSchema {
        let type_name = std::any::type_name::<T>().to_string();
        let mut tracer = Tracer::new(TracerConfig::default());
        let shape = match tracer.trace_simple_type::<T>() {
            Ok((format, _)) => {
                tracer.registry().ok().and_then(|registry| serde_json::to_value((format, registry)).ok())
            }
            Err(_) => None,
        };
        StateSchema { type_name, shape }
    }

    /// The schema as stored in a checkpoint.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a traced schema serialises")
    }

    pub fn decode(bytes: &[u8]) -> Result<StateSchema, String> {
        serde_json::from_slice(bytes).map_err(|e| format!("decoding the recorded state type: {e}"))
    }

    /// State written with `self` reads as `now` without conversion.
    pub fn same_as(&self, now: &StateSchema) -> bool {
        match (&self.shape, &now.shape) {
            (Some(a), Some(b)) => a == b,
            _ => self.type_name == now.type_name,
        }
    }
}

/// Reads state written with an older structure.
pub(crate) struct Evolve {
    format: Format,
    registry: Registry,
}

impl Evolve {
    /// `Ok(None)` when the old structure is unknown (its type could not be traced).
    pub fn new(old: &StateSchema) -> Result<Option<Evolve>, String> {
        let Some(shape) = &old.shape else { return Ok(None) };
        let (format, registry) = serde_json::from_value(shape.clone())
            .map_err(|e| format!("decoding the recorded structure of `{}`: {e}", old.type_name))?;
        Ok(Some(Evolve { format, registry }))
    }

    /// Read one value off the front of `bytes` (postcard, written with the old structure) as a `T`.
    pub fn take<'b, T: DeserializeOwned>(&self, bytes: &'b [u8]) -> Result<(T, &'b [u8]), String> {
        let mut rest = bytes;
        let value = self.read(&self.format, &mut rest, 0)?;
        let t = serde_json::from_value(value).map_err(|e| e.to_string())?;
        Ok((t, rest))
    }

    fn read(&self, f: &Format, b: &mut &[u8], depth: usize) -> Result<Value, String> {
        if depth > MAX_DEPTH {
            return Err(format!("the recorded state type nests deeper than {MAX_DEPTH}"));
        }
        let d = depth + 1;
        Ok(match f {
            Format::Variable(_) => return Err("the recorded state type is incomplete".into()),
            Format::TypeName(name) => {
                let c = self.registry.get(name).ok_or_else(|| format!("the recorded state type lacks `{name}`"))?;
                self.container(c, b, d)?
            }
            Format::Unit => Value::Null,
            Format::Bool => match byte(b)? {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                x => return Err(format!("a bool encoded as {x}")),
            },
            Format::U8 => Value::from(byte(b)?),
            Format::I8 => Value::from(byte(b)? as i8),
            Format::U16 | Format::U32 | Format::U64 => Value::from(varint(b)? as u64),
            Format::I16 | Format::I32 | Format::I64 => Value::from(zigzag(varint(b)?) as i64),
            Format::U128 => wide(varint(b)?)?,
            Format::I128 => {
                let v = zigzag(varint(b)?);
                i64::try_from(v).map(Value::from).map_err(|_| format!("{v} does not fit a restorable i64"))?
            }
            Format::F32 => float(f32::from_le_bytes(take::<4>(b)?) as f64)?,
            Format::F64 => float(f64::from_le_bytes(take::<8>(b)?))?,
            Format::Char | Format::Str => Value::String(string(b)?),
            Format::Bytes => {
                let n = length(b)?;
                let bytes = split(b, n)?;
                Value::Array(bytes.iter().map(|x| Value::from(*x)).collect())
            }
            Format::Option(inner) => match byte(b)? {
                0 => Value::Null,
                1 => self.read(inner, b, d)?,
                x => return Err(format!("an option tagged {x}")),
            },
            Format::Seq(inner) => {
                let n = length(b)?;
                Value::Array((0..n).map(|_| self.read(inner, b, d)).collect::<Result<_, _>>()?)
            }
            Format::Map { key, value } => {
                let n = length(b)?;
                let mut m = serde_json::Map::new();
                for _ in 0..n {
                    let k = match self.read(key, b, d)? {
                        Value::String(s) => s,
                        Value::Number(x) => x.to_string(),
                        Value::Bool(x) => x.to_string(),
                        other => return Err(format!("a map key {other} cannot be read into a changed type")),
                    };
                    m.insert(k, self.read(value, b, d)?);
                }
                Value::Object(m)
            }
            Format::Tuple(items) => Value::Array(items.iter().map(|f| self.read(f, b, d)).collect::<Result<_, _>>()?),
            Format::TupleArray { content, size } => {
                Value::Array((0..*size).map(|_| self.read(content, b, d)).collect::<Result<_, _>>()?)
            }
        })
    }

    fn container(&self, c: &ContainerFormat, b: &mut &[u8], d: usize) -> Result<Value, String> {
        Ok(match c {
            ContainerFormat::UnitStruct => Value::Null,
            ContainerFormat::NewTypeStruct(f) => self.read(f, b, d)?,
            ContainerFormat::TupleStruct(fs) => {
                Value::Array(fs.iter().map(|f| self.read(f, b, d)).collect::<Result<_, _>>()?)
            }
            ContainerFormat::Struct(fields) => self.fields(fields, b, d)?,
            ContainerFormat::Enum(variants) => {
                let i = varint(b)?;
                let v =
                    u32::try_from(i).ok().and_then(|i| variants.get(&i)).ok_or_else(|| format!("no variant {i}"))?;
                let content = match &v.value {
                    VariantFormat::Unit => return Ok(Value::String(v.name.clone())),
                    VariantFormat::NewType(f) => self.read(f, b, d)?,
                    VariantFormat::Tuple(fs) => {
                        Value::Array(fs.iter().map(|f| self.read(f, b, d)).collect::<Result<_, _>>()?)
                    }
                    VariantFormat::Struct(fields) => self.fields(fields, b, d)?,
                    VariantFormat::Variable(_) => return Err("the recorded state type is incomplete".into()),
                };
                let mut m = serde_json::Map::new();
                m.insert(v.name.clone(), content);
                Value::Object(m)
            }
        })
    }

    fn fields(&self, fields: &[serde_reflection::Named<Format>], b: &mut &[u8], d: usize) -> Result<Value, String> {
        let mut m = serde_json::Map::new();
        for field in fields {
            m.insert(field.name.clone(), self.read(&field.value, b, d)?);
        }
        Ok(Value::Object(m))
    }
}

/// A user's upgrade of state written in an older type `Old` (`KeyedStream::migrate_state`): used
/// when the recorded structure is `Old`'s.
pub(crate) struct Migration<K, S> {
    /// The structure of `(K, Old)`.
    pub from: StateSchema,
    #[allow(clippy::type_complexity)]
    read: Box<dyn Fn(&[u8]) -> Result<((K, S), usize), String> + Send + Sync>,
}

impl<K: DeserializeOwned + 'static, S: 'static> Migration<K, S> {
    pub fn new<Old: DeserializeOwned + 'static>(f: impl Fn(Old) -> S + Send + Sync + 'static) -> Self {
        let read = move |b: &[u8]| {
            let ((k, old), rest): ((K, Old), &[u8]) = postcard::take_from_bytes(b).map_err(|e| e.to_string())?;
            Ok(((k, f(old)), b.len() - rest.len()))
        };
        Migration { from: StateSchema::of::<(K, Old)>(), read: Box::new(read) }
    }

    /// Read one old entry off the front of `bytes` and upgrade it.
    pub fn take<'b>(&self, bytes: &'b [u8]) -> Result<((K, S), &'b [u8]), String> {
        let (entry, n) = (self.read)(bytes)?;
        Ok((entry, &bytes[n..]))
    }
}

fn split<'b>(b: &mut &'b [u8], n: usize) -> Result<&'b [u8], String> {
    if b.len() < n {
        return Err("the state ends early".into());
    }
    let (head, rest) = b.split_at(n);
    *b = rest;
    Ok(head)
}

fn take<const N: usize>(b: &mut &[u8]) -> Result<[u8; N], String> {
    Ok(split(b, N)?.try_into().expect("N bytes"))
}

fn byte(b: &mut &[u8]) -> Result<u8, String> {
    Ok(take::<1>(b)?[0])
}

/// postcard's unsigned LEB128 varint (at most 19 bytes for a u128).
fn varint(b: &mut &[u8]) -> Result<u128, String> {
    let mut v: u128 = 0;
    for shift in (0..128).step_by(7) {
        let x = byte(b)?;
        v |= ((x & 0x7f) as u128) << shift;
        if x & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err("a varint longer than 128 bits".into())
}

fn zigzag(v: u128) -> i128 {
    ((v >> 1) as i128) ^ -((v & 1) as i128)
}

fn length(b: &mut &[u8]) -> Result<usize, String> {
    let n = varint(b)?;
    // Every element takes at least one byte... except units; a bound on what is left keeps a
    // damaged length from allocating without limit.
    usize::try_from(n).ok().filter(|n| *n <= b.len().max(1) * 8).ok_or_else(|| format!("a length of {n}"))
}

fn string(b: &mut &[u8]) -> Result<String, String> {
    let n = length(b)?;
    String::from_utf8(split(b, n)?.to_vec()).map_err(|e| e.to_string())
}

fn wide(v: u128) -> Result<Value, String> {
    u64::try_from(v).map(Value::from).map_err(|_| format!("{v} does not fit a restorable u64"))
}

fn float(x: f64) -> Result<Value, String> {
    serde_json::Number::from_f64(x).map(Value::Number).ok_or_else(|| format!("the float {x} cannot be restored"))
}

#[cfg(test)]
#[path = "schema_tests.rs"]
mod tests;
