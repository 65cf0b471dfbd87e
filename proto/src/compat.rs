//! Wire compatibility between a released descriptor set and the current one.
//!
//! Services of different versions share one stream, and a stream is replayed
//! long after it was written, so a message written by an old build must decode
//! under a new one and the other way round. The rules are those of protobuf
//! itself: additions are free; a field or enum value that goes away must have
//! its number and name reserved; a number never changes meaning.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use prost_types::{
    DescriptorProto, EnumDescriptorProto, FieldDescriptorProto, FileDescriptorSet,
    descriptor_proto::ReservedRange as MessageRange,
    enum_descriptor_proto::EnumReservedRange as EnumRange,
};

/// One way the current contracts break a released one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The full name of the message or enum at fault, e.g. `nisse.v1.Envelope`.
    pub item: String,
    /// What is wrong, in words.
    pub problem: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.item, self.problem)
    }
}

/// Compares `current` against `released` and lists every break. An empty list
/// means every message written under one decodes the same under the other.
pub fn check(released: &FileDescriptorSet, current: &FileDescriptorSet) -> Vec<Violation> {
    let old = index(released);
    let new = index(current);
    let mut out = Vec::new();
    for (name, old_item) in &old {
        let Some(new_item) = new.get(name) else {
            out.push(Violation {
                item: name.clone(),
                problem: "removed; a released message or enum must stay (deprecate it instead)"
                    .into(),
            });
            continue;
        };
        match (old_item, new_item) {
            (Item::Message(o), Item::Message(n)) => check_message(name, o, n, &mut out),
            (Item::Enum(o), Item::Enum(n)) => check_enum(name, o, n, &mut out),
            _ => out.push(Violation {
                item: name.clone(),
                problem: "changed between message and enum".into(),
            }),
        }
    }
    out
}

enum Item<'a> {
    Message(&'a DescriptorProto),
    Enum(&'a EnumDescriptorProto),
}

fn index(set: &FileDescriptorSet) -> BTreeMap<String, Item<'_>> {
    let mut out = BTreeMap::new();
    for file in &set.file {
        // Well-known types are Google's to keep compatible, not ours.
        if file.package() == "google.protobuf" {
            continue;
        }
        let prefix = file.package().to_string();
        for m in &file.message_type {
            index_message(&prefix, m, &mut out);
        }
        for e in &file.enum_type {
            out.insert(format!("{prefix}.{}", e.name()), Item::Enum(e));
        }
    }
    out
}

fn index_message<'a>(prefix: &str, m: &'a DescriptorProto, out: &mut BTreeMap<String, Item<'a>>) {
    let name = format!("{prefix}.{}", m.name());
    for nested in &m.nested_type {
        // Map entry types are synthesised by the compiler.
        if nested.options.as_ref().is_some_and(|o| o.map_entry()) {
            continue;
        }
        index_message(&name, nested, out);
    }
    for e in &m.enum_type {
        out.insert(format!("{name}.{}", e.name()), Item::Enum(e));
    }
    out.insert(name, Item::Message(m));
}

