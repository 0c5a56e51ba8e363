//! The `code-interpreter-v1` template: `base` plus Jupyter kernels (Python, bash, JavaScript,
//! TypeScript), the usual Python data stack and Warren's code-interpreter server (port 49999),
//! which the host starts after the agent.
//!
//! Everything comes from Debian's archive, so the image is as reproducible and as cached as
//! `base`. The server's Python source is compiled into this crate (`include_str!`) and written
//! into the image by post-steps: it is part of the recipe, so changing one line of it changes
//! the recipe hash and rebuilds the image instead of silently reusing a stale one.

use crate::recipe::{PostStep, Recipe};

/// Template name and the E2B code-interpreter SDK's default template alias.
pub const CODE_INTERPRETER_TEMPLATE: &str = "code-interpreter-v1";

/// Where the server's Python package lives inside the image.
pub const INTERP_LIB_DIR: &str = "/usr/local/lib/warren-interp";

/// Sandbox port the code-interpreter server listens on (fixed by the SDKs).
pub const INTERP_PORT: u16 = 49999;

/// Debian packages added to `base`: kernels, the analyst's stack, and what they pull in.
const PACKAGES: &[&str] = &[
    // The Jupyter messaging protocol: IPython kernel and the client library the server uses.
    "python3-ipykernel",
    "python3-jupyter-client",
    "python3-matplotlib-inline",
    // The bash kernel runs bash behind a pseudo-terminal.
    "python3-pexpect",
    // Data analysis.
    "python3-numpy",
    "python3-pandas",
    "python3-scipy",
    "python3-sklearn",
    "python3-matplotlib",
    "python3-seaborn",
    "python3-sympy",
    "python3-networkx",
    "python3-pil",
    "python3-openpyxl",
    "python3-xlrd",
    "python3-tabulate",
    "python3-yaml",
    // Fetching and parsing.
    "python3-requests",
    "python3-bs4",
    "python3-lxml",
    // Fonts for charts (matplotlib's default family).
    "fonts-dejavu-core",
    // The TypeScript kernel transpiles each cell with Debian's compiler (js_runner.js).
    "node-typescript",
];

/// The server package: (file name, contents). Listed one by one so every file is hashed.
const SERVER_FILES: &[(&str, &str)] = &[
    (
        "__init__.py",
        include_str!("../services/code-interpreter/warren_interp/__init__.py"),
    ),
    (
        "server.py",
        include_str!("../services/code-interpreter/warren_interp/server.py"),
    ),
    (
        "contexts.py",
        include_str!("../services/code-interpreter/warren_interp/contexts.py"),
    ),
    (
        "output.py",
        include_str!("../services/code-interpreter/warren_interp/output.py"),
    ),
    (
        "charts.py",
        include_str!("../services/code-interpreter/warren_interp/charts.py"),
    ),
    (
        "kernel_setup.py",
        include_str!("../services/code-interpreter/warren_interp/kernel_setup.py"),
    ),
    (
        "bash_kernel.py",
        include_str!("../services/code-interpreter/warren_interp/bash_kernel.py"),
    ),
    (
        "runner_kernel.py",
        include_str!("../services/code-interpreter/warren_interp/runner_kernel.py"),
    ),
    (
        "js_runner.js",
        include_str!("../services/code-interpreter/warren_interp/js_runner.js"),
    ),
    (
        "JavaRunner.java",
        include_str!("../services/code-interpreter/warren_interp/JavaRunner.java"),
    ),
    (
        "supervise.py",
        include_str!("../services/code-interpreter/warren_interp/supervise.py"),
    ),
];

