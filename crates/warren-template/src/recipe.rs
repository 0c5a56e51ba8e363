//! What an image is made of, and the content hash that is its cache key.
//!
//! A [`Recipe`] is plain data: everything that decides the bytes of the image is in it (suite,
//! variant, mirror, packages, dpkg/apt options, post-steps, compression) plus
//! [`FORMAT_VERSION`], which stands for the code that interprets it. Two equal recipes produce
//! the same key; any change to a field produces a new key and therefore a new build, while the
//! old image stays on disk for the sandboxes still using it.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{ImageError, Result};

/// Version of the build procedure. Bump it whenever the code that turns a recipe into an image
/// changes what ends up in the image (how a post-step is applied, mmdebstrap flags we add, mkfs
/// options), so every cache built by the old code is invalidated without touching any recipe.
pub const FORMAT_VERSION: u32 = 1;

/// The Debian archive. It is the only package source reachable from our hosts, and images must
/// not depend on any other (see platform-notes §4).
pub const DEBIAN_MIRROR: &str = "http://deb.debian.org/debian";

/// Number of hex digits of the recipe hash used in cache directory names. 48 bits: collisions
/// between the handful of recipes on one host are not a practical concern, and paths stay short.
pub const SHORT_HASH_LEN: usize = 12;

/// Home directory of the unprivileged sandbox account.
pub const USER_HOME: &str = "/home/user";

/// How `mkfs.erofs` compresses file data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    /// Uncompressed: fastest to build, about 1.8x larger.
    None,
    /// LZ4: fast to build, decompresses at memory speed.
    Lz4,
    /// LZ4HC: same decompressor as LZ4 (so reads cost the same), smaller output, slower to
    /// build. The build happens once per recipe, so this is the default.
    Lz4hc,
}

impl Compression {
    /// The `-z` argument for `mkfs.erofs`, if any.
    pub(crate) fn mkfs_arg(self) -> Option<&'static str> {
        match self {
            Compression::None => None,
            Compression::Lz4 => Some("-zlz4"),
            Compression::Lz4hc => Some("-zlz4hc"),
        }
    }
}

/// A change applied to the bootstrapped tree before it is packed, in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "step", rename_all = "snake_case")]
pub enum PostStep {
    /// `groupadd --gid` inside the tree.
    Group {
        /// Group name.
        name: String,
        /// Numeric group id.
        gid: u32,
    },
    /// `useradd --create-home` inside the tree (copies the tree's own /etc/skel).
    User {
        /// Login name.
        name: String,
        /// Numeric user id.
        uid: u32,
        /// Primary group id; the group must exist (add a [`PostStep::Group`] first).
        gid: u32,
        /// Absolute home directory.
        home: String,
        /// Absolute login shell.
        shell: String,
        /// Supplementary groups, which must exist in the tree (e.g. `sudo`).
        groups: Vec<String>,
    },
    /// Replace (or create) a regular file, owned by root, with exactly this content and mode.
    /// An existing symlink at the path is removed, never followed.
    WriteFile {
        /// Absolute path inside the image.
        path: String,
        /// Full content.
        contents: String,
        /// Permission bits, e.g. `0o644`.
        mode: u32,
    },
    /// Delete everything inside a directory but keep the directory itself.
    ClearDir {
        /// Absolute path inside the image; `/` is refused.
        path: String,
    },
}

/// Everything needed to build one template image, and nothing else.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recipe {
    /// Template name; also the prefix of the cache directory (`[a-z0-9][a-z0-9_-]*`).
    pub name: String,
    /// Debian suite, e.g. `bookworm`.
    pub suite: String,
    /// mmdebstrap variant, e.g. `minbase`.
    pub variant: String,
    /// Debian architecture, e.g. `amd64`.
    pub architecture: String,
    /// Archive URL.
    pub mirror: String,
    /// Archive components, e.g. `main`.
    pub components: Vec<String>,
    /// Packages installed on top of the variant. Order does not matter (it is normalised
    /// before hashing, since apt resolves the same set either way).
    pub packages: Vec<String>,
    /// `--aptopt` values; mmdebstrap also leaves them in the image's apt configuration.
    pub apt_options: Vec<String>,
    /// `--dpkgopt` values; mmdebstrap also leaves them in the image's dpkg configuration, so
    /// path excludes keep applying to packages installed later inside a sandbox.
    pub dpkg_options: Vec<String>,
    /// Directories made in the tree before any package is installed (an mmdebstrap setup
    /// hook): maintainer scripts that write where the path excludes above keep dpkg out need
    /// them (OpenJDK's update-alternatives links its man pages into /usr/share/man/man1).
    /// Left out of the encoding when empty, so recipes without any keep their hash.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub setup_dirs: Vec<String>,
    /// Changes made by our code after mmdebstrap, in order.
    pub post_steps: Vec<PostStep>,
    /// Image data compression.
    pub compression: Compression,
}

