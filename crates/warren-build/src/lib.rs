//! Template builds: the E2B builder's steps run one by one in a build sandbox (any runtime),
//! each step's result cached by content, and the outcome packed into an erofs image that every
//! sandbox of the template then shares read-only.
//!
//! ```text
//! parent template --create--> build sandbox --base phase, steps 1..N--> export rootfs
//!        ^                       |  after each step: a filesystem snapshot = the step's layer
//!        |                       v
//!   layer cache  <data>/build-cache/<layer key>.json  (snapshot key + context after the step)
//!                                                  --> <data>/images/b<key>/ (rootfs.erofs, template.json)
//! ```
//!
//! A step's layer key is the hash of the previous key, the step (type, arguments, files
//! hash); the first key is the parent template's. A build reuses the longest cached prefix of
//! its steps (the log says `CACHED`), so an unchanged step is never run again; `force` on the
//! build, or on a step, rebuilds from there. A build whose every step and start command are
//! unchanged reuses the finished image outright.

#![forbid(unsafe_code)]

mod base;
mod export;
mod files;
mod glob;
mod prune;
mod room;
mod sandbox;
mod stage_files;
mod steps;

use std::path::PathBuf;
use std::sync::Arc;

use sha2::{Digest, Sha256};
use warren_control::{
    BuildFailure, BuildJob, BuildLog, BuilderError, BuiltImage, CopyOrigin, StepKind,
    TemplateBuilder,
};
use warren_runtime::{CreateSpec, SandboxRuntime};

pub use files::FileStore;

use sandbox::BuildBox;
use steps::{Context, Runner};

/// Salt of every layer key: bump it when what a step does changes.
const LAYER_FORMAT: &str = "warren-build layer v1";

/// How builds are run on this host.
#[derive(Debug, Clone)]
pub struct BuilderConfig {
    pub data_dir: PathBuf,
    /// Largest COPY upload accepted (compressed and unpacked).
    pub max_upload_bytes: u64,
    /// How `fromImage` pulls reach registries (mirrors, plain-http registries, extra CAs);
    /// its cache directory is `<data>/oci` when left empty.
    pub pull: Option<warren_oci::PullOptions>,
    /// Bytes of the data disk uploads and builds leave free (the server's reserve): an upload
    /// that would eat into it is refused, a build stops between steps.
    pub min_free_bytes: u64,
    /// Longest a whole build may take (all its stages and steps): past it the build sandbox is
    /// killed and the build fails saying so, so no build holds the builder for ever.
    pub build_timeout: std::time::Duration,
}

/// Runs template builds through a runtime.
pub struct Builder {
    runtime: Arc<dyn SandboxRuntime>,
    config: BuilderConfig,
    files: FileStore,
    reserve: room::Reserve,
    http: reqwest::Client,
    /// Pulls `fromImage` images, or why this server cannot.
    puller: Result<Arc<warren_oci::Puller>, String>,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The key of the layer after `step` on top of `previous`.
fn layer_key(previous: &str, step: &StepKind) -> String {
    let mut h = Sha256::new();
    h.update(LAYER_FORMAT.as_bytes());
    h.update([0]);
    h.update(previous.as_bytes());
    h.update([0]);
    // The step's canonical form: its debug rendering names the type and every argument,
    // each quoted, so no two different steps collide.
    h.update(format!("{step:?}").as_bytes());
    hex(&h.finalize())
}

fn parent_key(parent: &str) -> String {
    hex(&Sha256::digest(
        format!("{LAYER_FORMAT}\0parent\0{parent}").as_bytes(),
    ))
}

/// The finished image's key: the last layer plus what sandboxes of it start with.
fn image_key(last_layer: &str, start: Option<&str>, ready: Option<&str>) -> String {
    let digest = Sha256::digest(
        format!(
            "{LAYER_FORMAT}\0image\0{last_layer}\0{}\0{}",
            start.unwrap_or(""),
            ready.unwrap_or("")
        )
        .as_bytes(),
    );
    format!("b{}", &hex(&digest)[..24])
}

/// `steps` with each `COPY --from` naming the image its stage was built into.
fn with_stage_images(
    steps: &[warren_control::Step],
    images: &[String],
) -> Result<Vec<warren_control::Step>, BuildFailure> {
    steps
        .iter()
        .map(|s| {
            let mut s = s.clone();
            if let StepKind::CopyFrom { from, .. } = &mut s.kind {
                if let CopyOrigin::Stage(i) = *from {
                    let key = images.get(i).ok_or_else(|| {
                        failure(
                            "base",
                            format!("COPY --from reads stage {i}, which is not built before it"),
                        )
                    })?;
                    *from = CopyOrigin::Image(key.clone());
                }
            }
            Ok(s)
        })
        .collect()
}

/// The runtime snapshot key that holds a layer.
fn snapshot_key(layer: &str) -> String {
    format!("{}{}", warren_control::BUILD_LAYER_PREFIX, &layer[..30])
}

/// A cached layer: the snapshot of the build sandbox after the step, and the context then.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct CachedLayer {
    snapshot: String,
    context: Context,
}

