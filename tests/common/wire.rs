//! The public API's own field names, read from its compiled descriptors
//! (`ditto::server::FILE_DESCRIPTOR_SET`), to check that an error's field path is a path in
//! the message the client sent, not in some internal type.

use std::collections::HashMap;

use prost::Message;
use prost_types::field_descriptor_proto::Type;

/// The fields of each message of `ditto.v1`: name → the message type it holds, if any.
fn messages() -> HashMap<String, HashMap<String, Option<String>>> {
    let set = prost_types::FileDescriptorSet::decode(ditto::server::FILE_DESCRIPTOR_SET).unwrap();
    let mut out = HashMap::new();
    for file in &set.file {
        let package = file.package();
        let mut pending: Vec<(String, &prost_types::DescriptorProto)> = file
            .message_type
            .iter()
            .map(|m| (format!(".{package}.{}", m.name()), m))
            .collect();
        while let Some((name, message)) = pending.pop() {
            let mut fields = HashMap::new();
            for field in &message.field {
                let held = (field.r#type() == Type::Message).then(|| field.type_name().to_owned());
                fields.insert(field.name().to_owned(), held);
            }
            for oneof in &message.oneof_decl {
                fields.entry(oneof.name().to_owned()).or_insert(None);
            }
            for nested in &message.nested_type {
                pending.push((format!("{name}.{}", nested.name()), nested));
            }
            out.insert(name, fields);
        }
    }
    out
}

/// Panics unless `path` (`stages[0].rate_rps`, `request.output_histogram.bins[2].tokens`)
/// walks the fields of message `message` (e.g. `ditto.v1.ForecastCapacityRequest`).
pub fn assert_field_path(message: &str, path: &str) {
    let messages = messages();
    let mut current = format!(".{message}");
    let mut segments = path.split('.').peekable();
    while let Some(segment) = segments.next() {
        let name = segment.split('[').next().unwrap_or(segment);
        let fields = messages
            .get(&current)
            .unwrap_or_else(|| panic!("{path}: no message {current}"));
        let held = fields.get(name).unwrap_or_else(|| {
            panic!(
                "{path}: {name:?} is not a field of {current} (it has {:?})",
                {
                    let mut names: Vec<&String> = fields.keys().collect();
                    names.sort();
                    names
                }
            )
        });
        match held {
            // A map's entries are keyed by the client's own strings: stop there.
            Some(type_name) if type_name.ends_with("Entry") => return,
            Some(type_name) => current = type_name.clone(),
            None => {
                assert!(
                    segments.peek().is_none(),
                    "{path}: {name} of {current} holds no fields"
                );
            }
        }
    }
}
