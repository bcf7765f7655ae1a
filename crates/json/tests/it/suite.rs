//! JSONTestSuite `test_parsing/`: every `y_` accepted (but the two duplicate-key files),
//! every `n_` refused, every `i_` exactly as `tests/data/i_decisions.tsv` says.

use std::collections::BTreeMap;

use toolledger_json::{Limits, parse_strict};

use crate::data;

/// The two `y_` files RFC 8259 allows and I-JSON (RFC 7493) refuses: refused on purpose.
const DUPLICATE_KEY_FILES: [&str; 2] =
    ["y_object_duplicated_key.json", "y_object_duplicated_key_and_value.json"];

pub(crate) fn corpus() -> Vec<(String, Vec<u8>)> {
    let dir = data("jsontestsuite/test_parsing");
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|entry| {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_str().unwrap().to_owned();
            (name, std::fs::read(&path).unwrap())
        })
        .collect();
    files.sort();
    assert_eq!(files.len(), 318, "test_parsing/ should hold all 318 upstream files");
    files
}

#[test]
fn y_files_are_accepted() {
    let mut accepted = 0;
    for (name, bytes) in corpus().iter().filter(|(name, _)| name.starts_with("y_")) {
        let result = parse_strict(bytes, &Limits::default());
        if DUPLICATE_KEY_FILES.contains(&name.as_str()) {
            assert_eq!(result.map_err(|err| err.code()), Err("duplicate_key"), "{name}");
        } else {
            assert!(result.is_ok(), "{name} refused: {:?}", result.err());
            accepted += 1;
        }
    }
    assert_eq!(accepted, 93);
}

#[test]
fn n_files_are_refused() {
    let mut refused = 0;
    for (name, bytes) in corpus().iter().filter(|(name, _)| name.starts_with("n_")) {
        let result = parse_strict(bytes, &Limits::default());
        assert!(result.is_err(), "{name} accepted: {:?}", result.ok());
        refused += 1;
    }
    assert_eq!(refused, 188);
}

/// The committed table: `file<TAB>accept|<error code><TAB>why`.
#[test]
fn i_files_follow_the_committed_table() {
    let table = std::fs::read_to_string(data("i_decisions.tsv")).unwrap();
    let mut decisions = BTreeMap::new();
    for line in table.lines().filter(|line| !line.starts_with('#') && !line.is_empty()) {
        let fields: Vec<&str> = line.split('\t').collect();
        assert_eq!(fields.len(), 3, "malformed table line: {line}");
        assert!(!fields[2].trim().is_empty(), "no reason given for {}", fields[0]);
        assert!(decisions.insert(fields[0].to_owned(), fields[1].to_owned()).is_none());
    }
    let mut checked = 0;
    for (name, bytes) in corpus().iter().filter(|(name, _)| name.starts_with("i_")) {
        let expected =
            decisions.remove(name).unwrap_or_else(|| panic!("{name} is not in the table"));
        let actual = match parse_strict(bytes, &Limits::default()) {
            Ok(_) => "accept".to_owned(),
            Err(err) => err.code().to_owned(),
        };
        assert_eq!(actual, expected, "{name}");
        checked += 1;
    }
    assert!(decisions.is_empty(), "table names files that do not exist: {decisions:?}");
    assert_eq!(checked, 35);
}

/// The two 100,000-deep files must be refused by the depth scan, not by a stack
/// overflow, even with the size limit lifted and a small stack.
#[test]
fn hundred_thousand_deep_files_are_too_deep_on_a_small_stack() {
    let files: Vec<(String, Vec<u8>)> = corpus()
        .into_iter()
        .filter(|(name, _)| {
            name == "n_structure_100000_opening_arrays.json"
                || name == "n_structure_open_array_object.json"
        })
        .collect();
    assert_eq!(files.len(), 2);
    let codes = std::thread::Builder::new()
        .stack_size(64 * 1024)
        .spawn(move || {
            let limits = Limits { size_bytes_max: 1 << 20, ..Limits::default() };
            files
                .iter()
                .map(|(_, bytes)| parse_strict(bytes, &limits).unwrap_err().code())
                .collect::<Vec<_>>()
        })
        .unwrap()
        .join()
        .unwrap();
    assert_eq!(codes, ["too_deep", "too_deep"]);
}
