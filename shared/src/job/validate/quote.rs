//! How validation errors quote what they found: short values, and names close to a misspelt
//! one.

use serde_json::Value;

/// A value as an error quotes it: at most 64 characters of it, so that a rejection stays small
/// (it must fit in a queue message) whatever the value.
pub(super) fn quoted(value: &Value) -> String {
    let text = value.to_string();
    let chars = text.chars().count();
    if chars <= 64 {
        return text;
    }
    let head: String = text.chars().take(60).collect();
    format!("{head}… ({chars} characters)")
}

/// "did you mean …" when a close name exists, else `otherwise`.
pub(super) fn suggest(given: &str, known: &[&str], otherwise: &str) -> String {
    known
        .iter()
        .map(|k| (edit_distance(given, k), *k))
        .filter(|(d, k)| *d <= 2.max(k.len() / 3))
        .min()
        .map_or_else(
            || otherwise.to_owned(),
            |(_, k)| format!("did you mean {k:?}?"),
        )
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}
