//! Path resolution shared by every path-taking operation, as envd does it: empty → default
//! workdir (or home), `~` → home, relative → under the user's home, then lexically cleaned.

use std::path::{Component, Path, PathBuf};

use crate::users::User;

pub fn resolve(raw: &str, user: &User, default_workdir: Option<&Path>) -> PathBuf {
    let joined = if raw.is_empty() {
        default_workdir
            .map(Path::to_path_buf)
            .unwrap_or_else(|| user.home.clone())
    } else if raw == "~" {
        user.home.clone()
    } else if let Some(rest) = raw.strip_prefix("~/") {
        user.home.join(rest)
    } else if raw.starts_with('/') {
        PathBuf::from(raw)
    } else {
        user.home.join(raw)
    };
    clean(&joined)
}

/// Lexical cleaning: drops `.`, resolves `..` without touching the filesystem.
pub fn clean(p: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for c in p.components() {
        match c {
            Component::Normal(s) => out.push(s),
            Component::ParentDir => {
                out.pop();
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user() -> User {
        User {
            name: "user".into(),
            uid: 1000,
            gid: 1000,
            home: "/home/user".into(),
            shell: "/bin/bash".into(),
            groups: vec![1000],
        }
    }

    #[test]
    fn resolves_like_envd() {
        let u = user();
        assert_eq!(
            resolve("x.txt", &u, None),
            PathBuf::from("/home/user/x.txt")
        );
        assert_eq!(resolve("~/a/../b", &u, None), PathBuf::from("/home/user/b"));
        assert_eq!(resolve("~", &u, None), PathBuf::from("/home/user"));
        assert_eq!(
            resolve("", &u, Some(Path::new("/work"))),
            PathBuf::from("/work")
        );
        assert_eq!(resolve("", &u, None), PathBuf::from("/home/user"));
        assert_eq!(
            resolve("/etc/../../tmp/./f", &u, None),
            PathBuf::from("/tmp/f")
        );
    }
}
