//! What a sandbox is given, in one value: the same three numbers travel from a template or a
//! snapshot through a create to the runtime and back into records.

use serde::{Deserialize, Serialize};

/// A sandbox's size: virtual CPUs, memory and its writable disk. Serialised as its three
/// fields (`cpu_count`, `memory_mb`, `disk_mb`), so a record that embeds it with
/// `#[serde(flatten)]` keeps the shape it had when they were separate fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resources {
    pub cpu_count: u32,
    pub memory_mb: u32,
    /// Size of the writable root filesystem.
    pub disk_mb: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flattened_it_keeps_the_three_fields_of_a_record() {
        #[derive(Serialize, Deserialize, PartialEq, Debug)]
        struct Record {
            id: String,
            #[serde(flatten)]
            resources: Resources,
        }
        let r = Record {
            id: "x".into(),
            resources: Resources {
                cpu_count: 2,
                memory_mb: 512,
                disk_mb: 1024,
            },
        };
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"id": "x", "cpu_count": 2, "memory_mb": 512, "disk_mb": 1024})
        );
        assert_eq!(serde_json::from_value::<Record>(json).unwrap(), r);
    }
}
