//! Where word count reads and writes, as the command line names them: a file or a `kafka://` topic
//! in; a directory, a `postgres://` table or a `kafka://` topic out. Parsing only: the jobs module
//! builds the jobs that use them.

use std::path::PathBuf;

/// Where word count reads lines: a text file, or (feature `kafka`) a Kafka topic whose record values
/// are the lines.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WordcountInput {
    /// The lines of this file.
    File(PathBuf),
    /// `kafka://HOST:PORT[,HOST:PORT...]/TOPIC[?bounded=true]`: the values of the topic's records
    /// (UTF-8, invalid bytes replaced), read `read_committed` from the earliest offsets, forever unless
    /// bounded (then up to the end offsets seen at the first start).
    Kafka {
        /// Bootstrap brokers.
        brokers: String,
        /// The topic.
        topic: String,
        /// Stop at the end offsets of the first start.
        bounded: bool,
    },
}

/// A `kafka://` URL's brokers, topic and `k=v` parameters.
type KafkaUrl<'a> = (String, String, Vec<(&'a str, &'a str)>);

/// `kafka://BROKERS/TOPIC?k=v&...` split into brokers, topic and parameters.
fn kafka_url<'a>(flag: &str, s: &'a str) -> Result<Option<KafkaUrl<'a>>, String> {
    let Some(rest) = s.strip_prefix("kafka://") else { return Ok(None) };
    let (base, query) = rest.split_once('?').unwrap_or((rest, ""));
    let Some((brokers, topic)) =
        base.split_once('/').filter(|(b, t)| !b.is_empty() && !t.is_empty() && !t.contains('/'))
    else {
        return Err(format!("{flag} {s}: write kafka://HOST:PORT[,HOST:PORT...]/TOPIC"));
    };
    let params =
        query.split('&').filter(|kv| !kv.is_empty()).map(|kv| kv.split_once('=').unwrap_or((kv, ""))).collect();
    Ok(Some((brokers.to_string(), topic.to_string(), params)))
}

impl WordcountInput {
    /// `kafka://...` is a topic; anything else a file.
    pub fn parse(s: &str) -> Result<WordcountInput, String> {
        let Some((brokers, topic, params)) = kafka_url("--input", s)? else {
            return Ok(WordcountInput::File(PathBuf::from(s)));
        };
        let mut bounded = false;
        for (k, v) in params {
            match (k, v) {
                ("bounded", "true") => bounded = true,
                ("bounded", "false") => bounded = false,
                _ => return Err(format!("--input {s}: unknown parameter {k}={v} (known: bounded=true|false)")),
            }
        }
        Ok(WordcountInput::Kafka { brokers, topic, bounded })
    }

    /// What names the input in the job's fingerprint: the file's path, or the URL.
    pub fn name(&self) -> String {
        match self {
            WordcountInput::File(p) => p.display().to_string(),
            WordcountInput::Kafka { brokers, topic, bounded } => {
                format!("kafka://{brokers}/{topic}{}", if *bounded { "?bounded=true" } else { "" })
            }
        }
    }
}

/// Where word count writes: a directory through the transactional file sink, or (feature `postgres`)
/// a PostgreSQL table by two-phase commit, one row per word upserted with its latest count.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WordcountOutput {
    /// `WORD<TAB>COUNT` lines in committed files under this directory.
    Dir(PathBuf),
    /// `kafka://HOST:PORT[,HOST:PORT...]/TOPIC[?mode=at-least-once][&partitioning=fixed]`: records
    /// with the word as key and the count as value, exactly once by default, partitioned by key (or
    /// subtask `i` into partition `i % partitions`).
    Kafka {
        /// Bootstrap brokers.
        brokers: String,
        /// The topic.
        topic: String,
        /// Transactions committed after checkpoints (the default), or the idempotent producer.
        exactly_once: bool,
        /// Subtask `i` writes partition `i % partitions` (else records go by key).
        fixed_partitions: bool,
    },
    /// `postgres://USER[:PASSWORD]@HOST:PORT/DATABASE?table=NAME`: the table (created when missing as
    /// `word text PRIMARY KEY, count bigint NOT NULL`), and the connection string without `table`.
    Postgres {
        /// The connection string, `table` removed.
        url: String,
        /// The table, `name` or `schema.name`.
        table: String,
    },
}

