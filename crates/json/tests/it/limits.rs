//! The limits and refusals of `docs/json.md`, each at its exact boundary.

use toolledger_json::{JsonError, Limits, parse_strict};

fn nested_arrays(depth: usize) -> Vec<u8> {
    let mut bytes = vec![b'['; depth];
    bytes.extend(std::iter::repeat_n(b']', depth));
    bytes
}

fn code(input: &[u8]) -> &'static str {
    match parse_strict(input, &Limits::default()) {
        Ok(_) => "accept",
        Err(err) => err.code(),
    }
}

#[test]
fn depth_32_passes_and_33_fails() {
    assert_eq!(code(&nested_arrays(32)), "accept");
    let err = parse_strict(&nested_arrays(33), &Limits::default()).unwrap_err();
    assert_eq!(err, JsonError::TooDeep { offset: 32, depth_max: 32 });
    // Objects count the same as arrays, and a scalar document has depth 0.
    let mut objects = "{\"a\":".repeat(32);
    objects.push('1');
    objects.push_str(&"}".repeat(32));
    assert_eq!(code(objects.as_bytes()), "accept");
    assert_eq!(code(format!("[{objects}]").as_bytes()), "too_deep");
    assert_eq!(code(b"7"), "accept");
    let zero = Limits { depth_max: 0, ..Limits::default() };
    assert!(parse_strict(b"\"x\"", &zero).is_ok());
    assert_eq!(parse_strict(b"[]", &zero).unwrap_err().code(), "too_deep");
}

#[test]
fn brackets_inside_strings_do_not_count_toward_depth() {
    let mut text = String::from("[\"");
    text.push_str(&"[{\\\"".repeat(100));
    text.push_str("\"]");
    assert_eq!(code(text.as_bytes()), "accept");
}

#[test]
fn deep_nesting_under_the_size_limit_is_too_deep_on_a_small_stack() {
    let result = std::thread::Builder::new()
        .stack_size(32 * 1024)
        .spawn(|| {
            let four_thousand = nested_arrays(4096);
            assert!(four_thousand.len() <= 65_536);
            let hundred_thousand = nested_arrays(100_000);
            let unlimited = Limits { size_bytes_max: usize::MAX, depth_max: 32 };
            (
                parse_strict(&four_thousand, &Limits::default()).unwrap_err().code(),
                parse_strict(&hundred_thousand, &unlimited).unwrap_err().code(),
            )
        })
        .unwrap()
        .join()
        .unwrap();
    assert_eq!(result, ("too_deep", "too_deep"));
}

#[test]
fn size_65536_passes_and_65537_fails() {
    let padded = |size: usize| {
        let mut bytes = b"\"".to_vec();
        bytes.extend(std::iter::repeat_n(b'x', size - 2));
        bytes.push(b'"');
        bytes
    };
    assert_eq!(code(&padded(65_536)), "accept");
    assert_eq!(
        parse_strict(&padded(65_537), &Limits::default()).unwrap_err(),
        JsonError::TooLarge { size_bytes: 65_537, size_bytes_max: 65_536 }
    );
}

#[test]
fn duplicate_names_are_compared_after_unescaping() {
    let err = parse_strict(br#"{"a":1,"\u0061":2}"#, &Limits::default()).unwrap_err();
    assert_eq!(err, JsonError::DuplicateKey { offset: 7 });
    assert_eq!(code(br#"{"\u00e9":1,"\u00E9":2}"#), "duplicate_key");
    assert_eq!(code("{\"\u{e9}\":1,\"\\u00e9\":2}".as_bytes()), "duplicate_key");
    assert_eq!(code(br#"{"\ud83d\ude00":1,"\uD83D\uDE00":2}"#), "duplicate_key");
    // Nested objects have their own namespaces.
    assert_eq!(code(br#"{"a":{"a":1},"b":{"a":2}}"#), "accept");
}

#[test]
fn rfc_8259_is_enforced_exactly() {
    let refused: [(&[u8], &str); 20] = [
        (b"NaN", "syntax"),
        (b"[Infinity]", "syntax"),
        (b"[-Infinity]", "syntax"),
        (b"[+1]", "syntax"),
        (b"[01]", "syntax"),
        (b"[1.]", "syntax"),
        (b"[.5]", "syntax"),
        (b"[1e]", "syntax"),
        (b"[1,]", "syntax"),
        (b"{\"a\":1,}", "syntax"),
        (b"[1] x", "syntax"),
        (b"[1]/*c*/", "syntax"),
        (b"// c\n[1]", "syntax"),
        (b"['a']", "syntax"),
        (b"[\"a\tb\"]", "syntax"),
        (b"\xEF\xBB\xBF{}", "syntax"),
        (b"[\"\xC3\"]", "invalid_utf8"),
        (b"[\"\\ud800\"]", "lone_surrogate"),
        (b"[\"\\udc00\\ud800\"]", "lone_surrogate"),
        (b"", "syntax"),
    ];
    for (input, expected) in refused {
        assert_eq!(code(input), expected, "{}", String::from_utf8_lossy(input));
    }
    assert_eq!(code(b" \t\r\n[1, -0, 0.5e-3, \"\\u0000\\/\"] \n"), "accept");
}

#[test]
fn numbers_beyond_a_double_are_refused_not_rounded_to_infinity_or_zero() {
    assert_eq!(code(b"[1e309]"), "number_out_of_range");
    assert_eq!(code(b"[-1e309]"), "number_out_of_range");
    assert_eq!(code(b"[1e-400]"), "number_out_of_range");
    assert_eq!(code(b"[0e-400]"), "accept");
    assert_eq!(code(b"[5e-324]"), "accept");
}

#[test]
fn errors_carry_offsets_and_never_input_text() {
    let secret = br#"{"card":"4111-1111-1111-1111","card":"4111-1111-1111-1111"}"#;
    let err = parse_strict(secret, &Limits::default()).unwrap_err();
    assert_eq!(err.offset(), Some(30));
    assert!(!err.to_string().contains("4111"), "{err}");
    assert!(!err.to_string().contains("card"), "{err}");

    let err = parse_strict(b"[1, tru]", &Limits::default()).unwrap_err();
    assert_eq!((err.code(), err.offset()), ("syntax", Some(4)));
    assert!(!err.to_string().contains("tru"), "{err}");
    let err = parse_strict(b"[1, 2", &Limits::default()).unwrap_err();
    assert_eq!(err.offset(), Some(5));
}