impl Recipe {
    /// The `base` template: Debian bookworm minbase with Python, Node.js, git and the usual
    /// command-line tools, accounts `root` and `user` (uid 1000, passwordless sudo).
    ///
    /// The guest agent is deliberately not in here: the runtimes add it to every sandbox
    /// ([`crate::AGENT_PATH_IN_GUEST`]) so that rebuilding the agent never invalidates this
    /// image.
    pub fn base() -> Recipe {
        let packages = [
            // What sandboxes are for.
            "python3",
            // `python` as well as `python3`, as in E2B's base image (SDK docs and tests call it).
            "python-is-python3",
            "python3-pip",
            "python3-venv",
            "nodejs",
            "npm",
            "git",
            "curl",
            "ca-certificates",
            // Accounts, privilege and process/network inspection.
            "bash",
            "passwd",
            "sudo",
            "procps",
            "iproute2",
            // The runtime sets the hostname to the sandbox id without editing /etc/hosts;
            // nss-myhostname makes that name resolve anyway, so sudo does not print
            // "unable to resolve host" on every call. Its postinst adds it to nsswitch.conf.
            "libnss-myhostname",
        ];
        let dpkg_options = [
            // Documentation and translations are a fifth of the tree and no agent reads them.
            // Copyright files stay: they are the licence notices we redistribute with.
            "path-exclude=/usr/share/man/*",
            "path-exclude=/usr/share/info/*",
            "path-exclude=/usr/share/doc/*",
            "path-include=/usr/share/doc/*/copyright",
            "path-exclude=/usr/share/locale/*",
            "path-include=/usr/share/locale/locale.alias",
        ];
        Recipe {
            name: "base".to_owned(),
            suite: "bookworm".to_owned(),
            variant: "minbase".to_owned(),
            architecture: host_debian_arch().to_owned(),
            mirror: DEBIAN_MIRROR.to_owned(),
            components: vec!["main".to_owned()],
            packages: packages.iter().map(|p| (*p).to_owned()).collect(),
            // The archive is reached over a shared, sometimes flaky network; retrying is cheap.
            apt_options: vec!["Acquire::Retries \"3\"".to_owned()],
            dpkg_options: dpkg_options.iter().map(|o| (*o).to_owned()).collect(),
            setup_dirs: Vec::new(),
            post_steps: base_post_steps(),
            compression: Compression::Lz4hc,
        }
    }

    /// Full SHA-256 (hex) of the format version and the normalised recipe: the cache key.
    pub fn hash(&self) -> String {
        let mut normalised = self.clone();
        normalised.packages.sort();
        normalised.packages.dedup();
        // serde_json writes struct fields in declaration order and we use no maps, so the
        // encoding is canonical. Reordering fields in the struct changes every key, which is
        // harmless (one rebuild) and is what FORMAT_VERSION would force anyway.
        let encoded = match serde_json::to_vec(&normalised) {
            Ok(bytes) => bytes,
            // Serializing strings, integers and enums cannot fail; the fallback only keeps
            // this function infallible (a changed key costs one rebuild, never a wrong image).
            Err(e) => format!("unserializable recipe: {e}").into_bytes(),
        };
        let mut hasher = Sha256::new();
        // The salt predates the crate's name; changing it would rebuild every image on every host.
        hasher.update(format!("warren-image recipe format {FORMAT_VERSION}\n").as_bytes());
        hasher.update(&encoded);
        hex(&hasher.finalize())
    }

    /// `<name>-<first 12 hex digits of the hash>`: the cache directory name.
    pub fn cache_key(&self) -> String {
        let hash = self.hash();
        format!("{}-{}", self.name, &hash[..SHORT_HASH_LEN])
    }

