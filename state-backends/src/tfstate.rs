//! Just enough of Terraform's state format (version 4) to guard it: every write is parsed, must
//! keep the workspace's lineage and must not move its serial backwards.

use bytes::Bytes;
use serde::Deserialize;

/// Why bytes are not a state a workspace accepts, or not the successor of its current state.
#[derive(Debug, thiserror::Error)]
pub enum StateFileError {
    #[error("state is not a JSON object: {0}")]
    NotJson(serde_json::Error),
    #[error("state format version {0} is not supported; only version 4 (Terraform >= 0.12) is")]
    Version(u64),
    #[error("state has no numeric \"version\" field")]
    NoVersion,
    #[error("state has no non-negative integer \"serial\" field")]
    NoSerial,
    #[error("state has no non-empty \"lineage\" field")]
    NoLineage,
    /// A sealed state whose header cannot be read, or lacks its serial and lineage.
    #[error("{0}")]
    SealedHeader(String),
    #[error(
        "lineage {new} differs from the workspace's lineage {current}: this state belongs to another workspace"
    )]
    OtherLineage { new: String, current: String },
    #[error(
        "serial {new} is older than the current serial {current}: the writer started from a stale state"
    )]
    SerialBackwards { new: u64, current: u64 },
    #[error(
        "serial {0} equals the current serial but the content differs: two writers changed the same version"
    )]
    SameSerialOtherContent(u64),
    #[error("state does not parse: {0}")]
    Resources(serde_json::Error),
}

/// The facts of a state that decide whether a write may replace another.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateMeta {
    pub serial: u64,
    pub lineage: String,
    pub terraform_version: String,
}

#[derive(Deserialize)]
struct Header {
    version: Option<serde_json::Value>,
    serial: Option<serde_json::Value>,
    lineage: Option<serde_json::Value>,
    terraform_version: Option<String>,
}

impl StateMeta {
    /// Parses the header of a Terraform state.
    ///
    /// # Errors
    /// A message naming the field when the data is not a JSON object, its `version` is not 4,
    /// its `serial` is not a non-negative integer or its `lineage` is missing or empty.
    pub fn parse(data: &[u8]) -> Result<Self, StateFileError> {
        let header: Header = serde_json::from_slice(data).map_err(StateFileError::NotJson)?;
        match header.version.as_ref().and_then(serde_json::Value::as_u64) {
            Some(4) => {}
            Some(other) => return Err(StateFileError::Version(other)),
            None => return Err(StateFileError::NoVersion),
        }
        let serial = header
            .serial
            .as_ref()
            .and_then(serde_json::Value::as_u64)
            .ok_or(StateFileError::NoSerial)?;
        let lineage = match header.lineage {
            Some(serde_json::Value::String(s)) if !s.is_empty() => s,
            _ => return Err(StateFileError::NoLineage),
        };
        Ok(Self {
            serial,
            lineage,
            terraform_version: header.terraform_version.unwrap_or_default(),
        })
    }
}

impl StateMeta {
    /// The facts of a state as a store keeps it: a plain state, or a sealed one (whose header
    /// carries its serial and lineage; see [`crate::sealed`]).
    ///
    /// # Errors
    /// As [`StateMeta::parse`], or a sealed object without them.
    pub fn parse_stored(data: &[u8]) -> Result<Self, StateFileError> {
        if !crate::sealed::is_sealed(data) {
            return Self::parse(data);
        }
        let (_, header, _) = crate::sealed::split(data).map_err(StateFileError::SealedHeader)?;
        match (header.serial, header.lineage) {
            (Some(serial), Some(lineage)) if !lineage.is_empty() => Ok(Self {
                serial,
                lineage,
                terraform_version: String::new(),
            }),
            _ => Err(StateFileError::SealedHeader(
                "the sealed state's header has no serial and lineage".to_owned(),
            )),
        }
    }
}

/// What to do with a state write, given the current state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WriteCheck {
    /// A new version.
    Accept,
    /// The same bytes as the current state: nothing to write.
    Unchanged,
}

