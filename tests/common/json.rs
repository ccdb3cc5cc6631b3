//! Reading JSON documents in assertions; shared by the `e2e` and `checks`
//! test binaries.

use serde_json::Value;

/// The string `field` of each object in the JSON array `list`, in order (objects without it
/// are skipped); panics if `list` is not an array.
pub fn strings_of<'a>(list: &'a Value, field: &str) -> Vec<&'a str> {
    list.as_array()
        .unwrap_or_else(|| panic!("not an array: {list}"))
        .iter()
        .filter_map(|item| item[field].as_str())
        .collect()
}