    /// Checks the recipe before anything is run. Values end up as command-line arguments and
    /// paths, so anything that could be mistaken for an option, split a list or escape the
    /// image root is rejected here rather than half-way through a build.
    pub fn validate(&self) -> Result<()> {
        let bad = |what: String| Err(ImageError::InvalidRecipe(what));
        if !is_name(&self.name, |c| {
            c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_'
        }) || self.name.len() > 64
        {
            return bad(format!(
                "name {:?} must match [a-z0-9][a-z0-9_-]{{0,63}}",
                self.name
            ));
        }
        for (what, value) in [
            ("suite", &self.suite),
            ("variant", &self.variant),
            ("architecture", &self.architecture),
        ] {
            if !is_name(value, |c| {
                c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'
            }) {
                return bad(format!("{what} {value:?} must match [a-z0-9][a-z0-9-]*"));
            }
        }
        if !(self.mirror.starts_with("http://") || self.mirror.starts_with("https://"))
            || self
                .mirror
                .chars()
                .any(|c| c.is_whitespace() || c.is_control())
        {
            return bad(format!("mirror {:?} must be an http(s) URL", self.mirror));
        }
        if self.components.is_empty() {
            return bad("at least one archive component is needed".to_owned());
        }
        for component in &self.components {
            if !is_name(component, |c| {
                c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'
            }) {
                return bad(format!("component {component:?} is not a valid name"));
            }
        }
        for dir in &self.setup_dirs {
            // Run by a shell (the hook): plain path characters only, and an absolute path.
            if image_path(dir).is_err()
                || dir
                    .chars()
                    .any(|c| !(c.is_ascii_alphanumeric() || matches!(c, '/' | '.' | '_' | '-')))
            {
                return bad(format!("setup dir {dir:?} must be a plain absolute path"));
            }
        }
        for package in &self.packages {
            // Debian policy §5.6.1: lowercase letters, digits, '+', '-', '.'; starts alnum.
            if package.len() < 2
                || !is_name(package, |c| {
                    c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '+' | '-' | '.')
                })
            {
                return bad(format!(
                    "package {package:?} is not a valid Debian package name"
                ));
            }
        }
        for option in self.apt_options.iter().chain(&self.dpkg_options) {
            if option.is_empty() || option.starts_with('-') || option.contains(['\n', '\r', '\0']) {
                return bad(format!(
                    "apt/dpkg option {option:?} must be one non-empty line"
                ));
            }
        }
        for step in &self.post_steps {
            validate_step(step)?;
        }
        Ok(())
    }
}

fn validate_step(step: &PostStep) -> Result<()> {
    let bad = |what: String| Err(ImageError::InvalidRecipe(what));
    let account = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_';
    match step {
        PostStep::Group { name, .. } => {
            if !is_account_name(name, account) {
                return bad(format!("group name {name:?} is not a valid account name"));
            }
        }
        PostStep::User {
            name,
            home,
            shell,
            groups,
            ..
        } => {
            if !is_account_name(name, account) {
                return bad(format!("user name {name:?} is not a valid account name"));
            }
            for group in groups {
                if !is_account_name(group, account) {
                    return bad(format!("group name {group:?} is not a valid account name"));
                }
            }
            image_path(home)?;
            image_path(shell)?;
        }
        PostStep::WriteFile { path, mode, .. } => {
            image_path(path)?;
            if *mode > 0o7777 {
                return bad(format!("mode {mode:o} of {path} has bits outside 0o7777"));
            }
        }
        PostStep::ClearDir { path } => {
            if image_path(path)?.is_empty() {
                return bad("clear_dir of / would empty the whole image".to_owned());
            }
        }
    }
    Ok(())
}

/// Splits an absolute image path into its components, refusing anything that could resolve
/// outside the image root (`..`) or be ambiguous (`.`, empty components, NUL).
pub(crate) fn image_path(path: &str) -> Result<Vec<&str>> {
    let Some(rest) = path.strip_prefix('/') else {
        return Err(ImageError::InvalidRecipe(format!(
            "path {path:?} must be absolute"
        )));
    };
    if rest.is_empty() {
        return Ok(Vec::new());
    }
    let parts: Vec<&str> = rest.split('/').collect();
    if parts
        .iter()
        .any(|p| p.is_empty() || *p == "." || *p == ".." || p.contains('\0'))
    {
        return Err(ImageError::InvalidRecipe(format!(
            "path {path:?} must be normalised (no empty, '.' or '..' components)"
        )));
    }
    Ok(parts)
}