fn field_shape(f: &FieldDescriptorProto, m: &DescriptorProto) -> String {
    let oneof = match f.oneof_index {
        // proto3 `optional` is a synthetic oneof: it does not change the wire.
        Some(i) if !f.proto3_optional() => m
            .oneof_decl
            .get(i as usize)
            .map(|o| format!(" in oneof {}", o.name()))
            .unwrap_or_default(),
        _ => String::new(),
    };
    let ty = if f.type_name().is_empty() {
        format!("{:?}", f.r#type())
    } else {
        f.type_name().trim_start_matches('.').to_string()
    };
    format!("{:?} {ty}{oneof}", f.label())
}

fn in_message_ranges(n: i32, ranges: &[MessageRange]) -> bool {
    // Message reserved ranges are end-exclusive.
    ranges.iter().any(|r| r.start() <= n && n < r.end())
}

fn in_enum_ranges(n: i32, ranges: &[EnumRange]) -> bool {
    // Enum reserved ranges are end-inclusive.
    ranges.iter().any(|r| r.start() <= n && n <= r.end())
}

fn check_message(
    name: &str,
    old: &DescriptorProto,
    new: &DescriptorProto,
    out: &mut Vec<Violation>,
) {
    let mut problem = |p: String| {
        out.push(Violation {
            item: name.to_string(),
            problem: p,
        })
    };
    let new_by_number: HashMap<i32, &FieldDescriptorProto> =
        new.field.iter().map(|f| (f.number(), f)).collect();
    let new_by_name: HashMap<&str, &FieldDescriptorProto> =
        new.field.iter().map(|f| (f.name(), f)).collect();
    for f in &old.field {
        let (num, fname) = (f.number(), f.name());
        match new_by_number.get(&num) {
            Some(n) if n.name() != fname => problem(format!(
                "field {num} was `{fname}` and is now `{}`: a number never changes meaning",
                n.name()
            )),
            Some(n) => {
                let (was, is) = (field_shape(f, old), field_shape(n, new));
                if was != is {
                    problem(format!(
                        "field {num} `{fname}` changed type from {was} to {is}"
                    ));
                }
            }
            None => {
                if let Some(n) = new_by_name.get(fname) {
                    problem(format!(
                        "field `{fname}` was renumbered from {num} to {}",
                        n.number()
                    ));
                } else {
                    if !in_message_ranges(num, &new.reserved_range) {
                        problem(format!(
                            "field {num} `{fname}` was removed without `reserved {num};`"
                        ));
                    }
                    if !new.reserved_name.iter().any(|r| r == fname) {
                        problem(format!(
                            "field {num} `{fname}` was removed without `reserved \"{fname}\";`"
                        ));
                    }
                }
            }
        }
    }
    for f in &new.field {
        if in_message_ranges(f.number(), &old.reserved_range) {
            problem(format!(
                "field `{}` reuses reserved number {}",
                f.name(),
                f.number()
            ));
        }
    }
}

fn check_enum(
    name: &str,
    old: &EnumDescriptorProto,
    new: &EnumDescriptorProto,
    out: &mut Vec<Violation>,
) {
    let mut problem = |p: String| {
        out.push(Violation {
            item: name.to_string(),
            problem: p,
        })
    };
    let new_by_number: HashMap<i32, &str> =
        new.value.iter().map(|v| (v.number(), v.name())).collect();
    for v in &old.value {
        match new_by_number.get(&v.number()) {
            Some(n) if *n != v.name() => problem(format!(
                "value {} was `{}` and is now `{n}`",
                v.number(),
                v.name()
            )),
            Some(_) => {}
            None if in_enum_ranges(v.number(), &new.reserved_range) => {}
            None => problem(format!(
                "value {} `{}` was removed without reserving its number",
                v.number(),
                v.name()
            )),
        }
    }
    for v in &new.value {
        if in_enum_ranges(v.number(), &old.reserved_range) {
            problem(format!(
                "value `{}` reuses reserved number {}",
                v.name(),
                v.number()
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use pretty_assertions::assert_eq;
    use prost::Message as _;
    use prost_types::FileDescriptorProto;

    use super::*;

    /// A tiny reader for the fixture syntax below: `message Name { type name = N; ... reserved N; reserved "x"; }`.
    fn parse(src: &str) -> FileDescriptorSet {
        use prost_types::field_descriptor_proto::{Label, Type};
        let mut file = FileDescriptorProto {
            name: Some("t.proto".into()),
            package: Some("t".into()),
            syntax: Some("proto3".into()),
            ..Default::default()
        };
        let mut cur: Option<DescriptorProto> = None;
        for line in src.lines().map(str::trim).filter(|l| !l.is_empty()) {
            if let Some(rest) = line.strip_prefix("message ") {
                cur = Some(DescriptorProto {
                    name: Some(rest.trim_end_matches(" {").trim().into()),
                    ..Default::default()
                });
            } else if line == "}" {
                file.message_type.push(cur.take().unwrap());
            } else if let Some(rest) = line.strip_prefix("reserved ") {
                let rest = rest.trim_end_matches(';');
                let m = cur.as_mut().unwrap();
                if let Some(name) = rest.strip_prefix('"') {
                    m.reserved_name.push(name.trim_end_matches('"').into());
                } else {
                    let n: i32 = rest.parse().unwrap();
                    m.reserved_range.push(MessageRange {
                        start: Some(n),
                        end: Some(n + 1),
                    });
                }
            } else {
                let parts: Vec<&str> = line.trim_end_matches(';').split_whitespace().collect();
                let (ty, name, num) = (parts[0], parts[1], parts[3].parse().unwrap());
                let ty = match ty {
                    "string" => Type::String,
                    "uint64" => Type::Uint64,
                    "bytes" => Type::Bytes,
                    other => panic!("fixture type {other}"),
                };
                cur.as_mut().unwrap().field.push(FieldDescriptorProto {
                    name: Some(name.into()),
                    number: Some(num),
                    label: Some(Label::Optional as i32),
                    r#type: Some(ty as i32),
                    ..Default::default()
                });
            }
        }
        FileDescriptorSet { file: vec![file] }
    }

    fn problems(old: &str, new: &str) -> Vec<String> {
        check(&parse(old), &parse(new))
            .into_iter()
            .map(|v| v.to_string())
            .collect()
    }

    const BASE: &str = "message M {\nstring a = 1;\nuint64 b = 2;\n}";

    #[test]
    fn adding_a_field_passes() {
        assert_eq!(
            problems(
                BASE,
                "message M {\nstring a = 1;\nuint64 b = 2;\nbytes c = 3;\n}"
            ),
            Vec::<String>::new()
        );
    }

    #[test]
    fn removing_a_field_without_reserving_fails() {
        assert_eq!(
            problems(BASE, "message M {\nstring a = 1;\n}"),
            vec![
                "t.M: field 2 `b` was removed without `reserved 2;`".to_string(),
                "t.M: field 2 `b` was removed without `reserved \"b\";`".to_string(),
            ]
        );
    }

    #[test]
    fn removing_a_field_with_number_and_name_reserved_passes() {
        assert_eq!(
            problems(
                BASE,
                "message M {\nstring a = 1;\nreserved 2;\nreserved \"b\";\n}"
            ),
            Vec::<String>::new()
        );
    }

    #[test]
    fn renumbering_a_field_fails() {
        assert_eq!(
            problems(BASE, "message M {\nstring a = 1;\nuint64 b = 3;\n}"),
            vec!["t.M: field `b` was renumbered from 2 to 3".to_string()]
        );
    }

    #[test]
    fn reusing_a_number_for_another_field_fails() {
        assert_eq!(
            problems(BASE, "message M {\nstring a = 1;\nuint64 c = 2;\n}"),
            vec!["t.M: field 2 was `b` and is now `c`: a number never changes meaning".to_string()]
        );
    }

    #[test]
    fn changing_a_field_type_fails() {
        assert_eq!(
            problems(BASE, "message M {\nstring a = 1;\nbytes b = 2;\n}"),
            vec![
                "t.M: field 2 `b` changed type from Optional Uint64 to Optional Bytes".to_string()
            ]
        );
    }

    #[test]
    fn reusing_a_reserved_number_fails() {
        let old = "message M {\nstring a = 1;\nreserved 2;\nreserved \"b\";\n}";
        assert_eq!(
            problems(old, "message M {\nstring a = 1;\nbytes z = 2;\n}"),
            vec!["t.M: field `z` reuses reserved number 2".to_string()]
        );
    }

    #[test]
    fn removing_a_message_fails() {
        assert_eq!(
            problems(BASE, "message N {\nstring a = 1;\n}"),
            vec![
                "t.M: removed; a released message or enum must stay (deprecate it instead)"
                    .to_string()
            ]
        );
    }

    /// The guard itself: the contracts as built must be compatible with the
    /// committed snapshot of the released contracts. To release a change,
    /// run this test with `NISSE_BLESS_PROTO=1`; it rewrites the snapshot only
    /// when the change is compatible.
    #[test]
    fn current_contracts_are_wire_compatible_with_the_released_snapshot() {
        let current = FileDescriptorSet::decode(crate::FILE_DESCRIPTOR_SET).unwrap();
        let released = crate::released_descriptor_set().unwrap();
        let violations: Vec<String> = check(&released, &current)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            violations,
            Vec::<String>::new(),
            "breaking contract changes"
        );
        if std::env::var_os("NISSE_BLESS_PROTO").is_some() {
            let path = concat!(env!("CARGO_MANIFEST_DIR"), "/descriptor.snapshot.binpb");
            std::fs::write(path, crate::FILE_DESCRIPTOR_SET).unwrap();
        }
    }

    /// The committed snapshot is not stale: everything in the current
    /// contracts is in it (the reverse check finds nothing "removed"), so the
    /// guard above covers every field that is on the bus.
    #[test]
    fn snapshot_holds_every_current_message_field_and_value() {
        let current = FileDescriptorSet::decode(crate::FILE_DESCRIPTOR_SET).unwrap();
        let released = crate::released_descriptor_set().unwrap();
        let lagging: Vec<String> = check(&current, &released)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            lagging,
            Vec::<String>::new(),
            "the snapshot lags the contracts: run `NISSE_BLESS_PROTO=1 cargo test -p nisse-proto`"
        );
    }
}
