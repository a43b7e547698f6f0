//! Reading Prometheus text (exposition format 0.0.4): what `qr stats` polls
//! from any `qr` `/metrics` endpoint, checked strictly enough that a malformed
//! scrape is reported, not misread.
//!
//! Rules checked (format 0.0.4, "Text format details"): every sample line is
//! `name[{labels}] value [timestamp]`, names match `[a-zA-Z_:][a-zA-Z0-9_:]*`,
//! the value is a float (or `NaN`, `+Inf`, `-Inf`), a `# TYPE` line names a
//! known type at most once per family and comes before the family's samples.

use std::collections::BTreeMap;
use std::fmt;

/// One sample.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// Metric name.
    pub name: String,
    /// The label set as written, braces included (empty without labels).
    pub labels: String,
    /// Value.
    pub value: f64,
}

impl Sample {
    /// `name{labels}`: the series' key.
    pub fn key(&self) -> String {
        format!("{}{}", self.name, self.labels)
    }
}

/// A parsed scrape.
#[derive(Clone, Debug, Default)]
pub struct Exposition {
    /// Samples in order.
    pub samples: Vec<Sample>,
    /// Family name → type (`counter`, `gauge`, ...).
    pub types: BTreeMap<String, String>,
}

impl Exposition {
    /// The type of the family `name` belongs to (`_total` counters are their own family here).
    pub fn type_of(&self, name: &str) -> Option<&str> {
        self.types.get(name).map(String::as_str)
    }

    /// The value of the series `key` (`name` or `name{labels}`).
    pub fn value(&self, key: &str) -> Option<f64> {
        self.samples
            .iter()
            .find(|s| s.key() == key)
            .map(|s| s.value)
    }
}

/// Why a scrape is not valid Prometheus text.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PromTextError {
    /// A line that is not a comment, a blank line or `name[{labels}] value`.
    Malformed {
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        why: String,
    },
    /// `# TYPE` after the family's samples, twice, or naming an unknown type.
    BadType {
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        why: String,
    },
}

impl fmt::Display for PromTextError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PromTextError::Malformed { line, why } => write!(f, "line {line}: {why}"),
            PromTextError::BadType { line, why } => write!(f, "line {line}: {why}"),
        }
    }
}

impl std::error::Error for PromTextError {}

fn valid_name(n: &str) -> bool {
    let mut chars = n.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn parse_value(v: &str) -> Option<f64> {
    match v {
        "NaN" => Some(f64::NAN),
        "+Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        _ => v.parse().ok(),
    }
}

/// Parse and check `text`.
pub fn parse(text: &str) -> Result<Exposition, PromTextError> {
    let mut e = Exposition::default();
    let mut seen = std::collections::BTreeSet::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let l = raw.trim();
        if l.is_empty() {
            continue;
        }
        if let Some(rest) = l.strip_prefix("# TYPE ") {
            let mut it = rest.split_whitespace();
            let (Some(name), Some(ty), None) = (it.next(), it.next(), it.next()) else {
                return Err(PromTextError::BadType {
                    line,
                    why: format!("`{l}` is not `# TYPE name type`"),
                });
            };
            if !matches!(
                ty,
                "counter" | "gauge" | "histogram" | "summary" | "untyped"
            ) {
                return Err(PromTextError::BadType {
                    line,
                    why: format!("unknown type `{ty}`"),
                });
            }
            if seen.contains(name) {
                return Err(PromTextError::BadType {
                    line,
                    why: format!("`# TYPE {name}` after its samples"),
                });
            }
            if e.types.insert(name.to_string(), ty.to_string()).is_some() {
                return Err(PromTextError::BadType {
                    line,
                    why: format!("second `# TYPE` for {name}"),
                });
            }
            continue;
        }
        if l.starts_with('#') {
            continue;
        }
        let (series, rest) =
            match l.find('{') {
                Some(b) => {
                    let close = l[b..].find('}').map(|c| b + c).ok_or_else(|| {
                        PromTextError::Malformed {
                            line,
                            why: "unclosed label set".into(),
                        }
                    })?;
                    (&l[..=close], &l[close + 1..])
                }
                None => l.split_at(l.find(char::is_whitespace).unwrap_or(l.len())),
            };
        let (name, labels) = series.split_at(series.find('{').unwrap_or(series.len()));
        if !valid_name(name) {
            return Err(PromTextError::Malformed {
                line,
                why: format!("`{name}` is not a metric name"),
            });
        }
        let mut parts = rest.split_whitespace();
        let value = parts
            .next()
            .and_then(parse_value)
            .ok_or_else(|| PromTextError::Malformed {
                line,
                why: format!("no value in `{l}`"),
            })?;
        if let Some(ts) = parts.next() {
            if ts.parse::<i64>().is_err() || parts.next().is_some() {
                return Err(PromTextError::Malformed {
                    line,
                    why: format!("trailing `{ts}` is not a timestamp"),
                });
            }
        }
        seen.insert(name.to_string());
        e.samples.push(Sample {
            name: name.to_string(),
            labels: labels.to_string(),
            value,
        });
    }
    Ok(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_what_qr_writes_and_refuses_what_is_not_prometheus() {
        let t = "# HELP a_total A\n# TYPE a_total counter\na_total 5\n\
                 # TYPE g gauge\ng{role=\"x\",k=\"y z\"} 1.5 1700000000000\ng{role=\"w\"} -Inf\n";
        let e = parse(t).unwrap();
        assert_eq!(e.value("a_total"), Some(5.0));
        assert_eq!(e.value("g{role=\"x\",k=\"y z\"}"), Some(1.5));
        assert_eq!(e.type_of("g"), Some("gauge"));
        assert_eq!(e.samples.len(), 3);
        for bad in [
            "a 1 2 3",
            "1a 5",
            "a",
            "a{x=\"1\" 5",
            "a five",
            "# TYPE a countr\na 1",
            "a 1\n# TYPE a counter",
            "# TYPE a counter\n# TYPE a gauge",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} accepted");
        }
    }
}
