//! Uploads leave nothing behind: the data has no name in the volume until it is complete and
//! durable, and a name a crash left mid-replace is swept at the next start.

mod common;

use std::io::Read;

use common::{harness, read_all, write, MIB};
use warren_volume::Owner;

/// Hands out `data`, listing the volume's root once on its first read (while the upload is
/// under way).
struct Watching<'a> {
    data: &'a [u8],
    root: std::path::PathBuf,
    seen: Option<Vec<String>>,
}

impl Read for Watching<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.seen.is_none() {
            let mut names: Vec<String> = std::fs::read_dir(&self.root)?
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            self.seen = Some(names);
        }
        self.data.read(buf)
    }
}

#[test]
fn an_upload_under_way_has_no_name_in_the_volume() {
    let h = harness();
    let c = h.create("uploads", 32 * MIB, 1024);
    write(&c, "old.txt", "old").unwrap();
    for (path, overwrite) in [("/new.txt", false), ("/old.txt", true)] {
        let data = vec![7u8; 3 * 1024 * 1024];
        let mut r = Watching {
            data: &data,
            root: c.mount_point().to_path_buf(),
            seen: None,
        };
        let st = c
            .write_file(path, &Owner::default(), overwrite, &mut r)
            .unwrap();
        assert_eq!(st.size, data.len() as u64);
        let seen = r.seen.unwrap();
        // lost+found is the filesystem's own.
        let expected: Vec<String> = if overwrite {
            vec!["lost+found", "new.txt", "old.txt"]
        } else {
            vec!["lost+found", "old.txt"]
        }
        .into_iter()
        .map(String::from)
        .collect();
        assert_eq!(seen, expected, "{path}");
    }
    let mut names: Vec<String> = std::fs::read_dir(c.mount_point())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, vec!["lost+found", "new.txt", "old.txt"]);
}

#[test]
fn leftovers_of_an_interrupted_replace_are_swept() {
    let h = harness();
    let c = h.create("sweep", 32 * MIB, 1024);
    c.make_dir("/a/b", &Owner::default(), true).unwrap();
    write(&c, "a/b/.warren-upload-1-2-3", "partial").unwrap();
    write(&c, ".warren-upload-9", "partial").unwrap();
    write(&c, "a/keep.txt", "kept").unwrap();
    // A link named like a leftover is not a leftover's file: only regular files go.
    std::os::unix::fs::symlink("/etc/passwd", c.mount_point().join("a/.warren-upload-link"))
        .unwrap();
    // Names written after the start are uploads of this run: left alone.
    let before = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
    assert_eq!(c.remove_leftover_uploads(before).unwrap(), 0);
    let started = std::time::SystemTime::now() + std::time::Duration::from_secs(1);
    assert_eq!(c.remove_leftover_uploads(started).unwrap(), 2);
    assert!(c.stat("/a/b/.warren-upload-1-2-3").is_err());
    assert!(c.stat("/.warren-upload-9").is_err());
    assert_eq!(read_all(&c, "/a/keep.txt"), "kept");
    assert!(c.stat("/a/.warren-upload-link").is_ok());
    assert!(std::path::Path::new("/etc/passwd").exists());
}
