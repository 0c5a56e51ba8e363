//! The dashboard's built assets (`dashboard/dist`) are embedded by `rust-embed` at compile time.
//! Rebuild when they change, and say so when they are missing: the binary then serves a page
//! under `/dashboard/` that names the command that builds them.

fn main() {
    let dist = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../dashboard/dist");
    println!("cargo:rerun-if-changed={}", dist.display());
    if !dist.join("index.html").is_file() {
        println!(
            "cargo:warning=the dashboard is not built ({} has no index.html): run `npm ci && npm run build` in dashboard/ (scripts/setup.sh does), then build again",
            dist.display()
        );
    }
}
