//! `is_canonical_v2` against the long way round (strict parse, v2 domain, canonical
//! form written back and compared): the two must give the same answer on every text.

use proptest::prelude::*;
use toolledger_json::{Limits, canonicalize, check_v2_domain, is_canonical_v2, parse_strict};

use crate::{data, properties::value, suite::corpus};

/// The answer the store gave before the direct check: parse into a tree, write it back.
fn by_tree(text: &str, limits: &Limits) -> bool {
    parse_strict(text.as_bytes(), limits)
        .is_ok_and(|value| check_v2_domain(&value).is_ok() && canonicalize(&value) == text)
}

fn agree(text: &str, limits: &Limits) {
    assert_eq!(is_canonical_v2(text, limits), by_tree(text, limits), "{text:?}");
}

/// Bytes that make a canonical text almost canonical.
const EDITS: &[&str] = &[
    " ",
    "\"",
    "\\",
    ",",
    ":",
    "[",
    "]",
    "{",
    "}",
    "0",
    "1",
    "-",
    ".",
    "e",
    "u",
    "a",
    "n",
    "\\u0000",
    "\\u001f",
    "\\u001F",
    "\\u0008",
    "\\b",
    "\\/",
    "\\u0041",
    "\u{7f}",
    "\u{e000}",
    "\u{1f600}",
    "\"a\":1,",
    "\"\":0,",
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn a_canonical_text_is_recognised_when_its_value_is_in_the_domain(value in value()) {
        let text = canonicalize(&value);
        // A double outside the domain may still write as an integer (`1.0` as `1`).
        prop_assert!(check_v2_domain(&value).is_err() || is_canonical_v2(&text, &Limits::default()));
        agree(&text, &Limits::default());
    }

    #[test]
    fn an_edited_canonical_text_gets_the_tree_s_answer(
        value in value(),
        at in any::<prop::sample::Index>(),
        edit in prop::sample::select(EDITS),
        delete in 0usize..3,
    ) {
        let text = canonicalize(&value);
        let mut at = at.index(text.len() + 1);
        while !text.is_char_boundary(at) {
            at -= 1;
        }
        let mut end = at;
        for _ in 0..delete {
            end += text.get(end..).and_then(|rest| rest.chars().next()).map_or(0, char::len_utf8);
        }
        let edited = format!("{}{edit}{}", &text[..at], &text[end..]);
        agree(&edited, &Limits::default());
        agree(&format!("{}{}", &text[..at], &text[end..]), &Limits::default());
    }
}

#[test]
fn every_suite_and_rfc_8785_file_gets_the_tree_s_answer() {
    let mut texts: Vec<String> =
        corpus().into_iter().filter_map(|(_, bytes)| String::from_utf8(bytes).ok()).collect();
    for dir in ["rfc8785/input", "rfc8785/output"] {
        for entry in std::fs::read_dir(data(dir)).unwrap() {
            texts.push(std::fs::read_to_string(entry.unwrap().path()).unwrap());
        }
    }
    let canonical = texts.iter().filter(|text| is_canonical_v2(text, &Limits::default())).count();
    for text in &texts {
        agree(text, &Limits::default());
        agree(text.trim_end(), &Limits::default());
    }
    // The corpus holds both answers, so agreement is not all refusals.
    assert!(canonical > 0 && canonical < texts.len(), "{canonical} of {}", texts.len());
}

#[test]
fn the_limits_are_the_parser_s() {
    let nested = |depth: usize| format!("{}{}", "[".repeat(depth), "]".repeat(depth));
    let objects = |depth: usize| format!("{}0{}", r#"{"a":"#.repeat(depth), "}".repeat(depth));
    for depth_max in [0, 1, 2, 32] {
        let limits = Limits { size_bytes_max: 65_536, depth_max };
        for depth in [0, 1, 2, 3, 31, 32, 33] {
            agree(&nested(depth), &limits);
            agree(&objects(depth), &limits);
        }
    }
    let long = format!("\"{}\"", "a".repeat(98));
    for size_bytes_max in [99, 100, 101] {
        agree(&long, &Limits { size_bytes_max, depth_max: 32 });
    }
    for number in ["9007199254740991", "-9007199254740991", "9007199254740992", "-0", "0", "00"] {
        agree(number, &Limits::default());
    }
}
