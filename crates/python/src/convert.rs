//! Python values to JSON and back.
//!
//! Only what JSON has crosses: `None`, `bool`, `int`, `float`, `str`, `list` and `dict`
//! with `str` keys. Anything else (a tuple, a set, bytes, a `str` holding a lone
//! surrogate, a float that is not finite) is refused with the type's name (never the
//! value). What JSON can say but the ledger cannot hold is left to the facade's one door
//! (`toolledger::door`), which answers `INPUT_INVALID` with a pointer: an integer too wide
//! for the conversion is carried as the widest one of its sign, and a container past the
//! door's depth bound as an empty one of its kind, so the door refuses each where it
//! stands without this file knowing its bounds (and a list that contains itself ends).

use pyo3::{
    exceptions::PyValueError,
    prelude::*,
    types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString},
};
use serde_json::{Map, Number, Value};

use crate::errors;

/// Deeper than any document the ledger reads (a tool definition's bound), so the bound
/// only ever refuses what the ledger would; it also ends a list that contains itself.
const DOCUMENT_DEPTH_MAX: usize = 64;

/// What a value is for, which decides what is done past a depth bound.
#[derive(Clone, Copy)]
enum Use {
    /// A call's arguments, which the facade's door judges: past the door's depth, an empty
    /// container of its kind, which the door refuses where it stands.
    Door,
    /// A document (a schema, a receipt's output, a context): refused past [`DOCUMENT_DEPTH_MAX`].
    Document,
}

/// A call's arguments as JSON, for the facade's door; `what`
/// names it in a refusal ("the arguments").
pub(crate) fn to_call_value(object: &Bound<'_, PyAny>, what: &str) -> PyResult<Value> {
    value(object, what, 0, Use::Door)
}

/// A document (a schema, a receipt's output, a call's context) as JSON; `what` names it in a refusal.
pub(crate) fn to_value(object: &Bound<'_, PyAny>, what: &str) -> PyResult<Value> {
    value(object, what, 0, Use::Document)
}

fn value(object: &Bound<'_, PyAny>, what: &str, depth: usize, bound: Use) -> PyResult<Value> {
    if object.is_none() {
        return Ok(Value::Null);
    }
    // `bool` first: in Python it is a subclass of `int`.
    if let Ok(flag) = object.cast::<PyBool>() {
        return Ok(Value::Bool(flag.is_true()));
    }
    if let Ok(text) = object.cast::<PyString>() {
        return match text.to_str() {
            Ok(text) => Ok(Value::String(text.to_owned())),
            Err(_) => Err(errors::invalid(format!(
                "{what} hold a str that is not Unicode text (a lone surrogate), which is not JSON"
            ))),
        };
    }
    if let Ok(int) = object.cast::<PyInt>() {
        if let Ok(small) = int.extract::<i64>() {
            return Ok(Value::Number(small.into()));
        }
        let negative = int.lt(0)?;
        return Ok(Value::Number(if negative { i64::MIN.into() } else { u64::MAX.into() }));
    }
    if let Ok(float) = object.cast::<PyFloat>() {
        return Number::from_f64(float.value())
            .map(Value::Number)
            .ok_or_else(|| errors::invalid(format!("{what} hold a number JSON cannot write")));
    }
    let past = match bound {
        Use::Door => depth >= toolledger::door::DEPTH_MAX,
        Use::Document if depth >= DOCUMENT_DEPTH_MAX => {
            return Err(errors::invalid(format!(
                "{what} nest deeper than {DOCUMENT_DEPTH_MAX} levels"
            )));
        }
        Use::Document => false,
    };
    if let Ok(dict) = object.cast::<PyDict>() {
        let mut members = Map::new();
        if past {
            return Ok(Value::Object(members));
        }
        for (key, item) in dict.iter() {
            let Ok(key) = key.cast::<PyString>() else {
                return Err(errors::invalid(format!(
                    "{what} hold a mapping key that is not a str"
                )));
            };
            let key = key.to_str().map_err(|_| {
                errors::invalid(format!("{what} hold a mapping key that is not Unicode text"))
            })?;
            members.insert(key.to_owned(), value(&item, what, depth + 1, bound)?);
        }
        return Ok(Value::Object(members));
    }
    if let Ok(list) = object.cast::<PyList>() {
        if past {
            return Ok(Value::Array(Vec::new()));
        }
        return list.iter().map(|item| value(&item, what, depth + 1, bound)).collect();
    }
    let kind = object.get_type().name().map(|name| name.to_string()).unwrap_or_default();
    let hint = if kind == "tuple" { " (pass a list)" } else { "" };
    Err(errors::invalid(format!("{what} hold a {kind}, which is not JSON{hint}")))
}

/// `value` as a new Python object (a fresh `dict` or `list` at every call: the caller may
/// change it without changing what the ledger holds).
pub(crate) fn to_python<'py>(py: Python<'py>, value: &Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match value {
        Value::Null => py.None().into_bound(py),
        Value::Bool(flag) => PyBool::new(py, *flag).to_owned().into_any(),
        Value::Number(number) => {
            if let Some(small) = number.as_i64() {
                small.into_pyobject(py)?.into_any()
            } else if let Some(big) = number.as_u64() {
                big.into_pyobject(py)?.into_any()
            } else {
                let float = number
                    .as_f64()
                    .ok_or_else(|| PyValueError::new_err("a number with no float value"))?;
                PyFloat::new(py, float).into_any()
            }
        }
        Value::String(text) => PyString::new(py, text).into_any(),
        Value::Array(items) => {
            let list = PyList::empty(py);
            for item in items {
                list.append(to_python(py, item)?)?;
            }
            list.into_any()
        }
        Value::Object(members) => {
            let dict = PyDict::new(py);
            for (key, item) in members {
                dict.set_item(key, to_python(py, item)?)?;
            }
            dict.into_any()
        }
    })
}