fn failure(step: impl Into<String>, message: impl Into<String>) -> BuildFailure {
    BuildFailure {
        step: Some(step.into()),
        message: message.into(),
    }
}

/// `n` random hex digits (ids and tokens of build sandboxes), from the OS's generator.
pub(crate) fn random_hex(n: usize) -> String {
    let mut out = String::new();
    while out.len() < n {
        out.push_str(&uuid::Uuid::new_v4().simple().to_string());
    }
    out.truncate(n);
    out
}

impl Builder {
    pub fn new(runtime: Arc<dyn SandboxRuntime>, config: BuilderConfig) -> Builder {
        let pull = config
            .pull
            .clone()
            .unwrap_or_else(|| warren_oci::PullOptions::new(config.data_dir.join("oci")));
        Builder {
            puller: warren_oci::Puller::new(pull)
                .map(Arc::new)
                .map_err(|e| e.to_string()),
            files: FileStore::new(&config.data_dir, config.max_upload_bytes)
                .with_reserve(config.min_free_bytes),
            reserve: room::Reserve::new(config.data_dir.clone(), config.min_free_bytes),
            runtime,
            config,
            http: reqwest::Client::builder()
                .no_proxy()
                .build()
                .unwrap_or_default(),
        }
    }

    fn cache_dir(&self) -> PathBuf {
        self.config.data_dir.join("build-cache")
    }

    fn cached_layer(&self, key: &str, snapshots: &[String]) -> Option<CachedLayer> {
        let text = std::fs::read_to_string(self.cache_dir().join(format!("{key}.json"))).ok()?;
        let layer: CachedLayer = serde_json::from_str(&text).ok()?;
        snapshots.contains(&layer.snapshot).then_some(layer)
    }

    fn save_layer(&self, key: &str, layer: &CachedLayer) -> std::io::Result<()> {
        let dir = self.cache_dir();
        std::fs::create_dir_all(&dir)?;
        let tmp = dir.join(format!(".{key}.json.tmp"));
        let text = serde_json::to_vec(layer).map_err(std::io::Error::other)?;
        std::fs::write(&tmp, text)?;
        std::fs::File::open(&tmp)?.sync_all()?;
        std::fs::rename(&tmp, dir.join(format!("{key}.json")))
    }

    async fn start_box(
        &self,
        job: &BuildJob,
        parent: &str,
        from_snapshot: Option<String>,
    ) -> Result<BuildBox, String> {
        let id = format!("bld{}", random_hex(20));
        let token = random_hex(40);
        let spec = CreateSpec {
            volumes: Vec::new(),
            id: id.parse().map_err(|e| format!("{e}"))?,
            template: parent.to_string(),
            resources: job.resources,
            allow_internet_access: true,
            egress: Default::default(),
            env_vars: Default::default(),
            access_token: Some(token.clone()),
            from_snapshot,
            reservation: None,
        };
        let sb = self.runtime.create(spec).await.map_err(|e| {
            format!(
                "the build sandbox did not start: {}",
                warren_runtime::chain(&e)
            )
        })?;
        Ok(BuildBox::new(id, sb.agent, token, self.http.clone()))
    }

    async fn kill_box(&self, b: &BuildBox) {
        if let Err(e) = self.runtime.kill(&b.id).await {
            tracing::warn!(sandbox_id = %b.id, error = %e, "killing a build sandbox");
        }
    }

