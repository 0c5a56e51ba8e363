//! `openapi/control.json` must be exactly what the code generates. To update it after an
//! intended API change: `WARREN_UPDATE_OPENAPI=1 cargo test -p warren-server --test openapi`.

use std::path::PathBuf;

#[test]
fn committed_document_matches_code() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../openapi/control.json");
    let generated = warren_server::openapi::document();
    if std::env::var_os("WARREN_UPDATE_OPENAPI").is_some() {
        std::fs::write(&path, &generated).expect("write openapi/control.json");
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "openapi/control.json is out of date; regenerate with \
         WARREN_UPDATE_OPENAPI=1 cargo test -p warren-server --test openapi"
    );
}
