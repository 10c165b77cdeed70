//! The SQL the PostgreSQL sink sends: identifiers checked and quoted, multi-row `INSERT` statements
//! with or without `ON CONFLICT`, each value a parameter of its column's type (see `param.rs`).

use super::param::Bind;
use crate::error::ConnectorError;

/// Most rows in one statement (`PostgresSinkConfig::batch_rows` is capped here, and by the
/// protocol's 65,535 parameters per statement).
pub const MAX_BATCH_ROWS: usize = 10_000;
/// Parameters one statement may carry (the wire protocol counts them in 16 bits).
pub(crate) const MAX_PARAMETERS: usize = 65_535;
/// Longest transaction name PostgreSQL accepts for `PREPARE TRANSACTION` (its GIDSIZE is 200).
pub(crate) const MAX_GID_BYTES: usize = 199;

/// One value of a row. It goes into a column of the common types (boolean, integers, floats, text)
/// in that type's binary form, converted as the server would parse its text (`"42"` into a
/// `bigint`), and into any other column as text the server casts, so an `i64` can go into an
/// `integer`, `numeric` or `text` column alike. Build it with `From`: `5i64.into()`,
/// `"word".into()`, `None::<i64>.into()` (NULL).
#[derive(Clone, Debug, PartialEq)]
pub enum SqlValue {
    /// SQL NULL.
    Null,
    /// A boolean.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A floating-point number.
    Float(f64),
    /// Text (also for dates, JSON, numerics: anything the column type parses).
    Text(String),
}

impl SqlValue {
    /// The text the server parses, `None` for NULL.
    pub(crate) fn to_text(&self) -> Option<String> {
        match self {
            SqlValue::Null => None,
            SqlValue::Bool(b) => Some(if *b { "t".into() } else { "f".into() }),
            SqlValue::Int(i) => Some(i.to_string()),
            SqlValue::Float(f) => Some(f.to_string()),
            SqlValue::Text(s) => Some(s.clone()),
        }
    }
}

macro_rules! from_int {
    ($($t:ty),*) => {$(
        impl From<$t> for SqlValue {
            fn from(v: $t) -> Self {
                SqlValue::Int(v as i64)
            }
        }
    )*};
}
from_int!(i8, i16, i32, i64, u8, u16, u32);

impl From<bool> for SqlValue {
    fn from(v: bool) -> Self {
        SqlValue::Bool(v)
    }
}
impl From<f64> for SqlValue {
    fn from(v: f64) -> Self {
        SqlValue::Float(v)
    }
}
impl From<&str> for SqlValue {
    fn from(v: &str) -> Self {
        SqlValue::Text(v.to_owned())
    }
}
impl From<String> for SqlValue {
    fn from(v: String) -> Self {
        SqlValue::Text(v)
    }
}
impl<T: Into<SqlValue>> From<Option<T>> for SqlValue {
    fn from(v: Option<T>) -> Self {
        v.map_or(SqlValue::Null, Into::into)
    }
}

/// An identifier (table, column, schema) checked to be a plain SQL name and quoted. Plain names only
/// (letters, digits, `_`, not starting with a digit, at most 63 bytes), so that a name in a
/// configuration never changes the meaning of a statement.
pub(crate) fn ident(name: &str, what: &str) -> Result<String, ConnectorError> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !name.starts_with(|c: char| c.is_ascii_digit());
    if !ok {
        return Err(ConnectorError::permanent(format!(
            "PostgreSQL sink: {what} {name:?} is not a plain SQL name (letters, digits and _, not starting \
             with a digit, at most 63 bytes)"
        )));
    }
    Ok(format!("\"{name}\""))
}

/// `table` or `schema.table`, quoted.
pub(crate) fn table_name(name: &str) -> Result<String, ConnectorError> {
    name.split('.').map(|part| ident(part, "table name part")).collect::<Result<Vec<_>, _>>().and_then(|parts| {
        if parts.len() > 2 {
            Err(ConnectorError::permanent(format!("PostgreSQL sink: table {name:?} has more than schema.table")))
        } else {
            Ok(parts.join("."))
        }
    })
}

