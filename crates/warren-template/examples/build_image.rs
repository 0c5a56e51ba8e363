//! Builds (or reuses) the `base` template image and prints where it is.
//!
//! ```text
//! cargo run -p warren-template --example build_image -- [--verbose] [DATA_DIR]
//! ```
//!
//! DATA_DIR defaults to /var/lib/warren. Needs root, mmdebstrap and erofs-utils.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use warren_template::{ensure_image, Recipe, StderrProgress};

fn main() -> ExitCode {
    let mut verbose = false;
    let mut data_dir = PathBuf::from("/var/lib/warren");
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--verbose" | "-v" => verbose = true,
            _ => data_dir = PathBuf::from(arg),
        }
    }
    let mut progress = if verbose {
        StderrProgress::verbose()
    } else {
        StderrProgress::new()
    };
    let recipe = Recipe::base();
    let started = Instant::now();
    match ensure_image(&recipe, &data_dir, &mut progress) {
        Ok(image) => {
            println!(
                "{} {} ({} MiB, {} packages) in {:.1}s",
                if image.built { "built" } else { "cached" },
                image.image.display(),
                image.manifest.image_size >> 20,
                image.manifest.installed_packages.len(),
                started.elapsed().as_secs_f64()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
