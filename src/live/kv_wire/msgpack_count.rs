//! Counts the values of a msgpack document without building it: a walk over the markers
//! and lengths of the msgpack format (github.com/msgpack/msgpack/blob/master/spec.md), so a
//! KV-event batch can be refused by its size before `rmpv` turns it into a tree (about 40
//! bytes a value: a 200 MB frame of small ints would cost gigabytes; issue 38 D12).

/// Why a document was not counted.
#[derive(Debug, PartialEq, Eq)]
pub enum CountError {
    /// More than the limit of values.
    TooMany {
        /// The limit.
        limit: usize,
    },
    /// The bytes end before the document does, or hold a reserved marker (0xc1).
    Malformed,
}

/// The number of values in the first msgpack document of `bytes` (every scalar, string,
/// array, map, key and extension counts one), or an error once it passes `limit`.
pub fn count_values(bytes: &[u8], limit: usize) -> Result<usize, CountError> {
    let mut at = 0usize;
    let mut pending: u64 = 1;
    let mut counted = 0usize;
    // A length of `n` big-endian bytes at `at`, advancing past it.
    let length = |at: &mut usize, n: usize| -> Result<u64, CountError> {
        let end = at.checked_add(n).ok_or(CountError::Malformed)?;
        let field = bytes.get(*at..end).ok_or(CountError::Malformed)?;
        *at = end;
        Ok(field.iter().fold(0u64, |acc, &b| (acc << 8) | u64::from(b)))
    };
    while pending > 0 {
        pending -= 1;
        counted += 1;
        if counted > limit {
            return Err(CountError::TooMany { limit });
        }
        let marker = *bytes.get(at).ok_or(CountError::Malformed)?;
        at += 1;
        // (bytes to skip, children to add)
        let (skip, children): (u64, u64) = match marker {
            0x00..=0x7f | 0xe0..=0xff | 0xc0 | 0xc2 | 0xc3 => (0, 0),
            0x80..=0x8f => (0, 2 * u64::from(marker & 0x0f)),
            0x90..=0x9f => (0, u64::from(marker & 0x0f)),
            0xa0..=0xbf => (u64::from(marker & 0x1f), 0),
            0xc4 | 0xd9 => (length(&mut at, 1)?, 0),
            0xc5 | 0xda => (length(&mut at, 2)?, 0),
            0xc6 | 0xdb => (length(&mut at, 4)?, 0),
            0xc7 => (length(&mut at, 1)? + 1, 0),
            0xc8 => (length(&mut at, 2)? + 1, 0),
            0xc9 => (length(&mut at, 4)? + 1, 0),
            0xca | 0xce | 0xd2 => (4, 0),
            0xcb | 0xcf | 0xd3 => (8, 0),
            0xcc | 0xd0 => (1, 0),
            0xcd | 0xd1 => (2, 0),
            0xd4 => (2, 0),
            0xd5 => (3, 0),
            0xd6 => (5, 0),
            0xd7 => (9, 0),
            0xd8 => (17, 0),
            0xdc => (0, length(&mut at, 2)?),
            0xdd => (0, length(&mut at, 4)?),
            0xde => (0, 2 * length(&mut at, 2)?),
            0xdf => (0, 2 * length(&mut at, 4)?),
            0xc1 => return Err(CountError::Malformed),
        };
        at = usize::try_from(skip)
            .ok()
            .and_then(|skip| at.checked_add(skip))
            .filter(|&end| end <= bytes.len())
            .ok_or(CountError::Malformed)?;
        pending = pending.saturating_add(children);
        // Declared values count before they are walked: a header declaring more than the
        // limit fails at once, however short the bytes after it are.
        if (counted as u64).saturating_add(pending) > limit as u64 {
            return Err(CountError::TooMany { limit });
        }
    }
    Ok(counted)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encoded(value: &rmpv::Value) -> Vec<u8> {
        let mut bytes = Vec::new();
        rmpv::encode::write_value(&mut bytes, value).expect("encodes");
        bytes
    }

    #[test]
    fn counts_what_rmpv_builds() {
        use rmpv::Value;
        let value = Value::Array(vec![
            Value::F64(1.5),
            Value::Array(vec![
                Value::Array(vec![
                    Value::from("BlockStored"),
                    Value::Array(
                        (0..300)
                            .map(|i| Value::from(i64::from(i) * 1_000_003))
                            .collect(),
                    ),
                    Value::Nil,
                    Value::Binary(vec![7; 70_000]),
                ]),
                Value::Map(vec![(Value::from("medium"), Value::from("GPU"))]),
                Value::Ext(3, vec![1, 2, 3]),
                Value::from(-5),
                Value::from(u64::MAX),
                Value::from("x".repeat(40)),
            ]),
            Value::Boolean(true),
        ]);
        // Root, ts, events list, event array, name, hashes (1 + 300), nil, bin, map (1 + 2),
        // ext, -5, u64, str, bool.
        let expected = 1 + 1 + 1 + 1 + 1 + 301 + 1 + 1 + 3 + 1 + 1 + 1 + 1 + 1;
        assert_eq!(count_values(&encoded(&value), 10_000), Ok(expected));
        assert_eq!(
            count_values(&encoded(&value), expected - 1),
            Err(CountError::TooMany {
                limit: expected - 1
            })
        );
    }

    #[test]
    fn a_huge_declared_array_fails_at_its_header_and_a_cut_document_is_malformed() {
        // An array header declaring 4 billion elements, then a few.
        let mut bytes = vec![0xdd, 0xff, 0xff, 0xff, 0xff];
        bytes.extend_from_slice(&[0x01; 64]);
        assert_eq!(
            count_values(&bytes, 1_000),
            Err(CountError::TooMany { limit: 1_000 })
        );
        // Three declared, two present.
        assert_eq!(
            count_values(&[0x93, 0x01, 0x02], 1_000),
            Err(CountError::Malformed)
        );
        assert_eq!(count_values(&[0xc1], 10), Err(CountError::Malformed));
        assert_eq!(count_values(&[0xa5, b'a'], 10), Err(CountError::Malformed));
    }
}
