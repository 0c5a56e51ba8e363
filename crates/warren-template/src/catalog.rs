//! The templates this host knows by name: their recipes and the services they start in every
//! sandbox (the code interpreter's server, ready on port 49999).

use std::collections::BTreeMap;
use std::path::Path;

use crate::Recipe;

/// Names of the templates this host can build.
pub const TEMPLATES: &[&str] = &[
    "base",
    crate::CODE_INTERPRETER_TEMPLATE,
    crate::CODE_INTERPRETER_FULL_TEMPLATE,
];

/// Known templates by name.
pub fn recipe(name: &str) -> Option<Recipe> {
    match name {
        "base" => Some(Recipe::base()),
        crate::CODE_INTERPRETER_TEMPLATE => Some(Recipe::code_interpreter()),
        crate::CODE_INTERPRETER_FULL_TEMPLATE => Some(Recipe::code_interpreter_full()),
        _ => None,
    }
}

/// A long-running service a template starts in every sandbox, after the agent is initialised.
///
/// The host starts it through the agent (detached: it outlives the request that started it)
/// and the create waits until its [`Ready`] check passes, so the first call after
/// `Sandbox.create()` finds it ready. Keeping it running is the service's own job (the code
/// interpreter supervises itself).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartCommand {
    /// Program and arguments, run without a shell.
    pub argv: Vec<String>,
    /// Working directory inside the sandbox (`None`: the user's home).
    pub cwd: Option<String>,
    /// The user it runs as (`None`: the sandbox's default user).
    pub user: Option<String>,
    /// Its environment on top of the sandbox's (a built template's build-time variables).
    pub env: BTreeMap<String, String>,
    /// When the service counts as ready.
    pub ready: Ready,
    /// How long the service may take to become ready before the create fails.
    pub ready_timeout: std::time::Duration,
}

/// How a create knows a template's service is ready.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ready {
    /// `GET http://<sandbox>:<port><path>` answers 200.
    Http {
        /// Sandbox port.
        port: u16,
        /// Path of the check.
        path: String,
    },
    /// This command (argv, run as the service's user) exits 0.
    Command(Vec<String>),
    /// As soon as it started (a built template with a start command and no ready command).
    Started,
}

/// How sandboxes of a template start: the default user and working directory the agent is
/// given, and the template's service, if it has one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    /// The user processes run as when a request names none.
    pub default_user: String,
    /// The working directory of processes when a request names none (`None`: the home).
    pub default_workdir: Option<String>,
    /// The template's service.
    pub start: Option<StartCommand>,
}

/// How long a built template's ready command may take (upstream's limit).
pub const BUILT_READY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

/// The start command of catalog template `name`, if it has one.
pub fn start_command(name: &str) -> Option<StartCommand> {
    match name {
        crate::CODE_INTERPRETER_TEMPLATE | crate::CODE_INTERPRETER_FULL_TEMPLATE => {
            Some(StartCommand {
                argv: crate::code_interpreter_start_argv(),
                cwd: Some(crate::USER_HOME.to_owned()),
                // Kernels run code as root, as E2B's do (its Jupyter is a root service); commands
                // and files keep the sandbox's default user.
                user: Some("root".to_owned()),
                env: BTreeMap::new(),
                ready: Ready::Http {
                    port: crate::INTERP_PORT,
                    path: "/health".to_owned(),
                },
                // The server starts the default Python kernel before it opens its port: a few
                // seconds on an idle host, more on a busy one.
                ready_timeout: std::time::Duration::from_secs(90),
            })
        }
        _ => None,
    }
}

/// How sandboxes of template `name` start: a catalog template, or one built under
/// `data_dir` (see [`crate::built_template`]).
pub fn launch(name: &str, data_dir: &Path) -> crate::Result<Launch> {
    let Some(built) = crate::built_template(data_dir, name)? else {
        return Ok(Launch {
            default_user: "user".into(),
            default_workdir: None,
            start: start_command(name),
        });
    };
    let c = built.config;
    let shell = |cmd: &str| {
        let mut argv = c.shell.clone();
        argv.push(cmd.to_string());
        argv
    };
    let start = c.start_cmd.as_deref().map(|cmd| StartCommand {
        argv: shell(cmd),
        cwd: c.workdir.clone(),
        user: Some(c.user.clone()),
        env: c.start_env.clone(),
        ready: match c.ready_cmd.as_deref() {
            Some(r) => Ready::Command(shell(r)),
            None => Ready::Started,
        },
        ready_timeout: BUILT_READY_TIMEOUT,
    });
    Ok(Launch {
        default_user: c.user.clone(),
        default_workdir: c.workdir.clone(),
        start,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_known_template_has_a_recipe() {
        for name in TEMPLATES {
            let recipe = recipe(name).expect("recipe");
            assert_eq!(recipe.name, *name);
            recipe.validate().expect("valid recipe");
        }
        assert!(recipe("nope").is_none());
    }

    #[test]
    fn only_the_code_interpreter_has_a_start_command() {
        assert!(start_command("base").is_none());
        let cmd = start_command(crate::CODE_INTERPRETER_TEMPLATE).expect("start command");
        assert!(matches!(cmd.ready, Ready::Http { port: 49999, .. }));
        assert!(cmd.argv[1].ends_with("supervise.py"));
    }
}
