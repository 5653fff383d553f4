//! Kubernetes label selectors (`app=vllm,llm-d.ai/role in (decode,both),!canary`): parsed and
//! validated at start (so a typo exits with the flag named instead of a 400 from the API
//! server at run time), rendered back for the API's `labelSelector` parameter, and matched
//! locally against a pod's labels. Pure: the grammar of apimachinery's `labels.Parse`.

use std::collections::BTreeMap;
use std::fmt;

/// One requirement of a selector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Requirement {
    /// `key=value` / `key==value`.
    Equals(String, String),
    /// `key!=value` (also true when the label is absent).
    NotEquals(String, String),
    /// `key in (a,b)`.
    In(String, Vec<String>),
    /// `key notin (a,b)` (also true when the label is absent).
    NotIn(String, Vec<String>),
    /// `key`: the label exists.
    Exists(String),
    /// `!key`: the label does not exist.
    DoesNotExist(String),
}

/// A parsed label selector: every requirement must hold (an empty one selects everything).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LabelSelector(pub Vec<Requirement>);

impl LabelSelector {
    /// Parses a selector string; the error says what is wrong and where.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut requirements = Vec::new();
        for part in split_top_level(text)? {
            let part = part.trim();
            if part.is_empty() {
                return Err(format!("{text:?}: empty requirement"));
            }
            requirements.push(parse_requirement(part)?);
        }
        Ok(Self(requirements))
    }

    /// A selector of `key=value` pairs (an InferencePool's `matchLabels`).
    pub fn from_labels(labels: &BTreeMap<String, String>) -> Self {
        Self(
            labels
                .iter()
                .map(|(key, value)| Requirement::Equals(key.clone(), value.clone()))
                .collect(),
        )
    }

    /// Whether `labels` satisfy every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.iter().all(|requirement| match requirement {
            Requirement::Equals(key, value) => labels.get(key) == Some(value),
            Requirement::NotEquals(key, value) => labels.get(key) != Some(value),
            Requirement::In(key, values) => labels.get(key).is_some_and(|v| values.contains(v)),
            Requirement::NotIn(key, values) => !labels.get(key).is_some_and(|v| values.contains(v)),
            Requirement::Exists(key) => labels.contains_key(key),
            Requirement::DoesNotExist(key) => !labels.contains_key(key),
        })
    }
}

impl fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self
            .0
            .iter()
            .map(|requirement| match requirement {
                Requirement::Equals(key, value) => format!("{key}={value}"),
                Requirement::NotEquals(key, value) => format!("{key}!={value}"),
                Requirement::In(key, values) => format!("{key} in ({})", values.join(",")),
                Requirement::NotIn(key, values) => format!("{key} notin ({})", values.join(",")),
                Requirement::Exists(key) => key.clone(),
                Requirement::DoesNotExist(key) => format!("!{key}"),
            })
            .collect();
        f.write_str(&parts.join(","))
    }
}

