//! RFC 8785 vectors: `input/` canonicalizes to `output/` byte for byte, and every line of
//! the ECMAScript number file formats exactly.

use serde_json::{Number, Value};
use toolledger_json::{Limits, canonicalize, parse_strict};

use crate::data;

#[test]
fn input_canonicalizes_to_output_byte_for_byte() {
    let names = ["arrays", "french", "structures", "unicode", "values", "weird"];
    for name in names {
        let input = std::fs::read(data(&format!("rfc8785/input/{name}.json"))).unwrap();
        let expected = std::fs::read(data(&format!("rfc8785/output/{name}.json"))).unwrap();
        let value = parse_strict(&input, &Limits::default()).unwrap();
        let canonical = canonicalize(&value);
        assert_eq!(canonical.as_bytes(), expected.as_slice(), "{name}");
        // The canonical form is a fixed point.
        let again = parse_strict(canonical.as_bytes(), &Limits::default()).unwrap();
        assert_eq!(canonicalize(&again), canonical, "{name}");
    }
}

#[test]
fn every_es6_number_line_formats_exactly() {
    let file = std::fs::read_to_string(data("rfc8785/numbers/es6testfile-first10000.txt")).unwrap();
    let mut lines = 0;
    for (index, line) in file.lines().enumerate() {
        let (hex, expected) = line.split_once(',').unwrap();
        let bits = u64::from_str_radix(hex, 16).unwrap();
        let double = f64::from_bits(bits);
        let number = Number::from_f64(double).unwrap();
        assert_eq!(canonicalize(&Value::Number(number)), expected, "line {}: {hex}", index + 1);

        // And the text reads back as the same double (`-0` excepted: it is written `0`).
        let parsed = parse_strict(expected.as_bytes(), &Limits::default()).unwrap();
        let back = parsed.as_f64().unwrap();
        if double == 0.0 {
            assert_eq!(back, 0.0);
        } else {
            assert_eq!(back.to_bits(), bits, "line {}: {expected} read back", index + 1);
        }
        lines += 1;
    }
    assert_eq!(lines, 10_000);
}

#[test]
fn integers_beyond_two_to_the_53_are_written_as_their_double() {
    let cases: [(&[u8], &str); 5] = [
        (b"9007199254740992", "9007199254740992"),
        (b"9007199254740993", "9007199254740992"),
        (b"-9007199254740993", "-9007199254740992"),
        (b"18446744073709551615", "18446744073709552000"),
        (b"100000000000000000000000", "1e+23"),
    ];
    for (input, expected) in cases {
        let value = parse_strict(input, &Limits::default()).unwrap();
        assert_eq!(canonicalize(&value), expected);
    }
}