/// A multi-row insert of `rows` rows into `table`: every value a parameter of its column's type
/// (`types`, from the catalog), a text parameter cast to it for columns bound as [`Bind::Cast`], and
/// for upserts `ON CONFLICT (key) DO UPDATE` of the other columns (`DO NOTHING` when every column is
/// part of the key).
pub(crate) fn insert_statement(
    table: &str,
    columns: &[String],
    types: &[String],
    binds: &[Bind],
    key: Option<&[String]>,
    rows: usize,
) -> String {
    let mut sql = format!("INSERT INTO {table} ({}) VALUES ", columns.join(", "));
    let mut n = 0;
    for r in 0..rows {
        if r > 0 {
            sql.push_str(", ");
        }
        sql.push('(');
        for (c, (ty, bind)) in types.iter().zip(binds).enumerate() {
            if c > 0 {
                sql.push_str(", ");
            }
            n += 1;
            match bind {
                Bind::Cast => sql.push_str(&format!("${n}::text::{ty}")),
                _ => sql.push_str(&format!("${n}")),
            }
        }
        sql.push(')');
    }
    if let Some(key) = key {
        let others: Vec<&String> = columns.iter().filter(|c| !key.contains(c)).collect();
        sql.push_str(&format!(" ON CONFLICT ({}) ", key.join(", ")));
        if others.is_empty() {
            sql.push_str("DO NOTHING");
        } else {
            let set: Vec<String> = others.iter().map(|c| format!("{c} = EXCLUDED.{c}")).collect();
            sql.push_str(&format!("DO UPDATE SET {}", set.join(", ")));
        }
    }
    sql
}

/// A string literal: single quotes doubled. Used only for transaction names, which the sink builds
/// from checked parts, because `PREPARE TRANSACTION` takes no parameters.
pub(crate) fn literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_could_change_a_statement_are_refused() {
        assert_eq!(ident("word_count", "column").unwrap(), "\"word_count\"");
        for bad in ["", "a b", "a\"b", "x;drop table t", "1a", &"a".repeat(64)] {
            assert!(ident(bad, "column").is_err(), "{bad:?} accepted");
        }
        assert_eq!(table_name("public.counts").unwrap(), "\"public\".\"counts\"");
        assert!(table_name("a.b.c").is_err());
    }

    #[test]
    fn upsert_updates_the_columns_outside_the_key() {
        let cols = vec!["\"k\"".to_string(), "\"v\"".to_string()];
        let types = vec!["text".to_string(), "numeric(10,2)".to_string()];
        let binds = [Bind::Text, Bind::Cast];
        let key = vec!["\"k\"".to_string()];
        assert_eq!(
            insert_statement("\"t\"", &cols, &types, &binds, Some(&key), 2),
            "INSERT INTO \"t\" (\"k\", \"v\") VALUES ($1, $2::text::numeric(10,2)), ($3, \
             $4::text::numeric(10,2)) ON CONFLICT (\"k\") DO UPDATE SET \"v\" = EXCLUDED.\"v\""
        );
        assert!(insert_statement("\"t\"", &key, &types[..1], &binds, Some(&key), 1).ends_with("DO NOTHING"));
        assert!(!insert_statement("\"t\"", &cols, &types, &binds, None, 1).contains("ON CONFLICT"));
    }

    #[test]
    fn values_render_as_the_text_the_server_parses() {
        assert_eq!(SqlValue::from(-3i32).to_text().as_deref(), Some("-3"));
        assert_eq!(SqlValue::from(true).to_text().as_deref(), Some("t"));
        assert_eq!(SqlValue::from(None::<i64>).to_text(), None);
        assert_eq!(literal("a'b"), "'a''b'");
    }
}