/// Decides whether `new` may replace `current` (`None` when the workspace has no state).
///
/// # Errors
/// A message saying why the write would corrupt the workspace's history: another lineage, a
/// serial going backwards, or the same serial with other content.
pub fn check_successor(
    current: Option<(&StateMeta, &[u8])>,
    new: &StateMeta,
    new_data: &[u8],
) -> Result<WriteCheck, StateFileError> {
    let Some((cur, cur_data)) = current else {
        return Ok(WriteCheck::Accept);
    };
    if cur.lineage != new.lineage {
        return Err(StateFileError::OtherLineage {
            new: new.lineage.clone(),
            current: cur.lineage.clone(),
        });
    }
    if new.serial < cur.serial {
        return Err(StateFileError::SerialBackwards {
            new: new.serial,
            current: cur.serial,
        });
    }
    if new.serial == cur.serial {
        if new_data == cur_data {
            return Ok(WriteCheck::Unchanged);
        }
        return Err(StateFileError::SameSerialOtherContent(new.serial));
    }
    Ok(WriteCheck::Accept)
}

/// Returns `data` with its `serial` raised to at least `min_serial`. Every other top-level
/// value is kept byte for byte (numbers too: no round trip through floating point).
///
/// # Errors
/// When `data` is not a JSON object.
pub fn with_serial_at_least(data: &[u8], min_serial: u64) -> Result<Bytes, StateFileError> {
    use serde_json::value::RawValue;
    let mut fields: std::collections::BTreeMap<String, Box<RawValue>> =
        serde_json::from_slice(data).map_err(StateFileError::NotJson)?;
    let serial = fields
        .get("serial")
        .and_then(|raw| raw.get().parse::<u64>().ok())
        .unwrap_or(0);
    let raised = RawValue::from_string(serial.max(min_serial).to_string())
        .expect("a number is a JSON value");
    fields.insert("serial".into(), raised);
    let mut out = serde_json::to_vec(&fields).expect("raw JSON values serialize");
    out.push(b'\n');
    Ok(out.into())
}

/// The addresses of the managed resource instances in a state, as terraform writes them in
/// `-target` (`module.m.type.name["key"]`, `type.name[0]`).
///
/// # Errors
/// When the state is not JSON or its `resources` are malformed.
pub fn resource_addresses(
    data: &[u8],
) -> Result<std::collections::BTreeSet<String>, StateFileError> {
    #[derive(Deserialize)]
    struct State {
        #[serde(default)]
        resources: Vec<Resource>,
    }
    #[derive(Deserialize)]
    struct Resource {
        #[serde(default)]
        module: Option<String>,
        mode: String,
        #[serde(rename = "type")]
        kind: String,
        name: String,
        #[serde(default)]
        instances: Vec<Instance>,
    }
    #[derive(Deserialize)]
    struct Instance {
        #[serde(default)]
        index_key: Option<serde_json::Value>,
    }
    let state: State = serde_json::from_slice(data).map_err(StateFileError::Resources)?;
    let mut out = std::collections::BTreeSet::new();
    for r in state.resources.into_iter().filter(|r| r.mode == "managed") {
        let base = match &r.module {
            Some(module) => format!("{module}.{}.{}", r.kind, r.name),
            None => format!("{}.{}", r.kind, r.name),
        };
        for instance in &r.instances {
            out.insert(match &instance.index_key {
                None => base.clone(),
                Some(serde_json::Value::String(key)) => {
                    format!("{base}[{}]", serde_json::Value::String(key.clone()))
                }
                Some(key) => format!("{base}[{key}]"),
            });
        }
    }
    Ok(out)
}

