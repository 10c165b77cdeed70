//! How the PostgreSQL sink sends values: in the binary format of the column's own type for the
//! common types (booleans, integers, floats, text), so the server parses nothing; as text that the
//! server casts for every other type (numeric, dates, JSON, arrays, enums, domains).

use super::sql::SqlValue;
use crate::error::ConnectorError;
use bytes::BytesMut;
use postgres::types::{to_sql_checked, IsNull, ToSql, Type};

/// How a column's values are bound, decided once from its type's oid in the catalog.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Bind {
    Bool,
    Int2,
    Int4,
    Int8,
    Float4,
    Float8,
    /// `text` and `varchar`: the value's text, unconverted.
    Text,
    /// Any other type: text cast by the server (`$n::text::type`).
    Cast,
}

impl Bind {
    /// The binding of a column whose type has the oid `oid` (a domain's oid is not its base type's,
    /// so domains are cast and their constraints checked by the server).
    pub(crate) fn of_type_oid(oid: u32) -> Bind {
        match oid {
            16 => Bind::Bool,
            21 => Bind::Int2,
            23 => Bind::Int4,
            20 => Bind::Int8,
            700 => Bind::Float4,
            701 => Bind::Float8,
            25 | 1043 => Bind::Text,
            _ => Bind::Cast,
        }
    }
}

/// One value as bound: in the form its column's [`Bind`] sends (and, for rows a checkpoint
/// deferred, as stored in the checkpoint).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) enum Param {
    Null,
    Bool(bool),
    Int2(i16),
    Int4(i32),
    Int8(i64),
    Float4(f32),
    Float8(f64),
    /// For `Bind::Text` and `Bind::Cast`.
    Text(String),
}

/// Rows of a checkpoint that wait for an earlier checkpoint's commit (opaque).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DeferredRows(pub(crate) Vec<Vec<Param>>);

impl DeferredRows {
    /// How many rows.
    pub fn len(&self) -> usize {
        self.0.len()
    }
    /// No rows.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl SqlValue {
    /// This value for column `column` of type `ty`, bound as `bind`. A value of another kind is
    /// converted as the server would parse its text (`"42"` into a `bigint`, `7` into a `double
    /// precision`); one that does not fit is a permanent error naming the column, since the same
    /// record fails again after a restore.
    pub(crate) fn to_param(&self, bind: Bind, column: &str, ty: &str) -> Result<Param, ConnectorError> {
        let unfit = |why: &str| {
            ConnectorError::permanent(format!(
                "PostgreSQL sink: the value {self:?} does not fit column {column} of type {ty}: {why}"
            ))
        };
        let int = |lo: i64, hi: i64| -> Result<i64, ConnectorError> {
            let v = match self {
                SqlValue::Int(i) => *i,
                SqlValue::Text(s) => s.trim().parse::<i64>().map_err(|e| unfit(&e.to_string()))?,
                _ => return Err(unfit("not an integer")),
            };
            if (lo..=hi).contains(&v) {
                Ok(v)
            } else {
                Err(unfit("out of range"))
            }
        };
        let float = || -> Result<f64, ConnectorError> {
            match self {
                SqlValue::Float(f) => Ok(*f),
                SqlValue::Int(i) => Ok(*i as f64),
                SqlValue::Text(s) => s.trim().parse::<f64>().map_err(|e| unfit(&e.to_string())),
                _ => Err(unfit("not a number")),
            }
        };
        if *self == SqlValue::Null {
            return Ok(Param::Null);
        }
        Ok(match bind {
            Bind::Bool => Param::Bool(match self {
                SqlValue::Bool(b) => *b,
                SqlValue::Text(s) => match s.trim().to_ascii_lowercase().as_str() {
                    "t" | "true" | "yes" | "on" | "1" => true,
                    "f" | "false" | "no" | "off" | "0" => false,
                    _ => return Err(unfit("not a boolean")),
                },
                _ => return Err(unfit("not a boolean")),
            }),
            Bind::Int2 => Param::Int2(int(i16::MIN.into(), i16::MAX.into())? as i16),
            Bind::Int4 => Param::Int4(int(i32::MIN.into(), i32::MAX.into())? as i32),
            Bind::Int8 => Param::Int8(int(i64::MIN, i64::MAX)?),
            Bind::Float4 => Param::Float4(float()? as f32),
            Bind::Float8 => Param::Float8(float()?),
            Bind::Text | Bind::Cast => Param::Text(self.to_text().unwrap_or_default()),
        })
    }
}

impl ToSql for Param {
    fn to_sql(&self, ty: &Type, out: &mut BytesMut) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        // The statement's parameter types come from the columns the binds were chosen from; a
        // mismatch (the table changed under the job) is an error, never bytes of the wrong width.
        fn checked<V: ToSql>(
            v: &V,
            ty: &Type,
            out: &mut BytesMut,
        ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
            if V::accepts(ty) {
                v.to_sql(ty, out)
            } else {
                Err(format!(
                    "a {} value for a parameter of type {ty}: the table changed while the job ran",
                    std::any::type_name::<V>()
                )
                .into())
            }
        }
        match self {
            Param::Null => Ok(IsNull::Yes),
            Param::Bool(v) => checked(v, ty, out),
            Param::Int2(v) => checked(v, ty, out),
            Param::Int4(v) => checked(v, ty, out),
            Param::Int8(v) => checked(v, ty, out),
            Param::Float4(v) => checked(v, ty, out),
            Param::Float8(v) => checked(v, ty, out),
            Param::Text(v) => checked(v, ty, out),
        }
    }

    fn accepts(_: &Type) -> bool {
        true // checked per value in `to_sql`
    }

    to_sql_checked!();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_convert_to_their_columns_binding_as_the_server_would_parse_them() {
        let p = |v: SqlValue, b: Bind| v.to_param(b, "c", "t");
        assert_eq!(p(5i64.into(), Bind::Int8).unwrap(), Param::Int8(5));
        assert_eq!(p("42".into(), Bind::Int4).unwrap(), Param::Int4(42));
        assert_eq!(p(7i64.into(), Bind::Float8).unwrap(), Param::Float8(7.0));
        assert_eq!(p("on".into(), Bind::Bool).unwrap(), Param::Bool(true));
        assert_eq!(p(3i64.into(), Bind::Text).unwrap(), Param::Text("3".into()));
        assert_eq!(p(None::<i64>.into(), Bind::Int8).unwrap(), Param::Null);
        assert_eq!(p(true.into(), Bind::Cast).unwrap(), Param::Text("t".into()));
        for (v, b) in [
            (SqlValue::from(70_000i64), Bind::Int2),
            (SqlValue::from("4x"), Bind::Int8),
            (SqlValue::from(1.5), Bind::Int8),
            (SqlValue::from("maybe"), Bind::Bool),
            (SqlValue::from(true), Bind::Float8),
        ] {
            let e = p(v.clone(), b).expect_err(&format!("{v:?} as {b:?}"));
            assert!(e.is_permanent() && e.message().contains("column c of type t"), "{e}");
        }
    }

    #[test]
    fn the_common_types_are_bound_natively_and_the_rest_cast() {
        assert_eq!(Bind::of_type_oid(20), Bind::Int8);
        assert_eq!(Bind::of_type_oid(1043), Bind::Text);
        assert_eq!(Bind::of_type_oid(1700), Bind::Cast, "numeric");
    }
}
