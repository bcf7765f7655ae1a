//! The v2 domain: integers within ±(2^53 - 1), no fractions, no exponents.

use serde_json::{Value, json};
use toolledger_json::{Limits, V2_INTEGER_MAX, check_v2_domain, parse_strict};

fn domain(text: &str) -> Result<(), &'static str> {
    let value = parse_strict(text.as_bytes(), &Limits::default()).unwrap();
    check_v2_domain(&value).map_err(|err| err.code())
}

#[test]
fn integers_at_the_edge_are_inside_and_one_past_is_outside() {
    assert_eq!(domain("9007199254740991"), Ok(()));
    assert_eq!(domain("-9007199254740991"), Ok(()));
    assert_eq!(domain("9007199254740992"), Err("outside_v2_domain"));
    assert_eq!(domain("-9007199254740992"), Err("outside_v2_domain"));
    assert_eq!(domain("18446744073709551615"), Err("outside_v2_domain"));
    assert_eq!(domain("-0"), Ok(()));
    assert_eq!(V2_INTEGER_MAX, 9_007_199_254_740_991);
}

#[test]
fn fractions_and_exponents_are_outside_even_when_integral() {
    for text in ["2599.0", "1e3", "1E3", "0.5", "-0.0", "100000000000000000000"] {
        assert_eq!(domain(text), Err("outside_v2_domain"), "{text}");
    }
    // Deep inside a structure too.
    assert_eq!(domain(r#"{"a":[null,true,"s",{"b":[1,2,1.5]}]}"#), Err("outside_v2_domain"));
    assert_eq!(domain(r#"{"a":[null,true,"s",{"b":[1,2,3]}]}"#), Ok(()));
}

#[test]
fn hand_built_deep_values_are_checked_without_recursion() {
    let result = std::thread::Builder::new()
        .stack_size(64 * 1024)
        .spawn(|| {
            let mut value = json!(1.5);
            for _ in 0..100_000 {
                value = Value::Array(vec![value]);
            }
            let code = check_v2_domain(&value).map_err(|err| err.code());
            // Dismantle iteratively: dropping a 100,000-deep value recursively would
            // overflow this small stack.
            let mut current = value;
            while let Value::Array(mut items) = current {
                current = items.pop().unwrap_or(Value::Null);
            }
            code
        })
        .unwrap()
        .join()
        .unwrap();
    assert_eq!(result, Err("outside_v2_domain"));
}
