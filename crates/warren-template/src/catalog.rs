//! The templates this host knows by name: their recipes and the services they start in every
//! sandbox (the code interpreter's server, ready on port 49999).

use crate::Recipe;

/// Names of the templates this host can build.
pub const TEMPLATES: &[&str] = &["base", crate::CODE_INTERPRETER_TEMPLATE];

/// Known templates by name.
pub fn recipe(name: &str) -> Option<Recipe> {
    match name {
        "base" => Some(Recipe::base()),
        crate::CODE_INTERPRETER_TEMPLATE => Some(Recipe::code_interpreter()),
        _ => None,
    }
}

/// A long-running service a template starts in every sandbox, after the agent is initialised.
///
/// The host starts it through the agent (as the sandbox's default user, detached: it outlives
/// the request that started it) and the create waits until `ready_port` answers
/// `GET ready_path` with 200, so the first call after `Sandbox.create()` finds it ready.
/// Keeping it running is the service's own job (the code interpreter supervises itself).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartCommand {
    /// Program and arguments, run without a shell.
    pub argv: Vec<String>,
    /// Working directory inside the sandbox.
    pub cwd: String,
    /// Sandbox port whose HTTP `ready_path` answers 200 once the service is ready.
    pub ready_port: u16,
    /// Path of the readiness check.
    pub ready_path: String,
    /// How long the service may take to become ready before the create fails.
    pub ready_timeout: std::time::Duration,
}

/// The start command of template `name`, if it has one.
pub fn start_command(name: &str) -> Option<StartCommand> {
    match name {
        crate::CODE_INTERPRETER_TEMPLATE => Some(StartCommand {
            argv: crate::code_interpreter_start_argv(),
            cwd: crate::USER_HOME.to_owned(),
            ready_port: crate::INTERP_PORT,
            ready_path: "/health".to_owned(),
            // The server starts the default Python kernel before it opens its port: a few
            // seconds on an idle host, more on a busy one.
            ready_timeout: std::time::Duration::from_secs(90),
        }),
        _ => None,
    }
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
        assert_eq!(cmd.ready_port, 49999);
        assert!(cmd.argv[1].ends_with("supervise.py"));
    }
}