    /// Runs the steps after the cached prefix and returns the context at the end.
    async fn run_steps(
        &self,
        job: &BuildJob,
        b: &BuildBox,
        log: &BuildLog,
        keys: &[String],
        from: usize,
        mut ctx: Context,
    ) -> Result<Context, BuildFailure> {
        let runner = Runner {
            sandbox: b,
            files: &self.files,
            data_dir: &self.config.data_dir,
            team: &job.team,
            log,
        };
        let total = job.spec.steps.len();
        // Steps before `from` came from the cache (logged CACHED by the caller).
        for (i, step) in job.spec.steps.iter().enumerate().skip(from) {
            let n = (i + 1).to_string();
            // Every step writes a layer to the data disk: none starts in the reserve.
            self.reserve
                .check("the next build step", 0)
                .map_err(|m| failure(&n, m))?;
            let label = format!("[builder {}/{total}]", i + 1);
            log.info(
                Some(&n),
                format!(
                    "{label} {} {} [{}]",
                    step.kind.name(),
                    step.kind.describe(),
                    &keys[i + 1][..12]
                ),
            );
            runner
                .step(&step.kind, &mut ctx, &label, &n)
                .await
                .map_err(|m| match step.line {
                    // A Dockerfile build: the line the step came from.
                    Some(line) => failure(&n, format!("Dockerfile line {line}: {m}")),
                    None => failure(&n, m),
                })?;
            let snapshot = snapshot_key(&keys[i + 1]);
            let saved = self.runtime.snapshot(&b.id, &snapshot, false).await;
            match saved {
                Ok(_) => {
                    let layer = CachedLayer {
                        snapshot,
                        context: ctx.clone(),
                    };
                    if let Err(e) = self.save_layer(&keys[i + 1], &layer) {
                        tracing::warn!(error = %e, "saving a build layer to the cache");
                    }
                }
                // The cache is an optimisation: a build goes on without it.
                Err(e) => tracing::warn!(error = %e, "snapshotting a build layer"),
            }
        }
        Ok(ctx)
    }

    /// Packs the build sandbox's filesystem into the image `key`.
    async fn export(
        &self,
        b: &BuildBox,
        key: &str,
        parent: &str,
        ctx: &Context,
        job: &BuildJob,
    ) -> Result<(), String> {
        let images = warren_template::images_dir(&self.config.data_dir);
        let staging = images.join(format!(".build-{key}-{}", random_hex(8)));
        tokio::fs::create_dir_all(&staging)
            .await
            .map_err(|e| format!("create {}: {e}", staging.display()))?;
        let image = staging.join(warren_template::IMAGE_FILE);
        let result = async {
            // The runtime reads the sandbox's layers from the host when it can (ns); else the
            // guest streams its files out through the agent (vm).
            match self.runtime.export_rootfs(&b.id, &image).await {
                Ok(()) => {}
                Err(warren_runtime::RuntimeError::Unsupported(_)) => {
                    export::through_agent(b, &image).await?
                }
                Err(e) => return Err(warren_runtime::chain(&e)),
            }
            let config = warren_template::BuiltConfig {
                user: ctx.user.clone(),
                workdir: ctx.workdir.clone(),
                start_cmd: job.spec.start_cmd.clone(),
                ready_cmd: job.spec.ready_cmd.clone(),
                start_env: ctx.env.clone(),
                shell: ctx.shell.clone(),
                parent: parent.to_string(),
            };
            let (data, key, staging2) = (
                self.config.data_dir.clone(),
                key.to_string(),
                staging.clone(),
            );
            tokio::task::spawn_blocking(move || {
                warren_template::commit_built(&data, &key, &staging2, &config)
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            })
            .await
            .map_err(|e| e.to_string())?
        }
        .await;
        if result.is_err() {
            let _ = tokio::fs::remove_dir_all(&staging).await;
        }
        result
    }

    /// Starts a sandbox of the new template, which runs its start command and waits for its
    /// ready command, as every create will.
    async fn check_start(&self, job: &BuildJob, key: &str, log: &BuildLog) -> Result<(), String> {
        log.info(
            Some("finalize"),
            format!(
                "Starting the start command and waiting for the ready command ({})",
                job.spec
                    .ready_cmd
                    .as_deref()
                    .unwrap_or("none: ready once started")
            ),
        );
        let b = self.start_box(job, key, None).await?;
        self.kill_box(&b).await;
        Ok(())
    }

    async fn build_now(&self, job: &BuildJob, log: &BuildLog) -> Result<BuiltImage, BuildFailure> {
        self.reserve
            .check("a template build", 0)
            .map_err(|m| failure("base", m))?;
        let deadline = tokio::time::Instant::now() + self.config.build_timeout;
        if job.spec.stages.is_empty() {
            return self.build_image(job, log, deadline).await;
        }
        let job = self.build_stages(job, log, deadline).await?;
        self.build_image(&job, log, deadline).await
    }