/// The post-steps of the `base` template.
fn base_post_steps() -> Vec<PostStep> {
    let file = |path: &str, contents: &str, mode: u32| PostStep::WriteFile {
        path: path.to_owned(),
        contents: contents.to_owned(),
        mode,
    };
    vec![
        // mmdebstrap's directory mode creates device nodes. Every runtime provides its own
        // minimal /dev (a tmpfs in `ns`, devtmpfs in `vm`); nodes baked into a shared image
        // would only be a way around that.
        PostStep::ClearDir {
            path: "/dev".to_owned(),
        },
        // mmdebstrap copies the build host's hostname and resolv.conf in; neither belongs in a
        // sandbox. The runtime sets the real hostname (the sandbox id) at start.
        file("/etc/hostname", "warren\n", 0o644),
        file(
            "/etc/hosts",
            "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n\
             ff02::1\tip6-allnodes\nff02::2\tip6-allrouters\n",
            0o644,
        ),
        // A regular file (not a symlink into /run) so the runtime can either bind-mount its own
        // file over it or write it in the sandbox's writable layer. No nameserver line: until
        // the runtime writes one, DNS fails plainly instead of reaching some default server.
        file(
            "/etc/resolv.conf",
            "# Written by the Warren runtime when a sandbox starts.\n",
            0o644,
        ),
        // C.UTF-8 is built into bookworm's libc, so no locales package is needed. These cover
        // PAM sessions (sudo, su) and login shells; the agent sets LANG for its own children.
        file("/etc/default/locale", "LANG=C.UTF-8\n", 0o644),
        file(
            "/etc/profile.d/10-warren-locale.sh",
            "# Locale-independent default; an explicit LANG from the caller wins.\n\
             : \"${LANG:=C.UTF-8}\"\nexport LANG\n",
            0o644,
        ),
        PostStep::Group {
            name: "user".to_owned(),
            gid: 1000,
        },
        PostStep::User {
            name: "user".to_owned(),
            uid: 1000,
            gid: 1000,
            home: USER_HOME.to_owned(),
            shell: "/bin/bash".to_owned(),
            groups: vec!["sudo".to_owned()],
        },
        // sudo ignores sudoers.d files that are group/world writable; 0440 is what visudo makes.
        file(
            "/etc/sudoers.d/90-warren-user",
            "# The sandbox account may do anything as root without a password.\n\
             user ALL=(ALL:ALL) NOPASSWD: ALL\n",
            0o440,
        ),
    ]
}

/// The Debian architecture name of the machine we run on (images are built natively).
pub fn host_debian_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "i386",
        "arm" => "armhf",
        "powerpc64" => "ppc64el",
        "s390x" => "s390x",
        "riscv64" => "riscv64",
        other => other,
    }
}

fn is_name(value: &str, allowed: impl Fn(char) -> bool) -> bool {
    let mut chars = value.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphanumeric()) && chars.all(allowed)
}

fn is_account_name(value: &str, allowed: impl Fn(char) -> bool) -> bool {
    // useradd's default NAME_REGEX: starts with a letter or underscore.
    let mut chars = value.chars();
    value.len() <= 32
        && matches!(chars.next(), Some(c) if c.is_ascii_lowercase() || c == '_')
        && chars.all(allowed)
}

/// Lowercase hex of a byte string.
pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        // Writing to a String cannot fail.
        let _ = write!(out, "{byte:02x}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_recipe_is_valid() {
        Recipe::base().validate().expect("base recipe validates");
    }

    #[test]
    fn image_paths_must_be_normalised() {
        assert!(image_path("/etc/hosts").is_ok());
        assert!(image_path("etc/hosts").is_err());
        assert!(image_path("/etc/../hosts").is_err());
        assert!(image_path("/etc//hosts").is_err());
        assert!(image_path("/etc/./hosts").is_err());
        assert_eq!(image_path("/").map(|p| p.len()).ok(), Some(0));
    }

    #[test]
    fn setup_dirs_are_plain_paths_and_absent_from_recipes_without_them() {
        let base = Recipe::base();
        let encoded = serde_json::to_string(&base).expect("encodes");
        assert!(
            !encoded.contains("setup_dirs"),
            "would change every existing hash"
        );
        let mut recipe = base.clone();
        recipe.setup_dirs.push("/usr/share/man/man1".to_owned());
        recipe.validate().expect("a plain path is fine");
        assert_ne!(recipe.hash(), base.hash());
        for bad in ["usr/share", "/x\"; rm -rf /", "/a/../b", "/$HOME"] {
            let mut recipe = Recipe::base();
            recipe.setup_dirs.push(bad.to_owned());
            assert!(recipe.validate().is_err(), "{bad}");
        }
    }

    #[test]
    fn option_like_values_are_rejected() {
        let mut recipe = Recipe::base();
        recipe.packages.push("--hook-dir=/x".to_owned());
        assert!(recipe.validate().is_err());

        let mut recipe = Recipe::base();
        recipe.packages.push("a,b".to_owned());
        assert!(recipe.validate().is_err());

        let mut recipe = Recipe::base();
        recipe.post_steps.push(PostStep::ClearDir {
            path: "/".to_owned(),
        });
        assert!(recipe.validate().is_err());
    }
}
