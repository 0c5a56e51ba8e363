//! The recipe hash is the image cache key: it must be stable (or every host rebuilds its images
//! after an innocent refactor) and it must change whenever the image would change.

use warren_template::{Compression, PostStep, Recipe, FORMAT_VERSION, SHORT_HASH_LEN};

/// A fixed recipe, independent of `Recipe::base()` so that editing the base template does not
/// touch the golden value below.
fn fixture() -> Recipe {
    Recipe {
        name: "fixture".to_owned(),
        suite: "bookworm".to_owned(),
        variant: "minbase".to_owned(),
        architecture: "amd64".to_owned(),
        mirror: "http://deb.debian.org/debian".to_owned(),
        components: vec!["main".to_owned()],
        packages: vec!["python3".to_owned(), "git".to_owned()],
        apt_options: vec!["Acquire::Retries \"3\"".to_owned()],
        dpkg_options: vec!["path-exclude=/usr/share/man/*".to_owned()],
        setup_dirs: Vec::new(),
        post_steps: vec![
            PostStep::Group {
                name: "user".to_owned(),
                gid: 1000,
            },
            PostStep::WriteFile {
                path: "/etc/hostname".to_owned(),
                contents: "x\n".to_owned(),
                mode: 0o644,
            },
        ],
        compression: Compression::Lz4hc,
    }
}

#[test]
fn hash_is_stable_across_runs_and_builds() {
    // Golden value. If this fails, the canonical encoding of recipes changed (a field was added,
    // renamed or reordered, serde output changed, FORMAT_VERSION was bumped): every cached image
    // on every host will be rebuilt once. If that is intended, update the value.
    // Cross-checked independently: it is SHA-256 of "warren-image recipe format 1\n" followed
    // by the compact JSON of the recipe with packages sorted (python3's json.dumps with
    // separators=(",", ":") gives the same bytes).
    assert_eq!(
        FORMAT_VERSION, 1,
        "FORMAT_VERSION changed: update the golden hash below too"
    );
    assert_eq!(
        fixture().hash(),
        "283d0da4dcc706d277507ce4807d867f96db28d5d78575b55227fd107e7bacab",
        "the recipe encoding changed; see the comment above"
    );
}

#[test]
fn hash_is_deterministic_and_well_formed() {
    let base = Recipe::base();
    assert_eq!(base.hash(), Recipe::base().hash());
    assert_eq!(base.hash(), base.clone().hash());
    let hash = base.hash();
    assert_eq!(hash.len(), 64);
    assert!(
        hash.chars()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()),
        "{hash}"
    );
    assert_eq!(
        base.cache_key(),
        format!("base-{}", &hash[..SHORT_HASH_LEN])
    );
}

#[test]
fn adding_a_package_changes_the_hash() {
    let base = Recipe::base();
    let mut more = base.clone();
    more.packages.push("vim-tiny".to_owned());
    assert_ne!(base.hash(), more.hash());
    assert_ne!(base.cache_key(), more.cache_key());
}

#[test]
fn package_order_and_duplicates_do_not_matter() {
    let base = Recipe::base();
    let mut shuffled = base.clone();
    shuffled.packages.reverse();
    shuffled.packages.push(base.packages[0].clone());
    assert_eq!(base.hash(), shuffled.hash());
}

#[test]
fn every_ingredient_is_part_of_the_key() {
    let base = fixture();
    type Change = Box<dyn Fn(&mut Recipe)>;
    let variants: Vec<(&str, Change)> = vec![
        ("name", Box::new(|r| r.name = "other".to_owned())),
        ("suite", Box::new(|r| r.suite = "trixie".to_owned())),
        ("variant", Box::new(|r| r.variant = "apt".to_owned())),
        (
            "architecture",
            Box::new(|r| r.architecture = "arm64".to_owned()),
        ),
        (
            "mirror",
            Box::new(|r| r.mirror = "http://deb.debian.org/debian/".to_owned()),
        ),
        (
            "components",
            Box::new(|r| r.components.push("contrib".to_owned())),
        ),
        ("package removed", Box::new(|r| drop(r.packages.pop()))),
        ("apt option", Box::new(|r| r.apt_options.clear())),
        (
            "dpkg option",
            Box::new(|r| {
                r.dpkg_options
                    .push("path-exclude=/usr/share/info/*".to_owned())
            }),
        ),
        ("post-step order", Box::new(|r| r.post_steps.reverse())),
        (
            "post-step content",
            Box::new(|r| {
                r.post_steps[1] = PostStep::WriteFile {
                    path: "/etc/hostname".to_owned(),
                    contents: "y\n".to_owned(),
                    mode: 0o644,
                }
            }),
        ),
        (
            "post-step mode",
            Box::new(|r| {
                r.post_steps[1] = PostStep::WriteFile {
                    path: "/etc/hostname".to_owned(),
                    contents: "x\n".to_owned(),
                    mode: 0o600,
                }
            }),
        ),
        (
            "compression",
            Box::new(|r| r.compression = Compression::Lz4),
        ),
    ];
    for (what, change) in variants {
        let mut changed = base.clone();
        change(&mut changed);
        assert_ne!(
            base.hash(),
            changed.hash(),
            "changing the {what} must change the hash"
        );
    }
}

#[test]
fn base_recipe_has_what_the_template_promises() {
    let base = Recipe::base();
    for package in [
        "python3",
        "python3-pip",
        "python3-venv",
        "nodejs",
        "npm",
        "git",
        "curl",
        "ca-certificates",
        "sudo",
        "procps",
        "iproute2",
    ] {
        assert!(
            base.packages.iter().any(|p| p == package),
            "base lacks {package}"
        );
    }
    assert_eq!(base.suite, "bookworm");
    assert_eq!(base.variant, "minbase");
    assert_eq!(base.mirror, "http://deb.debian.org/debian");
    assert!(
        !base.packages.iter().any(|p| p.contains("agent")),
        "the agent is a separate layer, never part of the image"
    );
    base.validate().expect("base recipe is valid");
}
