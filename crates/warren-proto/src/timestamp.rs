//! `google.protobuf.Timestamp` with the canonical proto3-JSON form: RFC 3339 in UTC with a `Z`
//! suffix and 0, 3, 6 or 9 fractional digits (what Go's protojson, and so envd, emits).

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{de, Deserialize, Deserializer, Serialize, Serializer};

#[derive(Clone, Copy, PartialEq, Eq, Hash, prost::Message)]
pub struct Timestamp {
    #[prost(int64, tag = "1")]
    pub seconds: i64,
    #[prost(int32, tag = "2")]
    pub nanos: i32,
}

impl Timestamp {
    pub fn from_system_time(t: std::time::SystemTime) -> Self {
        let dt: DateTime<Utc> = t.into();
        Self {
            seconds: dt.timestamp(),
            nanos: dt.timestamp_subsec_nanos() as i32,
        }
    }
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let dt = DateTime::<Utc>::from_timestamp(self.seconds, self.nanos.max(0) as u32)
            .ok_or_else(|| serde::ser::Error::custom("timestamp out of range"))?;
        s.serialize_str(&dt.to_rfc3339_opts(SecondsFormat::AutoSi, true))
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        let dt = DateTime::parse_from_rfc3339(&text).map_err(de::Error::custom)?;
        Ok(Self {
            seconds: dt.timestamp(),
            nanos: dt.timestamp_subsec_nanos() as i32,
        })
    }
}
