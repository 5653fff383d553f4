//! JSON parsed into a [`serde_json::Value`] under a budget of values, refused as soon as
//! the budget is spent, before the rest is materialised.
//!
//! Why: a `Value` costs 32 bytes or more per element plus its container's growth, so a body
//! far under the byte cap can still cost gigabytes once parsed (issue 38 D2: 62 MB of `0,`
//! in a list made ~31 M values and peaked at 2.2 GB before the entry-count check ran).
//! Counting while parsing bounds memory by the budget, whatever the body holds.

use std::cell::Cell;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// Why a body was not parsed.
#[derive(Debug)]
pub enum BoundedJsonError {
    /// Not JSON (serde_json's error, with its line and column).
    Invalid(serde_json::Error),
    /// More than `limit` values (every scalar, list and object counts one).
    TooManyValues {
        /// The budget.
        limit: usize,
    },
}

/// Parses `bytes` into a `Value` holding at most `max_values` values.
pub fn parse(bytes: &[u8], max_values: usize) -> Result<Value, BoundedJsonError> {
    let budget = Budget {
        left: Cell::new(max_values),
        exhausted: Cell::new(false),
    };
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let parsed = BoundedValue { budget: &budget }
        .deserialize(&mut deserializer)
        .and_then(|value| deserializer.end().map(|()| value));
    match parsed {
        Ok(value) => Ok(value),
        Err(_) if budget.exhausted.get() => {
            Err(BoundedJsonError::TooManyValues { limit: max_values })
        }
        Err(err) => Err(BoundedJsonError::Invalid(err)),
    }
}

/// Values left to build; `exhausted` tells the budget's error from a syntax error.
struct Budget {
    left: Cell<usize>,
    exhausted: Cell<bool>,
}

impl Budget {
    fn take<E: de::Error>(&self) -> Result<(), E> {
        match self.left.get().checked_sub(1) {
            Some(left) => {
                self.left.set(left);
                Ok(())
            }
            None => {
                self.exhausted.set(true);
                Err(E::custom("too many JSON values"))
            }
        }
    }
}

/// A `Value` built against the budget.
#[derive(Clone, Copy)]
struct BoundedValue<'b> {
    budget: &'b Budget,
}

impl<'de> DeserializeSeed<'de> for BoundedValue<'_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        self.budget.take()?;
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for BoundedValue<'_> {
    type Value = Value;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("any JSON value")
    }

    fn visit_bool<E>(self, value: bool) -> Result<Value, E> {
        Ok(Value::Bool(value))
    }

    fn visit_i64<E>(self, value: i64) -> Result<Value, E> {
        Ok(Value::from(value))
    }

    fn visit_u64<E>(self, value: u64) -> Result<Value, E> {
        Ok(Value::from(value))
    }

    fn visit_f64<E>(self, value: f64) -> Result<Value, E> {
        // JSON has no NaN or infinity; serde_json's own Value does the same.
        Ok(serde_json::Number::from_f64(value).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, value: &str) -> Result<Value, E> {
        Ok(Value::String(value.to_owned()))
    }

    fn visit_string<E>(self, value: String) -> Result<Value, E> {
        Ok(Value::String(value))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(self)? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut object = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let value = map.next_value_seed(self)?;
            object.insert(key, value);
        }
        Ok(Value::Object(object))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_what_serde_json_parses_within_the_budget() {
        let text =
            br#"{"requests": [{"a": 1, "b": -2.5, "c": "x", "d": null, "e": [true]}], "f": {}}"#;
        let expected: Value = serde_json::from_slice(text).expect("json");
        // 1 root + 1 list + 1 object + 5 fields + 1 inner item + 1 empty object = 10.
        assert_eq!(parse(text, 10).expect("fits"), expected);
        assert!(matches!(
            parse(text, 9),
            Err(BoundedJsonError::TooManyValues { limit: 9 })
        ));
    }

    #[test]
    fn a_long_list_is_refused_at_the_budget_not_after() {
        let mut body = b"{\"requests\": [".to_vec();
        for _ in 0..100_000 {
            body.extend_from_slice(b"0,");
        }
        body.extend_from_slice(b"0]}");
        assert!(matches!(
            parse(&body, 1_000),
            Err(BoundedJsonError::TooManyValues { limit: 1_000 })
        ));
    }

    #[test]
    fn syntax_errors_and_trailing_text_stay_syntax_errors() {
        for text in [&b"{\"a\": }"[..], b"[1, 2", b"{} x", b""] {
            assert!(
                matches!(parse(text, 1_000), Err(BoundedJsonError::Invalid(_))),
                "{}",
                String::from_utf8_lossy(text)
            );
        }
    }
}
