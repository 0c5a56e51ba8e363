//! The `code-interpreter-full` template: `code-interpreter-v1` plus R and Java kernels, as in
//! E2B's full code-interpreter image. A separate template because the two add several hundred
//! MiB (R, a JDK) that most sandboxes never use.
//!
//! Both come from Debian's archive: R with Debian's IRkernel, Java as a JShell that
//! `runner_kernel.py` drives (`JavaRunner.java`, compiled in memory when a Java context
//! starts), since no Java Jupyter kernel is packaged.

use crate::interp::{kernel_spec, runner_kernel_spec};
use crate::recipe::{PostStep, Recipe};

/// Template name.
pub const CODE_INTERPRETER_FULL_TEMPLATE: &str = "code-interpreter-full";

/// Debian packages added to `code-interpreter-v1`.
const PACKAGES: &[&str] = &[
    // R and its Jupyter kernel.
    "r-base-core",
    "r-cran-irkernel",
    // Java: the JDK carries JShell, which the Java kernel drives.
    "openjdk-17-jdk-headless",
];

impl Recipe {
    /// `code-interpreter-v1` plus the R and Java kernels.
    pub fn code_interpreter_full() -> Recipe {
        let mut recipe = Recipe::code_interpreter();
        recipe.name = CODE_INTERPRETER_FULL_TEMPLATE.to_owned();
        recipe
            .packages
            .extend(PACKAGES.iter().map(|p| (*p).to_owned()));
        // The JRE's postinst links man pages there; the path excludes keep the directory out.
        recipe.setup_dirs.push("/usr/share/man/man1".to_owned());
        recipe.post_steps.push(PostStep::WriteFile {
            path: "/usr/local/share/jupyter/kernels/warren-r/kernel.json".to_owned(),
            contents: kernel_spec(
                "R",
                "r",
                &[
                    "/usr/bin/R",
                    "--no-echo",
                    "--no-save",
                    "--no-restore",
                    "-e",
                    "IRkernel::main()",
                    "--args",
                    "{connection_file}",
                ],
                &[],
            ),
            mode: 0o644,
        });
        recipe
            .post_steps
            .push(runner_kernel_spec("java", "Java (JShell)"));
        recipe
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_full_recipe_is_the_code_interpreter_plus_r_and_java() {
        let full = Recipe::code_interpreter_full();
        full.validate().expect("valid recipe");
        let base = Recipe::code_interpreter();
        assert_ne!(full.hash(), base.hash());
        assert!(full.cache_key().starts_with("code-interpreter-full-"));
        for p in &base.packages {
            assert!(full.packages.contains(p), "{p}");
        }
        let specs: Vec<&str> = full
            .post_steps
            .iter()
            .filter_map(|s| match s {
                PostStep::WriteFile { path, .. } if path.ends_with("kernel.json") => {
                    Some(path.as_str())
                }
                _ => None,
            })
            .collect();
        assert_eq!(full.setup_dirs, ["/usr/share/man/man1"]);
        for lang in ["python", "bash", "javascript", "typescript", "r", "java"] {
            let path = format!("/usr/local/share/jupyter/kernels/warren-{lang}/kernel.json");
            assert!(specs.contains(&path.as_str()), "{lang}: {specs:?}");
        }
    }
}