/// Splits on the commas outside parentheses.
fn split_top_level(text: &str) -> Result<Vec<&str>, String> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (index, ch) in text.char_indices() {
        match ch {
            '(' if depth == 0 => depth = 1,
            '(' => return Err(format!("{text:?}: nested parentheses")),
            ')' if depth == 1 => depth = 0,
            ')' => return Err(format!("{text:?}: unbalanced ')'")),
            ',' if depth == 0 => {
                parts.push(&text[start..index]);
                start = index + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(format!("{text:?}: unclosed '('"));
    }
    parts.push(&text[start..]);
    Ok(parts)
}

fn parse_requirement(part: &str) -> Result<Requirement, String> {
    if let Some(key) = part.strip_prefix('!') {
        return Ok(Requirement::DoesNotExist(check_key(key.trim())?));
    }
    for (op, not) in [("!=", true), ("==", false), ("=", false)] {
        if let Some((key, value)) = part.split_once(op) {
            let key = check_key(key.trim())?;
            let value = check_value(value.trim())?;
            return Ok(if not {
                Requirement::NotEquals(key, value)
            } else {
                Requirement::Equals(key, value)
            });
        }
    }
    if let Some(open) = part.find('(') {
        let head = part[..open].trim();
        let rest = part[open + 1..].trim_end();
        let inner = rest
            .strip_suffix(')')
            .ok_or_else(|| format!("{part:?}: text after ')'"))?;
        let (key, operator) = head
            .rsplit_once(char::is_whitespace)
            .ok_or_else(|| format!("{part:?}: expected `key in (...)` or `key notin (...)`"))?;
        let key = check_key(key.trim())?;
        let values = inner
            .split(',')
            .map(|value| check_value(value.trim()))
            .collect::<Result<Vec<_>, _>>()?;
        return match operator {
            "in" => Ok(Requirement::In(key, values)),
            "notin" => Ok(Requirement::NotIn(key, values)),
            other => Err(format!("{part:?}: unknown operator {other:?} (in, notin)")),
        };
    }
    if part.contains(['<', '>']) {
        return Err(format!(
            "{part:?}: numeric comparisons (< >) are not supported"
        ));
    }
    Ok(Requirement::Exists(check_key(part)?))
}

/// A segment of 1 to 63 bytes that `allowed` accepts, starting and ending alphanumeric.
fn is_segment(segment: &str, allowed: impl Fn(u8) -> bool) -> bool {
    let bytes = segment.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes[0].is_ascii_alphanumeric()
        && bytes[bytes.len() - 1].is_ascii_alphanumeric()
        && bytes.iter().all(|&b| allowed(b))
}

/// A name segment: at most 63 alphanumerics, `-`, `_`, `.`, starting and ending alphanumeric.
fn is_name(segment: &str) -> bool {
    is_segment(segment, |b| {
        b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.')
    })
}

/// A DNS subdomain (a key's prefix): at most 253 lowercase alphanumerics, `-` and `.`.
fn is_dns_subdomain(prefix: &str) -> bool {
    prefix.len() <= 253
        && prefix.split('.').all(|label| {
            is_segment(label, |b| {
                b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'
            })
        })
}

fn check_key(key: &str) -> Result<String, String> {
    let valid = match key.split_once('/') {
        Some((prefix, name)) => is_dns_subdomain(prefix) && is_name(name),
        None => is_name(key),
    };
    if !valid {
        return Err(format!(
            "{key:?} is not a label key ([prefix/]name; name: up to 63 of [A-Za-z0-9-_.], \
             alphanumeric at both ends)"
        ));
    }
    Ok(key.to_owned())
}

fn check_value(value: &str) -> Result<String, String> {
    if !value.is_empty() && !is_name(value) {
        return Err(format!(
            "{value:?} is not a label value (up to 63 of [A-Za-z0-9-_.], alphanumeric at both ends)"
        ));
    }
    Ok(value.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn parses_the_selector_grammar_and_renders_it_back() {
        let text = "app=vllm,llm-d.ai/role in (decode,both),tier!=canary,gpu,!draining,x==y";
        let selector = LabelSelector::parse(text).unwrap();
        assert_eq!(selector.0.len(), 6);
        assert_eq!(
            selector.0[1],
            Requirement::In("llm-d.ai/role".into(), vec!["decode".into(), "both".into()])
        );
        let again = LabelSelector::parse(&selector.to_string()).unwrap();
        assert_eq!(again, selector);
        let pod = labels(&[
            ("app", "vllm"),
            ("llm-d.ai/role", "decode"),
            ("gpu", ""),
            ("x", "y"),
        ]);
        assert!(selector.matches(&pod));
        let mut draining = pod.clone();
        draining.insert("draining".into(), "true".into());
        assert!(!selector.matches(&draining));
        let mut prefill = pod.clone();
        prefill.insert("llm-d.ai/role".into(), "prefill".into());
        assert!(!selector.matches(&prefill));
        assert!(
            LabelSelector::parse("a notin (b)")
                .unwrap()
                .matches(&labels(&[]))
        );
    }

    #[test]
    fn rejects_what_the_api_server_would() {
        for bad in [
            "",
            "app=",
            "=vllm",
            "app=vllm,",
            "app in (a,b",
            "app in a,b)",
            "app (a)",
            "app=vllm/x",
            "-app=x",
            "Bad_Prefix.io/app=x",
            "app>3",
            "app=has space",
        ] {
            if bad == "app=" {
                // An empty value is valid.
                assert!(LabelSelector::parse(bad).is_ok());
                continue;
            }
            assert!(LabelSelector::parse(bad).is_err(), "{bad:?} parsed");
        }
    }
}
