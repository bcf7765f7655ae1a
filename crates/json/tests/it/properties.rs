//! Properties of the canonical form, over generated values written loosely: members in
//! any order, any legal whitespace, any legal escaping.

use proptest::prelude::*;
use serde_json::{Map, Number, Value};
use toolledger_json::{Limits, canonicalize, parse_strict};

pub(crate) fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z]{0,6}",
        any::<String>().prop_map(|s| s.chars().take(8).collect()),
        proptest::collection::vec(
            prop_oneof![
                Just('\u{e000}'),
                Just('\u{ffff}'),
                Just('\u{1f600}'),
                Just('\u{0}'),
                Just('"'),
                Just('\\'),
                Just('\u{7f}'),
                Just('é')
            ],
            0..4
        )
        .prop_map(|chars| chars.into_iter().collect()),
    ]
}

fn number() -> impl Strategy<Value = Number> {
    prop_oneof![
        any::<i64>().prop_map(Number::from),
        any::<u64>().prop_map(Number::from),
        any::<f64>().prop_filter_map("finite", Number::from_f64),
        (-1000i64..1000).prop_map(Number::from),
    ]
}

pub(crate) fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        number().prop_map(Value::Number),
        text().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            proptest::collection::vec((text(), inner), 0..6)
                .prop_map(|members| Value::Object(members.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// How to write a value non-canonically.
#[derive(Debug, Clone)]
struct Loose {
    /// Whitespace to put between tokens.
    space: &'static str,
    /// Members are written starting at this index, wrapping around.
    rotate: usize,
    /// Escape every character of strings as `\uXXXX`.
    escape_all: bool,
}

fn loose() -> impl Strategy<Value = Loose> {
    (prop::sample::select(vec!["", " ", "\n\t", " \r\n "]), any::<usize>(), any::<bool>())
        .prop_map(|(space, rotate, escape_all)| Loose { space, rotate, escape_all })
}

fn write_string(text: &str, how: &Loose, out: &mut String) {
    if how.escape_all {
        out.push('"');
        for unit in text.encode_utf16() {
            out.push_str(&format!("\\u{unit:04X}"));
        }
        out.push('"');
    } else {
        out.push_str(&serde_json::to_string(text).unwrap());
    }
}

fn write_loose(value: &Value, how: &Loose, out: &mut String) {
    let space = how.space;
    match value {
        Value::Array(items) => {
            out.push('[');
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                out.push_str(space);
                write_loose(item, how, out);
            }
            out.push_str(space);
            out.push(']');
        }
        Value::Object(members) => {
            let members: Vec<_> = members.iter().collect();
            out.push('{');
            for index in 0..members.len() {
                let (name, member) = members[(index + how.rotate) % members.len()];
                if index > 0 {
                    out.push(',');
                }
                out.push_str(space);
                write_string(name, how, out);
                out.push_str(space);
                out.push(':');
                out.push_str(space);
                write_loose(member, how, out);
            }
            out.push_str(space);
            out.push('}');
        }
        Value::String(text) => write_string(text, how, out),
        other => out.push_str(&serde_json::to_string(other).unwrap()),
    }
}

proptest! {
    #[test]
    fn canonicalize_is_idempotent_through_parse_strict(value in value()) {
        let canonical = canonicalize(&value);
        let reparsed = parse_strict(canonical.as_bytes(), &Limits::default()).unwrap();
        prop_assert_eq!(canonicalize(&reparsed), canonical);
    }

    #[test]
    fn canonical_form_ignores_member_order_whitespace_and_escaping(value in value(), a in loose(), b in loose()) {
        let (mut first, mut second) = (String::new(), String::new());
        write_loose(&value, &a, &mut first);
        write_loose(&value, &b, &mut second);
        let first = parse_strict(first.as_bytes(), &Limits::default()).unwrap();
        let second = parse_strict(second.as_bytes(), &Limits::default()).unwrap();
        prop_assert_eq!(canonicalize(&first), canonicalize(&second));
        prop_assert_eq!(canonicalize(&first), canonicalize(&value));
    }

    #[test]
    fn duplicate_names_differing_only_by_escapes_are_caught(name in text(), how in loose()) {
        let mut document = String::from("{");
        write_string(&name, &Loose { escape_all: false, ..how.clone() }, &mut document);
        document.push_str(":1,");
        write_string(&name, &Loose { escape_all: true, ..how }, &mut document);
        document.push_str(":2}");
        let err = parse_strict(document.as_bytes(), &Limits::default()).unwrap_err();
        prop_assert_eq!(err.code(), "duplicate_key");
    }
}
