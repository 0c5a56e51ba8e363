//! Hostile layers: nothing a layer says may create, change or remove anything outside the
//! destination. Each test unpacks into `outer/root` next to a file `outer/victim`, and checks
//! that `outer` is exactly as it was. No registry is needed: the layers are local files.

mod common;

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::PathBuf;

use common::*;
use tar::EntryType;
use warren_oci::{unpack_limited, ImageConfig, Layer, PullError, PulledImage};

struct Scene {
    outer: tempfile::TempDir,
    outer_mode: u32,
    blobs: tempfile::TempDir,
}

impl Scene {
    fn new() -> Scene {
        let outer = tempfile::tempdir().unwrap();
        std::fs::create_dir(outer.path().join("root")).unwrap();
        std::fs::write(outer.path().join("victim"), "original").unwrap();
        std::fs::set_permissions(
            outer.path().join("victim"),
            std::fs::Permissions::from_mode(0o640),
        )
        .unwrap();
        let outer_mode = std::fs::metadata(outer.path())
            .unwrap()
            .permissions()
            .mode();
        Scene {
            outer_mode,
            outer,
            blobs: tempfile::tempdir().unwrap(),
        }
    }

    fn root(&self) -> PathBuf {
        self.outer.path().join("root")
    }

    fn outer(&self) -> String {
        self.outer.path().display().to_string()
    }

    fn unpack(&self, layers: Vec<(Vec<u8>, &str)>) -> Result<u64, PullError> {
        self.unpack_limited(layers, u64::MAX)
    }

    fn unpack_limited(&self, layers: Vec<(Vec<u8>, &str)>, max: u64) -> Result<u64, PullError> {
        let layers = layers
            .into_iter()
            .enumerate()
            .map(|(i, (data, media_type))| {
                let path = self.blobs.path().join(format!("layer{i}"));
                std::fs::write(&path, &data).unwrap();
                Layer {
                    digest: format!("sha256:{i:064}"),
                    media_type: media_type.into(),
                    path,
                    size: data.len() as u64,
                }
            })
            .collect();
        let image = PulledImage {
            reference: "test/hostile:1".into(),
            manifest_digest: String::new(),
            index_digest: None,
            layers,
            config: ImageConfig::default(),
        };
        unpack_limited(&image, &self.root(), max)
    }

    /// `outer` still holds exactly `root` and an untouched `victim`.
    fn assert_outside_untouched(&self) {
        let mut names: Vec<_> = std::fs::read_dir(self.outer.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["root", "victim"]);
        let victim = self.outer.path().join("victim");
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "original");
        let meta = std::fs::metadata(&victim).unwrap();
        assert_eq!(meta.permissions().mode() & 0o7777, 0o640);
        assert_eq!(meta.nlink(), 1, "no hard link to the victim");
        let outer = std::fs::metadata(self.outer.path()).unwrap();
        assert_eq!(outer.permissions().mode(), self.outer_mode);
    }
}

fn raw_layer(entries: &[(&str, EntryType, &str, &[u8])]) -> Vec<u8> {
    let mut out = Vec::new();
    for (path, kind, link, data) in entries {
        raw_entry(&mut out, path, *kind, link, data);
    }
    end_tar(&mut out);
    out
}

fn is_root() -> bool {
    warren_testkit::require("root (layers carry ownership)", warren_testkit::is_root())
}

#[test]
fn dotdot_paths_are_refused() {
    if !is_root() {
        return;
    }
    let s = Scene::new();
    for path in ["../victim", "a/../../victim", "./../../escape"] {
        let layer = raw_layer(&[(path, EntryType::Regular, "", b"pwned")]);
        let err = s.unpack(vec![(layer, TAR)]).unwrap_err();
        assert!(matches!(err, PullError::BadImage { .. }), "{path}: {err:?}");
        assert!(err.to_string().contains("'..'"), "{err}");
    }
    s.assert_outside_untouched();
}

#[test]
fn absolute_paths_land_inside_the_root() {
    if !is_root() {
        return;
    }
    let s = Scene::new();
    let victim = format!("{}/victim", s.outer());
    let layer = raw_layer(&[(&victim, EntryType::Regular, "", b"pwned")]);
    s.unpack(vec![(layer, TAR)]).unwrap();
    s.assert_outside_untouched();
    let inside = s.root().join(victim.trim_start_matches('/'));
    assert_eq!(std::fs::read_to_string(inside).unwrap(), "pwned");
}