    /// Multi-stage builds: each stage a later one copies from is built first, through the
    /// same steps, cache and images as any build, into an image no template names; the
    /// returned job's `COPY --from` steps then name those images (so their cache keys change
    /// with the stages' content) and it has no stages left.
    async fn build_stages(
        &self,
        job: &BuildJob,
        log: &BuildLog,
        deadline: tokio::time::Instant,
    ) -> Result<BuildJob, BuildFailure> {
        let mut images: Vec<String> = Vec::new();
        let total = job.spec.stages.len();
        for (i, stage) in job.spec.stages.iter().enumerate() {
            log.info(
                Some("base"),
                format!("[stage {}/{total}] building stage '{}'", i + 1, stage.name),
            );
            let mut sub = job.clone();
            sub.spec = warren_control::BuildSpec {
                source: stage.source.clone(),
                steps: with_stage_images(&stage.steps, &images)?,
                force: job.spec.force,
                start_cmd: None,
                ready_cmd: None,
                stages: Vec::new(),
                notes: Vec::new(),
            };
            sub.parent = job.stage_parents.get(i).cloned().flatten();
            sub.stage_parents = Vec::new();
            let image = self
                .build_image(&sub, log, deadline)
                .await
                .map_err(|f| BuildFailure {
                    step: f.step,
                    message: format!("stage '{}': {}", stage.name, f.message),
                })?;
            log.info(
                Some("base"),
                format!(
                    "[stage {}/{total}] stage '{}' is image {}",
                    i + 1,
                    stage.name,
                    image.key
                ),
            );
            images.push(image.key);
        }
        let mut out = job.clone();
        out.spec.steps = with_stage_images(&job.spec.steps, &images)?;
        out.spec.stages = Vec::new();
        out.stage_parents = Vec::new();
        Ok(out)
    }

    async fn build_image(
        &self,
        job: &BuildJob,
        log: &BuildLog,
        deadline: tokio::time::Instant,
    ) -> Result<BuiltImage, BuildFailure> {
        // A registry image is pulled and packed into an image of its own first; its config
        // gives the build its defaults.
        let (parent, defaults) = match (&job.parent, &job.spec.source) {
            (Some(p), _) => (p.clone(), None),
            (
                None,
                warren_control::BuildSource::Image {
                    reference,
                    registry,
                },
            ) => {
                let (key, d) = self.pulled_base(reference, registry.as_ref(), log).await?;
                (key, Some(d))
            }
            (None, warren_control::BuildSource::Template(t)) => {
                return Err(failure("base", format!("template '{t}' not found")))
            }
        };
        let mut spec = job.spec.clone();
        if spec.start_cmd.is_none() {
            if let Some(cmd) = defaults.as_ref().and_then(|d| d.start_cmd.clone()) {
                log.info(
                    Some("base"),
                    format!("Start command from the image's ENTRYPOINT/CMD: {cmd}"),
                );
                spec.start_cmd = Some(cmd);
            }
        }
        let job = &BuildJob {
            spec,
            ..job.clone()
        };
        let spec = &job.spec;
        let mut keys = vec![parent_key(&parent)];
        for s in &spec.steps {
            let next = layer_key(keys.last().map(String::as_str).unwrap_or(""), &s.kind);
            keys.push(next);
        }
        let key = image_key(
            keys.last().map(String::as_str).unwrap_or(""),
            spec.start_cmd.as_deref(),
            spec.ready_cmd.as_deref(),
        );
        // Steps up to the first forced one may come from the cache.
        let usable = if spec.force {
            0
        } else {
            spec.steps
                .iter()
                .position(|s| s.force)
                .unwrap_or(spec.steps.len())
        };
        let total = spec.steps.len();
        log.info(Some("base"), format!("[base] FROM template {parent}"));
        let finished = usable == total
            && warren_template::built_template(&self.config.data_dir, &key)
                .ok()
                .flatten()
                .is_some();
        let snapshots = self.runtime.snapshot_keys().await;
        let cached_from = (1..=usable)
            .rev()
            .find_map(|i| self.cached_layer(&keys[i], &snapshots).map(|l| (i, l)));
        let done = if finished {
            total
        } else {
            cached_from.as_ref().map_or(0, |c| c.0)
        };
        for (i, s) in spec.steps.iter().enumerate().take(done) {
            log.info(
                Some(&(i + 1).to_string()),
                format!(
                    "CACHED [builder {}/{total}] {} {} [{}]",
                    i + 1,
                    s.kind.name(),
                    s.kind.describe(),
                    &keys[i + 1][..12]
                ),
            );
        }
        if finished {
            log.info(Some("finalize"), format!("CACHED template image {key}"));
            return Ok(BuiltImage { key });
        }
        let (from, snapshot, ctx) = match cached_from {
            Some((i, layer)) => (i, Some(layer.snapshot), Some(layer.context)),
            None => (0, None, None),
        };
        let b = self
            .start_box(job, &parent, snapshot)
            .await
            .map_err(|m| failure(if from == 0 { "base" } else { "1" }, m))?;
        let work = async {
            let ctx = match ctx {
                Some(c) => c,
                None => Runner {
                    sandbox: &b,
                    files: &self.files,
                    data_dir: &self.config.data_dir,
                    team: &job.team,
                    log,
                }
                .base_phase()
                .await
                .map(|mut c| {
                    if let Some(d) = &defaults {
                        c.env.extend(d.env.clone());
                        c.workdir = d.workdir.clone();
                    }
                    c
                })
                .map_err(|m| failure("base", m))?,
            };
            let ctx = self.run_steps(job, &b, log, &keys, from, ctx).await?;
            log.info(Some("finalize"), "Packing the template image");
            self.export(&b, &key, &parent, &ctx, job)
                .await
                .map_err(|m| failure("finalize", m))?;
            Ok::<_, BuildFailure>(())
        };
        // The build sandbox is killed whatever ended the work, the deadline included.
        let outcome = match tokio::time::timeout_at(deadline, work).await {
            Ok(outcome) => outcome,
            Err(_) => Err(BuildFailure {
                step: None,
                message: format!(
                    "the build ran past its deadline of {} s and was stopped (the server's \
                     --build-timeout-secs)",
                    self.config.build_timeout.as_secs()
                ),
            }),
        };
        self.kill_box(&b).await;
        outcome?;
        if spec.start_cmd.is_some() {
            if let Err(m) = self.check_start(job, &key, log).await {
                let _ = warren_template::remove_built(&self.config.data_dir, &key);
                return Err(failure("finalize", format!("start command failed: {m}")));
            }
        }
        log.info(Some("finalize"), format!("Template image {key} is ready"));
        Ok(BuiltImage { key })
    }
}

