//! The guest's modules as the pinned kernel declares them: the NFSv3 client that mounts
//! volumes is in the initramfs, every module after what it depends on.

use std::collections::HashSet;

use warren_runtime_vm::{initramfs, kernel};

#[test]
fn the_nfs_client_loads_after_its_dependencies() {
    let data = std::env::var_os("WARREN_DATA_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| "/var/lib/warren".into());
    // Unpacked by any earlier VM run, else fetched now from the host's Debian sources, as
    // the vm runtime does (tests of other crates need not have run a VM before this one).
    let k = match kernel::ensure(&data, &Default::default()) {
        Ok(k) => k,
        Err(e) => {
            warren_testkit::skip(format!("the guest kernel could not be fetched: {e}"));
            return;
        }
    };
    let order = initramfs::module_order(&k).unwrap_or_else(|e| panic!("{e}"));
    let names: Vec<&str> = order.iter().map(|(n, _)| n.as_str()).collect();
    let nfs = [
        "sunrpc", "netfs", "fscache", "grace", "lockd", "nfs", "nfs_acl", "nfsv3",
    ];
    let loaded: Vec<&str> = names.iter().copied().filter(|n| nfs.contains(n)).collect();
    assert_eq!(loaded, nfs, "{names:?}");
    // Every module's declared dependencies come before it.
    let mut seen = HashSet::new();
    for (name, path) in &order {
        let ko = std::fs::read(path).unwrap();
        let key = b"\0depends=";
        if let Some(i) = ko.windows(key.len()).position(|w| w == key) {
            let rest = &ko[i + key.len()..];
            let end = rest.iter().position(|b| *b == 0).unwrap();
            for dep in String::from_utf8_lossy(&rest[..end]).split(',') {
                assert!(dep.is_empty() || seen.contains(dep), "{name} before {dep}");
            }
        }
        seen.insert(name.clone());
    }
}
