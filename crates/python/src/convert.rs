//! Python values to JSON and back.
//!
//! Only what JSON has crosses: `None`, `bool`, `int`, `float`, `str`, `list`, `tuple`
//! and `dict` with `str` keys. Anything else is refused with the type's name (never the
//! value), and so is a structure deeper than the ledger's own nesting bound, which also
//! stops a list that contains itself.

use pyo3::{
    exceptions::PyValueError,
    prelude::*,
    types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple},
};
use serde_json::{Map, Number, Value};

use crate::errors;

/// Deeper than any value the ledger accepts (its arguments are bounded at 32 levels),
/// so the bound only ever refuses what the ledger would.
const DEPTH_MAX: usize = 64;

/// `object` as JSON; `what` names it in a refusal ("the arguments").
pub(crate) fn to_value(object: &Bound<'_, PyAny>, what: &str) -> PyResult<Value> {
    value(object, what, 0)
}

fn value(object: &Bound<'_, PyAny>, what: &str, depth: usize) -> PyResult<Value> {
    if depth > DEPTH_MAX {
        return Err(errors::invalid(format!("{what} nest deeper than {DEPTH_MAX} levels")));
    }
    if object.is_none() {
        return Ok(Value::Null);
    }
    // `bool` first: in Python it is a subclass of `int`.
    if let Ok(flag) = object.cast::<PyBool>() {
        return Ok(Value::Bool(flag.is_true()));
    }
    if let Ok(text) = object.cast::<PyString>() {
        return Ok(Value::String(text.to_str()?.to_owned()));
    }
    if let Ok(int) = object.cast::<PyInt>() {
        return match int.extract::<i64>() {
            Ok(small) => Ok(Value::Number(small.into())),
            Err(_) => Err(errors::invalid(format!("{what} hold an integer beyond 64 bits"))),
        };
    }
    if let Ok(float) = object.cast::<PyFloat>() {
        return Number::from_f64(float.value())
            .map(Value::Number)
            .ok_or_else(|| errors::invalid(format!("{what} hold a number JSON cannot write")));
    }
    if let Ok(dict) = object.cast::<PyDict>() {
        let mut members = Map::new();
        for (key, item) in dict.iter() {
            let Ok(key) = key.cast::<PyString>() else {
                return Err(errors::invalid(format!(
                    "{what} hold a mapping key that is not a str"
                )));
            };
            members.insert(key.to_str()?.to_owned(), value(&item, what, depth + 1)?);
        }
        return Ok(Value::Object(members));
    }
    if let Ok(list) = object.cast::<PyList>() {
        return list.iter().map(|item| value(&item, what, depth + 1)).collect();
    }
    if let Ok(tuple) = object.cast::<PyTuple>() {
        return tuple.iter().map(|item| value(&item, what, depth + 1)).collect();
    }
    let kind = object.get_type().name().map(|name| name.to_string()).unwrap_or_default();
    Err(errors::invalid(format!("{what} hold a {kind}, which is not JSON")))
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
