//! Volume ids and volume paths: validation and lexical normalisation.

use std::path::PathBuf;

use crate::VolumeError;

/// Longest volume path accepted, in bytes (Linux's PATH_MAX).
const MAX_PATH: usize = 4096;
/// Longest single name accepted, in bytes (ext4's limit).
const MAX_NAME: usize = 255;

/// Checks a volume or snapshot id: `[a-z0-9-]{1,64}`. The id becomes a host directory or file
/// name, so nothing that could be `.`, `..`, contain `/` or start a hidden entry gets through.
pub(crate) fn validate_id(what: &str, id: &str) -> Result<(), VolumeError> {
    let ok = !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(VolumeError::InvalidArgument(format!(
            "{what} id {id:?} must match [a-z0-9-]{{1,64}}"
        )))
    }
}

/// A lexically normalised path inside a volume: its components, none of them empty, `.` or
/// `..`, none containing `/` or NUL. No components is the volume's root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct VolPath {
    comps: Vec<String>,
}

impl VolPath {
    /// Normalises `raw` the way E2B does: `/a/b` and `a/b` are the same, `.` and empty
    /// components vanish, `..` pops one component but never climbs above the root (`/../x` is
    /// `/x`). This is purely lexical; symlinks are left to the kernel's RESOLVE_BENEATH
    /// resolution, which refuses any that lead out.
    pub(crate) fn parse(raw: &str) -> Result<VolPath, VolumeError> {
        if raw.contains('\0') {
            return Err(VolumeError::InvalidPath("a path cannot contain NUL".into()));
        }
        if raw.len() > MAX_PATH {
            return Err(VolumeError::InvalidPath(format!(
                "a path cannot be longer than {MAX_PATH} bytes"
            )));
        }
        let mut comps: Vec<String> = Vec::new();
        for c in raw.split('/') {
            match c {
                "" | "." => {}
                ".." => {
                    comps.pop();
                }
                name if name.len() > MAX_NAME => {
                    return Err(VolumeError::InvalidPath(format!(
                        "a name cannot be longer than {MAX_NAME} bytes"
                    )))
                }
                name => comps.push(name.to_string()),
            }
        }
        Ok(VolPath { comps })
    }

    pub(crate) fn is_root(&self) -> bool {
        self.comps.is_empty()
    }

    pub(crate) fn components(&self) -> &[String] {
        &self.comps
    }

    /// The last component; `None` for the root.
    pub(crate) fn name(&self) -> Option<&str> {
        self.comps.last().map(String::as_str)
    }

    /// The parent relative to the volume root, for cap-std: `.` for entries of the root.
    pub(crate) fn parent_rel(&self) -> PathBuf {
        match self.comps.split_last() {
            Some((_, parent)) if !parent.is_empty() => parent.iter().collect(),
            _ => PathBuf::from("."),
        }
    }

    /// The whole path relative to the volume root, for cap-std: `.` for the root.
    pub(crate) fn rel(&self) -> PathBuf {
        if self.comps.is_empty() {
            PathBuf::from(".")
        } else {
            self.comps.iter().collect()
        }
    }

    /// The child `name` of this path.
    pub(crate) fn join(&self, name: &str) -> VolPath {
        let mut comps = self.comps.clone();
        comps.push(name.to_string());
        VolPath { comps }
    }

    /// The absolute form shown to clients: `/` or `/a/b`.
    pub(crate) fn display(&self) -> String {
        if self.comps.is_empty() {
            "/".to_string()
        } else {
            let mut s = String::new();
            for c in &self.comps {
                s.push('/');
                s.push_str(c);
            }
            s
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(p: &str) -> String {
        VolPath::parse(p).unwrap().display()
    }

    #[test]
    fn normalises_lexically() {
        assert_eq!(norm(""), "/");
        assert_eq!(norm("/"), "/");
        assert_eq!(norm("/.."), "/");
        assert_eq!(norm("/../x"), "/x");
        assert_eq!(norm("a/b"), "/a/b");
        assert_eq!(norm("//a/./b/"), "/a/b");
        assert_eq!(norm("/a/b/../../../c"), "/c");
        assert_eq!(norm("a/../../.."), "/");
    }

    #[test]
    fn relative_forms() {
        let p = VolPath::parse("/a/b/c").unwrap();
        assert_eq!(p.parent_rel(), PathBuf::from("a/b"));
        assert_eq!(p.rel(), PathBuf::from("a/b/c"));
        assert_eq!(p.name(), Some("c"));
        let top = VolPath::parse("/x").unwrap();
        assert_eq!(top.parent_rel(), PathBuf::from("."));
        assert!(VolPath::parse("/..").unwrap().is_root());
    }

    #[test]
    fn refuses_nul_and_long_names() {
        assert!(matches!(
            VolPath::parse("a\0b"),
            Err(VolumeError::InvalidPath(_))
        ));
        let long = "x".repeat(256);
        assert!(matches!(
            VolPath::parse(&long),
            Err(VolumeError::InvalidPath(_))
        ));
        assert!(VolPath::parse(&"x".repeat(255)).is_ok());
    }

    #[test]
    fn ids() {
        assert!(validate_id("volume", "abc-123").is_ok());
        assert!(validate_id("volume", &"a".repeat(64)).is_ok());
        for bad in ["", "A", "a/b", ".", "..", "a_b", "a.b", &"a".repeat(65)] {
            assert!(validate_id("volume", bad).is_err(), "{bad:?}");
        }
    }
}