#[async_trait::async_trait]
impl TemplateBuilder for Builder {
    async fn has_files(&self, team: &str, hash: &str) -> Result<bool, BuilderError> {
        Ok(self.files.has(team, hash))
    }

    async fn put_files(
        &self,
        team: &str,
        hash: &str,
        body: Box<dyn tokio::io::AsyncRead + Send + Unpin>,
    ) -> Result<(), BuilderError> {
        self.files.put(team, hash, body).await
    }

    async fn build(&self, job: BuildJob, log: BuildLog) -> Result<BuiltImage, BuildFailure> {
        let started = std::time::Instant::now();
        let out = self.build_now(&job, &log).await;
        let secs = started.elapsed().as_secs_f64();
        match &out {
            Ok(img) => {
                tracing::info!(build_id = %job.build_id, image = %img.key, secs, "template built")
            }
            Err(f) => {
                tracing::warn!(build_id = %job.build_id, step = ?f.step, secs, "template build failed")
            }
        }
        out
    }

    async fn disk_use(&self, keep: &[String]) -> Result<warren_control::DiskUse, BuilderError> {
        self.disk_use_now(keep).await
    }

    async fn prune(&self, keep: &[String]) -> Result<warren_control::DiskUse, BuilderError> {
        self.prune_now(keep).await
    }

    async fn remove_image(&self, key: &str) -> Result<(), BuilderError> {
        let data = self.config.data_dir.clone();
        let key = key.to_string();
        tokio::task::spawn_blocking(move || warren_template::remove_built(&data, &key))
            .await
            .map_err(|e| BuilderError::Io {
                what: "remove an image".into(),
                source: std::io::Error::other(e.to_string()),
            })?
            .map_err(|e| BuilderError::Io {
                what: "remove a template image".into(),
                source: std::io::Error::other(e.to_string()),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_keys_chain_and_change_with_every_part() {
        let p = parent_key("base");
        let run = |c: &str| StepKind::Run {
            command: c.into(),
            user: None,
        };
        let a = layer_key(&p, &run("echo a"));
        assert_eq!(a, layer_key(&p, &run("echo a")));
        assert_ne!(a, layer_key(&p, &run("echo b")));
        assert_ne!(a, layer_key(&parent_key("other"), &run("echo a")));
        assert_ne!(
            a,
            layer_key(
                &p,
                &StepKind::Run {
                    command: "echo a".into(),
                    user: Some("root".into())
                }
            )
        );
        let img = image_key(&a, None, None);
        assert!(warren_template::is_built_key(&img), "{img}");
        assert_ne!(img, image_key(&a, Some("x"), None));
        assert!(snapshot_key(&a).len() <= 32);
    }
}