#[test]
fn writing_through_symlinks_stays_inside_the_root() {
    if !is_root() {
        return;
    }
    let s = Scene::new();
    let outer = s.outer();
    let outer_rel = outer.trim_start_matches('/');
    // Paths through `/` and `..` aim at the outer (temporary) directory, so that a broken
    // unpacker shows up there rather than writing to the host's own `/`.
    let via_slash = format!("slash/{outer_rel}/pwned-slash");
    let via_up = format!("up/{outer_rel}/pwned-up");
    let deeper = format!("slash/{outer_rel}/deeper/file");
    // Same layer: a symlink to `/`, one to the outer directory, one climbing with `..`.
    let first = raw_layer(&[
        ("slash", EntryType::Symlink, "/", b""),
        ("out", EntryType::Symlink, &outer, b""),
        ("up", EntryType::Symlink, "../../../../../../../../..", b""),
        (&via_slash, EntryType::Regular, "", b"x"),
        ("out/pwned-out", EntryType::Regular, "", b"x"),
        (&via_up, EntryType::Regular, "", b"x"),
    ]);
    // Next layer: through the symlinks the first one made, and over them.
    let victim_link = format!("{outer}/victim");
    let second = raw_layer(&[
        ("out/victim", EntryType::Regular, "", b"pwned"),
        (&deeper, EntryType::Regular, "", b"x"),
        ("out/.wh.victim", EntryType::Regular, "", b""),
        ("op", EntryType::Symlink, &format!("{outer}/elsewhere"), b""),
        ("op/.wh..wh..opq", EntryType::Regular, "", b""),
        ("vlink", EntryType::Symlink, &victim_link, b""),
    ]);
    let third = raw_layer(&[
        (
            "vlink",
            EntryType::Regular,
            "",
            b"replaced the link, not its target",
        ),
        ("out", EntryType::Directory, "", b""),
        ("out/after", EntryType::Regular, "", b"x"),
    ]);
    s.unpack(vec![(first, TAR), (second, TAR), (third, TAR)])
        .unwrap();
    s.assert_outside_untouched();
    let r = s.root();
    let inner = r.join(outer_rel);
    assert!(inner.join("pwned-slash").is_file(), "`/` is the root");
    assert!(inner.join("deeper/file").is_file());
    assert!(inner.join("pwned-up").is_file(), "`..` stops at the root");
    assert!(inner.join("pwned-out").is_file());
    assert!(inner.join("elsewhere").is_dir(), "made inside");
    assert_eq!(
        std::fs::read_to_string(r.join("vlink")).unwrap(),
        "replaced the link, not its target"
    );
    assert!(!r.join("vlink").is_symlink());
    assert!(r.join("out").is_dir() && !r.join("out").is_symlink());
    assert!(r.join("out/after").is_file());
}

#[test]
fn hard_links_cannot_reach_outside() {
    if !is_root() {
        return;
    }
    let s = Scene::new();
    let dotdot = raw_layer(&[("hl", EntryType::Link, "../victim", b"")]);
    let err = s.unpack(vec![(dotdot, TAR)]).unwrap_err();
    assert!(matches!(err, PullError::BadImage { .. }), "{err:?}");
    let victim = format!("{}/victim", s.outer());
    let absolute = raw_layer(&[("hl", EntryType::Link, &victim, b"")]);
    let err = s.unpack(vec![(absolute, TAR)]).unwrap_err();
    assert!(
        matches!(err, PullError::Io { .. }),
        "no such file inside: {err:?}"
    );
    let via_symlink = raw_layer(&[
        ("out", EntryType::Symlink, &s.outer(), b""),
        ("hl2", EntryType::Link, "out/victim", b""),
    ]);
    assert!(s.unpack(vec![(via_symlink, TAR)]).is_err());
    s.assert_outside_untouched();
}

#[test]
fn compression_is_told_by_magic_and_a_false_label_is_refused() {
    if !is_root() {
        return;
    }
    let s = Scene::new();
    let layer = tar(&[Entry::File("f", b"zstd under a plain label", 0o644, 0, 0)]);
    s.unpack(vec![(zstd(&layer), TAR)]).unwrap();
    assert_eq!(
        std::fs::read_to_string(s.root().join("f")).unwrap(),
        "zstd under a plain label"
    );
    let err = s.unpack(vec![(layer, TAR_GZIP)]).unwrap_err();
    assert!(matches!(err, PullError::BadImage { .. }), "{err:?}");
    let err = s
        .unpack(vec![(b"not a tar at all".repeat(64), TAR)])
        .unwrap_err();
    assert!(matches!(err, PullError::BadImage { .. }), "{err:?}");
    s.assert_outside_untouched();
}

#[test]
fn a_whiteout_of_dot_or_dotdot_removes_nothing_outside() {
    if !is_root() {
        return;
    }
    for name in [".wh...", ".wh..", "sub/.wh...", "sub/.wh.."] {
        let s = Scene::new();
        let first = tar(&[
            Entry::Dir("sub/", 0o755),
            Entry::File("sub/keep", b"k", 0o644, 0, 0),
        ]);
        let second = raw_layer(&[(name, EntryType::Regular, "", b"")]);
        let err = s.unpack(vec![(first, TAR), (second, TAR)]).unwrap_err();
        assert!(matches!(err, PullError::BadImage { .. }), "{name}: {err:?}");
        s.assert_outside_untouched();
        assert!(s.root().join("sub/keep").is_file(), "{name}");
    }
}

#[test]
fn a_layer_that_expands_past_the_limit_is_refused() {
    if !is_root() {
        return;
    }
    let s = Scene::new();
    let big = vec![0u8; 4 << 20];
    let layer = tar(&[
        Entry::File("small", b"fits", 0o644, 0, 0),
        Entry::File("big", &big, 0o644, 0, 0),
    ]);
    let packed = gzip(&layer);
    assert!(packed.len() < 64 << 10, "4 MiB of zeros packs small");
    let image_layers = vec![(packed, TAR_GZIP)];
    let err = s.unpack_limited(image_layers, 1 << 20).unwrap_err();
    assert!(
        matches!(err, PullError::TooLarge { limit } if limit == 1 << 20),
        "{err:?}"
    );
    let big_len = std::fs::metadata(s.root().join("big"))
        .map(|m| m.len())
        .unwrap_or(0);
    assert!(big_len <= (1 << 20) + 1, "stopped at the limit: {big_len}");
    s.assert_outside_untouched();
}
