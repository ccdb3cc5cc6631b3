//! The subset of Kubernetes JSONPath used by printer columns: `.a.b`, `['a']`, `[0]`,
//! `[*]`, `.*` and filters `[?(@.type=="Ready")]` (`==`, `!=`, or existence).

use serde_json::Value;

#[derive(Debug, Clone, PartialEq)]
enum Segment {
    Field(String),
    Index(i64),
    Wildcard,
    Filter {
        path: Vec<String>,
        op: Option<(bool, Value)>,
    },
}

/// A parsed path.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct JsonPath {
    segments: Vec<Segment>,
}

/// Why a path could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unparsable JSONPath {0:?}")]
pub(crate) struct ParseError(String);

fn parse_literal(s: &str) -> Value {
    let s = s.trim();
    if let Some(inner) = s.strip_prefix('"').and_then(|r| r.strip_suffix('"')) {
        return Value::String(inner.into());
    }
    if let Some(inner) = s.strip_prefix('\'').and_then(|r| r.strip_suffix('\'')) {
        return Value::String(inner.into());
    }
    serde_json::from_str(s).unwrap_or_else(|_| Value::String(s.into()))
}

impl JsonPath {
    /// Parses `path`, with or without surrounding `{}`.
    pub(crate) fn parse(path: &str) -> Result<Self, ParseError> {
        let err = || ParseError(path.to_string());
        let p = path.trim();
        let p = p
            .strip_prefix('{')
            .and_then(|r| r.strip_suffix('}'))
            .unwrap_or(p);
        let p = p.strip_prefix('$').unwrap_or(p);
        let chars: Vec<char> = p.chars().collect();
        let mut i = 0;
        let mut segments = Vec::new();
        while i < chars.len() {
            match chars[i] {
                '.' => {
                    i += 1;
                    let start = i;
                    while i < chars.len() && chars[i] != '.' && chars[i] != '[' {
                        i += 1;
                    }
                    let name: String = chars[start..i].iter().collect();
                    match name.as_str() {
                        "" => {}
                        "*" => segments.push(Segment::Wildcard),
                        _ => segments.push(Segment::Field(name)),
                    }
                }
                '[' => {
                    let close = find_close(&chars, i).ok_or_else(err)?;
                    let inner: String = chars[i + 1..close].iter().collect();
                    let inner = inner.trim();
                    segments.push(if inner == "*" {
                        Segment::Wildcard
                    } else if let Some(f) =
                        inner.strip_prefix("?(").and_then(|r| r.strip_suffix(')'))
                    {
                        parse_filter(f).ok_or_else(err)?
                    } else if inner.starts_with('\'') || inner.starts_with('"') {
                        Segment::Field(inner[1..inner.len().saturating_sub(1)].to_string())
                    } else {
                        Segment::Index(inner.parse().map_err(|_| err())?)
                    });
                    i = close + 1;
                }
                _ => return Err(err()),
            }
        }
        Ok(Self { segments })
    }

    /// Every value the path selects, in order.
    pub(crate) fn find<'a>(&self, root: &'a Value) -> Vec<&'a Value> {
        let mut current = vec![root];
        for seg in &self.segments {
            let mut next = Vec::new();
            for v in current {
                match seg {
                    Segment::Field(name) => next.extend(v.get(name)),
                    Segment::Index(n) => {
                        if let Some(arr) = v.as_array() {
                            let idx = if *n < 0 { arr.len() as i64 + n } else { *n };
                            next.extend(usize::try_from(idx).ok().and_then(|i| arr.get(i)));
                        }
                    }
                    Segment::Wildcard => match v {
                        Value::Array(a) => next.extend(a.iter()),
                        Value::Object(o) => next.extend(o.values()),
                        _ => {}
                    },
                    Segment::Filter { path, op } => {
                        if let Some(arr) = v.as_array() {
                            next.extend(arr.iter().filter(|item| {
                                let found = path.iter().try_fold(*item, |cur, f| cur.get(f));
                                match (found, op) {
                                    (Some(_), None) => true,
                                    (Some(actual), Some((eq, want))) => (actual == want) == *eq,
                                    (None, Some((false, _))) => true,
                                    (None, _) => false,
                                }
                            }));
                        }
                    }
                }
            }
            current = next;
        }
        current
    }
}

fn find_close(chars: &[char], open: usize) -> Option<usize> {
    let mut depth = 0;
    let mut quote: Option<char> = None;
    for (j, c) in chars.iter().enumerate().skip(open) {
        match (quote, c) {
            (Some(q), c) if *c == q => quote = None,
            (Some(_), _) => {}
            (None, '"' | '\'') => quote = Some(*c),
            (None, '[') => depth += 1,
            (None, ']') => {
                depth -= 1;
                if depth == 0 {
                    return Some(j);
                }
            }
            _ => {}
        }
    }
    None
}

fn parse_filter(f: &str) -> Option<Segment> {
    let (lhs, op) = if let Some((l, r)) = f.split_once("==") {
        (l, Some((true, parse_literal(r))))
    } else if let Some((l, r)) = f.split_once("!=") {
        (l, Some((false, parse_literal(r))))
    } else {
        (f, None)
    };
    let lhs = lhs.trim().strip_prefix('@')?;
    let path = lhs
        .split('.')
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect();
    Some(Segment::Filter { path, op })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn printer_column_paths() {
        let o = json!({"spec": {"a": 1}, "status": {"conditions": [
            {"type": "Ready", "status": "True"}, {"type": "Held", "status": "False"}],
            "holders": [{"claim": "x"}, {"claim": "y"}]}});
        let one = |p: &str| {
            JsonPath::parse(p)
                .unwrap()
                .find(&o)
                .into_iter()
                .cloned()
                .collect::<Vec<_>>()
        };
        assert_eq!(one(".spec.a"), vec![json!(1)]);
        assert_eq!(
            one(".status.conditions[?(@.type==\"Held\")].status"),
            vec![json!("False")]
        );
        assert_eq!(
            one(".status.holders[*].claim"),
            vec![json!("x"), json!("y")]
        );
        assert_eq!(one(".status.holders[-1].claim"), vec![json!("y")]);
        assert_eq!(one("{.status.holders[0]['claim']}"), vec![json!("x")]);
        assert!(one(".spec.missing").is_empty());
    }
}