impl Recipe {
    /// `base` plus IPython and bash kernels, numpy, pandas, matplotlib, scipy, scikit-learn,
    /// seaborn and friends, and the code-interpreter server. The host starts the server with
    /// [`code_interpreter_start_argv`] once the agent is up.
    pub fn code_interpreter() -> Recipe {
        let mut recipe = Recipe::base();
        recipe.name = CODE_INTERPRETER_TEMPLATE.to_owned();
        recipe
            .packages
            .extend(PACKAGES.iter().map(|p| (*p).to_owned()));
        let file = |path: String, contents: &str, mode: u32| PostStep::WriteFile {
            path,
            contents: contents.to_owned(),
            mode,
        };
        for (name, contents) in SERVER_FILES {
            recipe.post_steps.push(file(
                format!("{INTERP_LIB_DIR}/warren_interp/{name}"),
                contents,
                0o644,
            ));
        }
        // Kernel specs in the system-wide Jupyter data directory, where jupyter_client looks.
        // The Python kernel runs our setup file first (display formatters for charts and
        // DataFrames); the bash kernel is our own small kernel on ipykernel's base class.
        recipe.post_steps.push(file(
            "/usr/local/share/jupyter/kernels/warren-python/kernel.json".to_owned(),
            &kernel_spec(
                "Python 3",
                "python",
                &[
                    "/usr/bin/python3",
                    "-m",
                    "ipykernel_launcher",
                    "-f",
                    "{connection_file}",
                    &format!(
                        "--IPKernelApp.exec_files=['{INTERP_LIB_DIR}/warren_interp/kernel_setup.py']"
                    ),
                ],
                &[],
            ),
            0o644,
        ));
        recipe.post_steps.push(file(
            "/usr/local/share/jupyter/kernels/warren-bash/kernel.json".to_owned(),
            &kernel_spec(
                "Bash",
                "bash",
                &[
                    "/usr/bin/python3",
                    &format!("{INTERP_LIB_DIR}/warren_interp/bash_kernel.py"),
                    "-f",
                    "{connection_file}",
                ],
                &[],
            ),
            0o644,
        ));
        // JavaScript and TypeScript: one kernel program driving Node; TypeScript cells are
        // transpiled first.
        for (language, display_name) in [
            ("javascript", "JavaScript (Node.js)"),
            ("typescript", "TypeScript (Node.js)"),
        ] {
            recipe
                .post_steps
                .push(runner_kernel_spec(language, display_name));
        }
        recipe
    }
}

/// The kernel spec of a language that runner_kernel.py drives (JavaScript, TypeScript, Java).
pub(crate) fn runner_kernel_spec(language: &str, display_name: &str) -> PostStep {
    PostStep::WriteFile {
        path: format!("/usr/local/share/jupyter/kernels/warren-{language}/kernel.json"),
        contents: kernel_spec(
            display_name,
            language,
            &[
                "/usr/bin/python3",
                &format!("{INTERP_LIB_DIR}/warren_interp/runner_kernel.py"),
                "-f",
                "{connection_file}",
            ],
            &[("WARREN_RUNNER_LANGUAGE", language)],
        ),
        mode: 0o644,
    }
}

/// The command (argv) that starts the supervised code-interpreter server in a sandbox.
pub fn code_interpreter_start_argv() -> Vec<String> {
    vec![
        "/usr/bin/python3".to_owned(),
        format!("{INTERP_LIB_DIR}/warren_interp/supervise.py"),
    ]
}

pub(crate) fn kernel_spec(
    display_name: &str,
    language: &str,
    argv: &[&str],
    env: &[(&str, &str)],
) -> String {
    let env: serde_json::Map<String, serde_json::Value> = env
        .iter()
        .map(|(k, v)| ((*k).to_owned(), serde_json::Value::from(*v)))
        .collect();
    let spec = serde_json::json!({
        "argv": argv,
        "display_name": display_name,
        "language": language,
        "interrupt_mode": "signal",
        "env": env,
    });
    // A json! value always serialises.
    serde_json::to_string_pretty(&spec).unwrap_or_default() + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_interpreter_recipe_is_valid_and_distinct() {
        let recipe = Recipe::code_interpreter();
        recipe.validate().expect("valid recipe");
        assert_ne!(recipe.hash(), Recipe::base().hash());
        assert!(recipe.cache_key().starts_with("code-interpreter-v1-"));
    }

    #[test]
    fn server_source_is_part_of_the_hash() {
        let mut recipe = Recipe::code_interpreter();
        let before = recipe.hash();
        if let Some(PostStep::WriteFile { contents, .. }) = recipe
            .post_steps
            .iter_mut()
            .find(|s| matches!(s, PostStep::WriteFile { path, .. } if path.ends_with("server.py")))
        {
            contents.push('\n');
        }
        assert_ne!(recipe.hash(), before);
    }
}