impl WordcountOutput {
    /// `postgres://...` or `postgresql://...` (with a `table` parameter) is a table; anything else a
    /// directory.
    pub fn parse(s: &str) -> Result<WordcountOutput, String> {
        if let Some((brokers, topic, params)) = kafka_url("--output", s)? {
            let (mut exactly_once, mut fixed_partitions) = (true, false);
            for (k, v) in params {
                match (k, v) {
                    ("mode", "exactly-once") => exactly_once = true,
                    ("mode", "at-least-once") => exactly_once = false,
                    ("partitioning", "by-key") => fixed_partitions = false,
                    ("partitioning", "fixed") => fixed_partitions = true,
                    _ => {
                        return Err(format!(
                            "--output {s}: unknown parameter {k}={v} (known: mode=exactly-once|at-least-once, partitioning=by-key|fixed)"
                        ))
                    }
                }
            }
            return Ok(WordcountOutput::Kafka { brokers, topic, exactly_once, fixed_partitions });
        }
        if !(s.starts_with("postgres://") || s.starts_with("postgresql://")) {
            return Ok(WordcountOutput::Dir(PathBuf::from(s)));
        }
        let (base, query) = s.split_once('?').unwrap_or((s, ""));
        let mut table = None;
        let mut rest = Vec::new();
        for kv in query.split('&').filter(|kv| !kv.is_empty()) {
            match kv.split_once('=') {
                Some(("table", t)) if !t.is_empty() => table = Some(t.to_string()),
                _ => rest.push(kv),
            }
        }
        let Some(table) = table else {
            return Err(format!(
                "--output {}: name the table: postgres://USER@HOST:PORT/DATABASE?table=NAME",
                Self::without_password(s)
            ));
        };
        let url = if rest.is_empty() { base.to_string() } else { format!("{base}?{}", rest.join("&")) };
        Ok(WordcountOutput::Postgres { url, table })
    }

    /// What names the output in the job's fingerprint and in messages: the directory, or the
    /// connection string without its password and the table.
    pub fn name(&self) -> String {
        match self {
            WordcountOutput::Dir(d) => d.display().to_string(),
            WordcountOutput::Postgres { url, table } => format!("{} table {table}", Self::without_password(url)),
            WordcountOutput::Kafka { brokers, topic, exactly_once, fixed_partitions } => {
                // Defaults unnamed (the fingerprint of a job started before a parameter existed stays).
                let params: Vec<&str> = [
                    (!*exactly_once).then_some("mode=at-least-once"),
                    fixed_partitions.then_some("partitioning=fixed"),
                ]
                .into_iter()
                .flatten()
                .collect();
                let query = if params.is_empty() { String::new() } else { format!("?{}", params.join("&")) };
                format!("kafka://{brokers}/{topic}{query}")
            }
        }
    }

    fn without_password(url: &str) -> String {
        let Some((scheme, rest)) = url.split_once("://") else { return url.to_string() };
        let (authority, tail) = rest.split_once('/').map_or((rest, None), |(a, t)| (a, Some(t)));
        let authority = match authority.rsplit_once('@') {
            Some((user, host)) => format!("{}@{host}", user.split(':').next().unwrap_or(user)),
            None => authority.to_string(),
        };
        match tail {
            Some(t) => format!("{scheme}://{authority}/{t}"),
            None => format!("{scheme}://{authority}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::WordcountOutput;

    #[test]
    fn kafka_outputs_name_only_the_parameters_that_differ_from_the_defaults() {
        for (url, exactly_once, fixed_partitions, name) in [
            ("kafka://h:1/t", true, false, "kafka://h:1/t"),
            ("kafka://h:1/t?mode=exactly-once&partitioning=by-key", true, false, "kafka://h:1/t"),
            ("kafka://h:1/t?partitioning=fixed", true, true, "kafka://h:1/t?partitioning=fixed"),
            (
                "kafka://h:1/t?mode=at-least-once&partitioning=fixed",
                false,
                true,
                "kafka://h:1/t?mode=at-least-once&partitioning=fixed",
            ),
        ] {
            let out = WordcountOutput::parse(url).unwrap();
            let want =
                WordcountOutput::Kafka { brokers: "h:1".into(), topic: "t".into(), exactly_once, fixed_partitions };
            assert_eq!(out, want, "{url}");
            assert_eq!(out.name(), name, "{url}");
        }
    }

    #[test]
    fn outputs_are_directories_unless_they_are_postgres_urls_naming_a_table() {
        assert_eq!(WordcountOutput::parse("out/dir").unwrap(), WordcountOutput::Dir("out/dir".into()));
        let pg = WordcountOutput::parse("postgres://u:secret@h:5432/db?sslmode=disable&table=wc").unwrap();
        assert_eq!(
            pg,
            WordcountOutput::Postgres {
                url: "postgres://u:secret@h:5432/db?sslmode=disable".into(),
                table: "wc".into()
            }
        );
        assert_eq!(pg.name(), "postgres://u@h:5432/db?sslmode=disable table wc", "the password must not be shown");
        let err = WordcountOutput::parse("postgresql://u:secret@h/db").unwrap_err();
        assert!(err.contains("?table=NAME") && !err.contains("secret"), "{err}");
    }
}