/// A minimal valid empty state, for tests and fixtures.
pub fn empty_state(lineage: &str, serial: u64) -> Bytes {
    format!(
        "{{\"version\":4,\"terraform_version\":\"0.15.0\",\"serial\":{serial},\"lineage\":\"{lineage}\",\"outputs\":{{}},\"resources\":[]}}\n"
    )
    .into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(serial: u64, lineage: &str) -> StateMeta {
        StateMeta::parse(&empty_state(lineage, serial)).unwrap()
    }

    #[test]
    fn parses_the_header_and_names_the_bad_field() {
        assert_eq!(meta(7, "l-1").serial, 7);
        let cases = [
            (r#"[1]"#, "not a JSON object"),
            (r#"{"version":3,"serial":1,"lineage":"x"}"#, "version 3"),
            (r#"{"serial":1,"lineage":"x"}"#, "\"version\""),
            (r#"{"version":4,"serial":-1,"lineage":"x"}"#, "\"serial\""),
            (r#"{"version":4,"serial":1,"lineage":""}"#, "\"lineage\""),
            ("not json", "not a JSON object"),
        ];
        for (input, expected) in cases {
            let err = StateMeta::parse(input.as_bytes()).unwrap_err().to_string();
            assert!(err.contains(expected), "{input}: {err}");
        }
    }

    #[test]
    fn successor_rules() {
        let cur_data = empty_state("a", 5);
        let cur = meta(5, "a");
        let check =
            |new: &StateMeta, data: &[u8]| check_successor(Some((&cur, &cur_data)), new, data);
        assert_eq!(
            check(&meta(6, "a"), &empty_state("a", 6)).unwrap(),
            WriteCheck::Accept
        );
        assert_eq!(check(&cur, &cur_data).unwrap(), WriteCheck::Unchanged);
        let older = check(&meta(4, "a"), &empty_state("a", 4)).unwrap_err();
        assert!(
            matches!(
                older,
                StateFileError::SerialBackwards { new: 4, current: 5 }
            ),
            "{older}"
        );
        assert!(older.to_string().contains("older"));
        let other = check(&meta(6, "b"), &empty_state("b", 6)).unwrap_err();
        assert!(
            matches!(&other, StateFileError::OtherLineage { new, current } if new == "b" && current == "a"),
            "{other}"
        );
        let same_serial_other_content = b"{\"version\":4,\"serial\":5,\"lineage\":\"a\",\"x\":1}";
        let differs = check(&cur, same_serial_other_content).unwrap_err();
        assert!(
            matches!(differs, StateFileError::SameSerialOtherContent(5)),
            "{differs}"
        );
        assert!(differs.to_string().contains("content differs"));
        assert_eq!(
            check_successor(None, &meta(0, "z"), b"").unwrap(),
            WriteCheck::Accept
        );
    }

    #[test]
    fn resource_addresses_are_written_as_terraform_targets_them() {
        let state = br#"{"version":4,"serial":1,"lineage":"a","resources":[
          {"mode":"managed","type":"t","name":"one","instances":[{"attributes":{}}]},
          {"mode":"managed","type":"t","name":"n","instances":[{"index_key":"a"},{"index_key":"b"}]},
          {"mode":"managed","type":"t","name":"c","instances":[{"index_key":0}]},
          {"module":"module.m","mode":"managed","type":"t","name":"x","instances":[{}]},
          {"mode":"data","type":"d","name":"ignored","instances":[{}]}]}"#;
        let got: Vec<String> = resource_addresses(state).unwrap().into_iter().collect();
        assert_eq!(
            got,
            [
                "module.m.t.x",
                "t.c[0]",
                "t.n[\"a\"]",
                "t.n[\"b\"]",
                "t.one"
            ]
        );
    }

    #[test]
    fn raising_the_serial_keeps_the_rest() {
        let raised = with_serial_at_least(&empty_state("a", 2), 9).unwrap();
        let m = StateMeta::parse(&raised).unwrap();
        assert_eq!((m.serial, m.lineage.as_str()), (9, "a"));
        let kept = with_serial_at_least(&empty_state("a", 12), 9).unwrap();
        assert_eq!(StateMeta::parse(&kept).unwrap().serial, 12);
        // Numbers beyond what a float holds survive untouched.
        let big = br#"{"version":4,"serial":1,"lineage":"a","resources":[{"id":123456789012345678901234567890,"f":0.1000000000000000055511151231257827}]}"#;
        let out = with_serial_at_least(big, 5).unwrap();
        let text = String::from_utf8(out.to_vec()).unwrap();
        assert!(text.contains("123456789012345678901234567890"), "{text}");
        assert!(
            text.contains("0.1000000000000000055511151231257827"),
            "{text}"
        );
        assert!(text.contains("\"serial\":5"), "{text}");
    }
}
