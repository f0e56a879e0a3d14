//! What the JSON Schemas of Terrace's records (`docs/schema/`) need beyond the derives: the
//! schema of a time written as RFC 3339 text.

use schemars::{Schema, SchemaGenerator, json_schema};

/// A time as every record writes it: RFC 3339, in UTC.
pub fn date_time(_: &mut SchemaGenerator) -> Schema {
    json_schema!({ "type": "string", "format": "date-time" })
}

/// An optional time, `null` or left out when it has none.
pub fn optional_date_time(_: &mut SchemaGenerator) -> Schema {
    json_schema!({ "type": ["string", "null"], "format": "date-time" })
}
