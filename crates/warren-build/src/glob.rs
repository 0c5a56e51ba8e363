//! Docker's wildcard COPY sources over an uploaded context: Go's `filepath.Match` rules
//! (`*` is any run of characters but `/`, dot files included; `?` one character; `[...]` a
//! class with ranges and `^`/`!` negation; `\` escapes), matched segment by segment against
//! every path in the context's tar (its directories included, named or implied).

use std::collections::BTreeSet;
use std::path::Path;

/// Whether one path segment matches one pattern segment.
pub(crate) fn segment_matches(pattern: &[char], name: &[char]) -> bool {
    match pattern.first() {
        None => name.is_empty(),
        Some('*') => (0..=name.len()).any(|i| segment_matches(&pattern[1..], &name[i..])),
        Some('?') => !name.is_empty() && segment_matches(&pattern[1..], &name[1..]),
        Some('[') => {
            let Some(&c) = name.first() else {
                return false;
            };
            let mut i = 1;
            let negate = matches!(pattern.get(1), Some('^') | Some('!'));
            if negate {
                i += 1;
            }
            let mut hit = false;
            let mut first = true;
            while i < pattern.len() && (first || pattern[i] != ']') {
                first = false;
                let lo = if pattern[i] == '\\' && i + 1 < pattern.len() {
                    i += 1;
                    pattern[i]
                } else {
                    pattern[i]
                };
                let mut hi = lo;
                if pattern.get(i + 1) == Some(&'-') && pattern.get(i + 2).is_some_and(|&h| h != ']')
                {
                    hi = pattern[i + 2];
                    i += 2;
                }
                if lo <= c && c <= hi {
                    hit = true;
                }
                i += 1;
            }
            // An unterminated class matches nothing (Go reports it as a bad pattern).
            if i >= pattern.len() {
                return false;
            }
            hit != negate && segment_matches(&pattern[i + 1..], &name[1..])
        }
        Some('\\') if pattern.len() > 1 => {
            name.first() == Some(&pattern[1]) && segment_matches(&pattern[2..], &name[1..])
        }
        Some(&p) => name.first() == Some(&p) && segment_matches(&pattern[1..], &name[1..]),
    }
}

/// Whether `path` (relative, `/`-separated) matches `pattern`, segment for segment.
pub(crate) fn path_matches(pattern: &str, path: &str) -> bool {
    let ps: Vec<&str> = pattern
        .split('/')
        .filter(|s| !s.is_empty() && *s != ".")
        .collect();
    let ns: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    ps.len() == ns.len()
        && ps.iter().zip(&ns).all(|(p, n)| {
            let p: Vec<char> = p.chars().collect();
            let n: Vec<char> = n.chars().collect();
            segment_matches(&p, &n)
        })
}

/// The paths of the tar `archive` (sorted) that `pattern` matches.
pub(crate) fn matching_entries(archive: &Path, pattern: &str) -> Result<Vec<String>, String> {
    let file =
        std::fs::File::open(archive).map_err(|e| format!("open {}: {e}", archive.display()))?;
    let mut tar = tar::Archive::new(std::io::BufReader::new(file));
    let mut paths = BTreeSet::new();
    for entry in tar
        .entries()
        .map_err(|e| format!("reading the context: {e}"))?
    {
        let entry = entry.map_err(|e| format!("reading the context: {e}"))?;
        let path = entry
            .path()
            .map_err(|e| format!("reading the context: {e}"))?;
        let parts: Vec<String> = path
            .components()
            .filter_map(|c| match c {
                std::path::Component::Normal(p) => Some(p.to_string_lossy().into_owned()),
                _ => None,
            })
            .collect();
        // Every directory on the way is a path too, named in the tar or not.
        for n in 1..=parts.len() {
            paths.insert(parts[..n].join("/"));
        }
    }
    Ok(paths
        .into_iter()
        .filter(|p| path_matches(pattern, p))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_as_gos_filepath_match() {
        let m = path_matches;
        assert!(m("*.py", "app.py"));
        assert!(m("*.py", ".hidden.py"));
        assert!(!m("*.py", "src/app.py"));
        assert!(m("src/*.py", "src/app.py"));
        assert!(m("?.txt", "a.txt"));
        assert!(!m("?.txt", "ab.txt"));
        assert!(m("[ab]?.txt", "bz.txt"));
        assert!(!m("[ab]?.txt", "cz.txt"));
        assert!(m("[^ab].txt", "c.txt"));
        assert!(m("[!ab].txt", "c.txt"));
        assert!(!m("[^ab].txt", "a.txt"));
        assert!(m("[a-c]", "b"));
        assert!(!m("[a-c]", "d"));
        assert!(m("a\\*", "a*"));
        assert!(!m("a\\*", "ab"));
        assert!(!m("[ab", "a"));
        assert!(m("*", "dir"));
        assert!(m("./*.py", "x.py"));
    }

    #[test]
    fn the_context_is_matched_with_its_implied_directories() {
        let d = tempfile::tempdir().unwrap();
        let tar_path = d.path().join("c.tar");
        let mut b = tar::Builder::new(std::fs::File::create(&tar_path).unwrap());
        for (p, data) in [
            ("a.py", "a"),
            ("src/b.py", "b"),
            ("src/c.txt", "c"),
            ("lib/x/y.py", "y"),
        ] {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            b.append_data(&mut h, p, data.as_bytes()).unwrap();
        }
        b.finish().unwrap();
        drop(b);
        assert_eq!(matching_entries(&tar_path, "*.py").unwrap(), ["a.py"]);
        assert_eq!(
            matching_entries(&tar_path, "src/*").unwrap(),
            ["src/b.py", "src/c.txt"]
        );
        assert_eq!(matching_entries(&tar_path, "l*").unwrap(), ["lib"]);
        assert_eq!(matching_entries(&tar_path, "*/*.py").unwrap(), ["src/b.py"]);
        assert!(matching_entries(&tar_path, "none*").unwrap().is_empty());
    }
}
