//! Template builds as the E2B SDKs drive them: register (`POST /v3/templates`), upload the
//! files of each COPY (a signed URL, since the upload carries no API key), trigger, and poll
//! the status with its log paged by offset.
//!
//! The control plane records and schedules; a [`TemplateBuilder`] does the work (runs the
//! steps in a build sandbox and makes the image). One build runs at a time per host: a build
//! keeps a whole sandbox busy, and these hosts have two cores. Logs of a running build live in
//! memory and are written to the store, with the outcome, when it ends; a server that dies
//! mid-build marks the build failed on its next start.

use std::collections::HashMap;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use chrono::Utc;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::port::{BuildFailure, BuildJob, BuildLog, BuilderError, TemplateBuilder};
use super::{ImageUsers, Templates};
use crate::error::ControlError;
use crate::locks::lock;
use crate::random::random_id;
use crate::templates::{
    build_tags, check_resources, Build, BuildReason, BuildStatus, LogEntry, LogLevel, TagRef,
    Template, TemplateName,
};
use warren_buildspec::{is_files_hash, BuildSource, BuildSpec, E2B_BASE_IMAGE};

/// Most log entries one status call returns (upstream's page size).
pub const MAX_LOG_PAGE: usize = 100;

/// How long an upload URL stays valid.
const UPLOAD_URL_TTL: Duration = Duration::from_secs(30 * 60);

/// The build side of the templates service's state.
pub(crate) struct BuildState {
    pub(crate) builder: Option<Arc<dyn TemplateBuilder>>,
    /// Logs of builds that are running now.
    active: StdMutex<HashMap<String, BuildLog>>,
    /// One build at a time (and no prune while one runs).
    pub(crate) gate: tokio::sync::Semaphore,
    /// Signs upload URLs; new at each start (an URL is good for one build's uploads).
    upload_key: [u8; 32],
}

impl BuildState {
    pub(crate) fn new(builder: Option<Arc<dyn TemplateBuilder>>) -> Result<Self, ControlError> {
        Ok(BuildState {
            builder,
            active: StdMutex::new(HashMap::new()),
            gate: tokio::sync::Semaphore::new(1),
            upload_key: crate::random::random_bytes::<32>()?,
        })
    }
}

/// What `POST /v3/templates` answers.
#[derive(Debug, Clone)]
pub struct Registered {
    pub template: Template,
    pub build_id: String,
    pub tags: Vec<String>,
}

/// What a request for a COPY's upload link answers.
#[derive(Debug, Clone)]
pub struct UploadLink {
    pub present: bool,
    /// Path and query of the signed upload URL (the caller makes it absolute).
    pub path_and_query: Option<String>,
}

/// A build's status page.
#[derive(Debug, Clone)]
pub struct BuildPage {
    pub build: Build,
    pub entries: Vec<LogEntry>,
    /// The failed step's entries at warn level or above.
    pub reason_entries: Vec<LogEntry>,
}

/// The resources a new build asks for.
#[derive(Debug, Clone, Default)]
pub struct BuildRequest {
    pub name: String,
    pub tags: Vec<String>,
    pub cpu_count: Option<u32>,
    pub memory_mb: Option<u32>,
    pub min_free_disk_mb: Option<u32>,
}

pub(crate) fn builder_error(e: BuilderError) -> ControlError {
    match e {
        BuilderError::Invalid(m) => ControlError::InvalidArgument(m),
        BuilderError::TooLarge(m) | BuilderError::NoSpace(m) => ControlError::QuotaExceeded(m),
        // A disk that filled up under the write (past the checks) is the same answer.
        BuilderError::Io { what, source } if source.kind() == std::io::ErrorKind::StorageFull => {
            ControlError::QuotaExceeded(format!("{what}: the host's disk is full ({source})"))
        }
        BuilderError::Io { what, source } => ControlError::Unavailable(format!("{what}: {source}")),
    }
}

fn template_not_found(r: &str) -> ControlError {
    ControlError::NotFound(format!("template '{r}' not found"))
}

fn sign(key: &[u8; 32], team: &str, template: &str, hash: &str, expires: i64) -> String {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes any key length");
    for part in [team, template, hash, &expires.to_string()] {
        mac.update(part.as_bytes());
        mac.update(&[0]);
    }
    mac.finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl Templates {
    pub(crate) fn template_builder(&self) -> Result<&Arc<dyn TemplateBuilder>, ControlError> {
        self.builds
            .builder
            .as_ref()
            .ok_or_else(|| ControlError::Unavailable("this server does not build templates".into()))
    }

    /// A template of `team` by id or name (`alias[:tag]` or `namespace/alias`).
    pub(crate) async fn find_template(
        &self,
        id_or_name: &str,
        team: Option<&str>,
    ) -> Result<Option<Template>, ControlError> {
        let store = &self.store;
        let raw = id_or_name.trim();
        let found = match store.get_template(raw).await? {
            Some(t) => Some(t),
            None => match TemplateName::parse(raw) {
                Ok(name) => store.template_by_alias(&name.alias).await?,
                Err(_) => None,
            },
        };
        Ok(found.filter(|t| team.is_none_or(|team| t.team == team || t.public)))
    }

    /// The runtime key of the image `templateID` names for `team` (a catalog template's own
    /// name, or the build a built template's tag points at), with the template if built here.
    pub(crate) async fn resolve_template(
        &self,
        requested: &str,
        team: Option<&str>,
    ) -> Result<(String, Option<Template>), ControlError> {
        let raw = requested.trim();
        if self.catalog.iter().any(|n| n == raw) {
            return Ok((raw.to_string(), None));
        }
        let Some(t) = self.find_template(raw, team).await? else {
            // Unknown to the store: the runtime decides (it knows its catalog).
            return Ok((raw.to_string(), None));
        };
        let tag = TemplateName::parse(raw)
            .ok()
            .and_then(|n| n.tag)
            .unwrap_or_else(|| crate::templates::DEFAULT_TAG.to_string());
        let Some(tag_ref) = t.tags.get(&tag) else {
            return Err(ControlError::NotFound(format!(
                "template '{raw}' has no ready build{}",
                if tag == crate::templates::DEFAULT_TAG {
                    String::new()
                } else {
                    format!(" tagged '{tag}'")
                }
            )));
        };
        let build = self
            .store
            .get_build(&tag_ref.build_id)
            .await?
            .ok_or_else(|| ControlError::internal(format!("tag {tag} names a missing build")))?;
        let image = build.image.ok_or_else(|| {
            ControlError::internal(format!("ready build {} has no image", build.id))
        })?;
        Ok((image, Some(t)))
    }

    /// Registers a build of template `req.name` for `team`: the same template again when the
    /// name is already the team's, a new one otherwise.
    pub(crate) async fn register_build(
        &self,
        team: &str,
        req: BuildRequest,
    ) -> Result<Registered, ControlError> {
        self.template_builder()?;
        let name = TemplateName::parse(&req.name)?;
        if let Some(ns) = &name.namespace {
            if ns != team {
                return Err(ControlError::InvalidArgument(format!(
                    "namespace '{ns}' is not your team's ('{team}')"
                )));
            }
        }
        if self.catalog.contains(&name.alias) {
            return Err(ControlError::InvalidArgument(format!(
                "'{}' is a built-in template's name",
                name.alias
            )));
        }
        let tags = build_tags(&name, &req.tags)?;
        let cfg = &self.limits;
        let cpu = req.cpu_count.unwrap_or(2);
        let memory = req.memory_mb.unwrap_or(1024);
        check_resources(
            cpu,
            memory,
            cfg.max_template_cpu,
            cfg.max_template_memory_mb,
        )?;
        let disk = cfg.disk_mb.max(
            req.min_free_disk_mb
                .unwrap_or(0)
                .saturating_add(cfg.disk_mb),
        );
        let resources = warren_types::Resources {
            cpu_count: cpu,
            memory_mb: memory,
            disk_mb: disk,
        };
        let now = Utc::now();
        let mut template = match self.store.template_by_alias(&name.alias).await? {
            Some(t) if t.team == team => t,
            Some(_) => {
                return Err(ControlError::FailedPrecondition(format!(
                    "the name '{}' belongs to another team",
                    name.alias
                )))
            }
            None => Template {
                id: random_id("", 20)?,
                team: team.to_string(),
                alias: Some(name.alias.clone()),
                public: false,
                resources,
                created_at: now,
                updated_at: now,
                build_count: 0,
                spawn_count: 0,
                last_spawned_at: None,
                tags: Default::default(),
            },
        };
        template.updated_at = now;
        template.resources = resources;
        let build = Build {
            id: uuid_v4()?,
            template_id: template.id.clone(),
            status: BuildStatus::Waiting,
            tags: tags.clone(),
            reason: None,
            image: None,
            resources,
            created_at: now,
            updated_at: now,
        };
        self.store.put_template(&template).await?;
        self.store.put_build(&build).await?;
        Ok(Registered {
            template,
            build_id: build.id,
            tags,
        })
    }

    /// Whether a COPY's files are already here, and if not where to upload them.
    pub(crate) async fn upload_link(
        &self,
        team: Option<&str>,
        template_id: &str,
        hash: &str,
    ) -> Result<UploadLink, ControlError> {
        if !is_files_hash(hash) {
            return Err(ControlError::InvalidArgument("Invalid files hash".into()));
        }
        let t = self
            .find_template(template_id, team)
            .await?
            .filter(|t| team.is_none_or(|team| t.team == team))
            .ok_or_else(|| template_not_found(template_id))?;
        let present = self
            .template_builder()?
            .has_files(&t.team, hash)
            .await
            .map_err(builder_error)?;
        let expires = (Utc::now() + UPLOAD_URL_TTL).timestamp();
        let token = sign(&self.builds.upload_key, &t.team, &t.id, hash, expires);
        Ok(UploadLink {
            present,
            path_and_query: Some(format!(
                "/templates/{}/files/{hash}/upload?team={}&expires={expires}&token={token}",
                t.id,
                percent_encoding::utf8_percent_encode(&t.team, percent_encoding::NON_ALPHANUMERIC)
            )),
        })
    }

    /// Accepts an upload made to a URL from [`Templates::upload_link`].
    pub(crate) async fn accept_upload(
        &self,
        template_id: &str,
        hash: &str,
        team: &str,
        expires: i64,
        token: &str,
        body: Box<dyn tokio::io::AsyncRead + Send + Unpin>,
    ) -> Result<(), ControlError> {
        let want = sign(&self.builds.upload_key, team, template_id, hash, expires);
        let valid: bool = subtle::ConstantTimeEq::ct_eq(want.as_bytes(), token.as_bytes()).into();
        if !valid || expires < Utc::now().timestamp() {
            return Err(ControlError::PermissionDenied(
                "the upload URL is invalid or expired".into(),
            ));
        }
        if !is_files_hash(hash) {
            return Err(ControlError::InvalidArgument("Invalid files hash".into()));
        }
        self.template_builder()?
            .put_files(team, hash, body)
            .await
            .map_err(builder_error)
    }

    /// Triggers a registered build; it runs in the background.
    pub(crate) async fn start_build(
        self: &Arc<Self>,
        team: Option<&str>,
        template_id: &str,
        build_id: &str,
        spec: BuildSpec,
    ) -> Result<(), ControlError> {
        let builder = self.template_builder()?.clone();
        let t = self
            .find_template(template_id, team)
            .await?
            .filter(|t| team.is_none_or(|team| t.team == team))
            .ok_or_else(|| template_not_found(template_id))?;
        let mut build = self
            .store
            .get_build(build_id)
            .await?
            .filter(|b| b.template_id == t.id)
            .ok_or_else(|| ControlError::NotFound(format!("build '{build_id}' not found")))?;
        if build.status != BuildStatus::Waiting {
            return Err(ControlError::InvalidArgument(format!(
                "build '{build_id}' is not in waiting state"
            )));
        }
        let all_steps = spec
            .stages
            .iter()
            .flat_map(|s| s.steps.iter())
            .chain(spec.steps.iter());
        for step in all_steps {
            if let warren_buildspec::StepKind::Copy { files_hash, .. }
            | warren_buildspec::StepKind::CopyGlob { files_hash, .. } = &step.kind
            {
                if !builder
                    .has_files(&t.team, files_hash)
                    .await
                    .map_err(builder_error)?
                {
                    return Err(ControlError::InvalidArgument(format!(
                        "the files of COPY {} (hash {files_hash}) were never uploaded",
                        step.kind.describe()
                    )));
                }
            }
        }
        build.status = BuildStatus::Building;
        build.updated_at = Utc::now();
        self.store.put_build(&build).await?;
        let log = BuildLog::default();
        for note in &spec.notes {
            log.info(None, note.clone());
        }
        lock(&self.builds.active).insert(build.id.clone(), log.clone());
        let me = self.clone();
        tokio::spawn(async move {
            me.run_build(builder, t, build, spec, log).await;
        });
        Ok(())
    }

    async fn run_build(
        &self,
        builder: Arc<dyn TemplateBuilder>,
        template: Template,
        mut build: Build,
        spec: BuildSpec,
        log: BuildLog,
    ) {
        let _turn = match self.builds.gate.try_acquire() {
            Ok(p) => p,
            Err(_) => {
                log.info(None, "Waiting for the builder (another build is running)");
                match self.builds.gate.acquire().await {
                    Ok(p) => p,
                    Err(_) => return,
                }
            }
        };
        let mut parents = Vec::new();
        for source in spec
            .stages
            .iter()
            .map(|s| &s.source)
            .chain(std::iter::once(&spec.source))
        {
            parents.push(self.parent_key(source, &template.team).await);
        }
        let parents: Result<Vec<_>, _> = parents.into_iter().collect();
        let outcome = match parents {
            Err(e) => Err(BuildFailure {
                step: Some("base".into()),
                message: e.to_string(),
            }),
            Ok(mut stage_parents) => {
                let parent = stage_parents.pop().flatten();
                let job = BuildJob {
                    build_id: build.id.clone(),
                    template_id: template.id.clone(),
                    team: template.team.clone(),
                    spec,
                    parent,
                    stage_parents,
                    resources: build.resources,
                };
                builder.build(job, log.clone()).await
            }
        };
        let now = Utc::now();
        match outcome {
            Ok(image) => {
                build.status = BuildStatus::Ready;
                build.image = Some(image.key);
            }
            Err(f) => {
                log.error(f.step.as_deref(), f.message.clone());
                build.status = BuildStatus::Error;
                build.reason = Some(BuildReason {
                    message: f.message,
                    step: f.step,
                });
            }
        }
        build.updated_at = now;
        if let Err(e) = self.finish_build(&template.id, &build, log.all()).await {
            tracing::error!(build_id = %build.id, error = %warren_runtime::chain(&e), "recording a finished build");
        }
        lock(&self.builds.active).remove(&build.id);
    }

    /// The runtime key a build (or a stage of one) starts from, when it is one this host has.
    async fn parent_key(
        &self,
        source: &BuildSource,
        team: &str,
    ) -> Result<Option<String>, ControlError> {
        match source {
            BuildSource::Template(name) => self
                .resolve_template(name, Some(team))
                .await
                .map(|(key, _)| Some(key)),
            BuildSource::Image { reference, .. } if reference == E2B_BASE_IMAGE => {
                Ok(Some("base".to_string()))
            }
            BuildSource::Image { .. } => Ok(None),
        }
    }

    async fn finish_build(
        &self,
        template_id: &str,
        build: &Build,
        entries: Vec<LogEntry>,
    ) -> Result<(), ControlError> {
        let store = &self.store;
        store.append_build_logs(&build.id, 0, &entries).await?;
        store.put_build(build).await?;
        if build.status == BuildStatus::Ready {
            // Re-read: tags may have moved while the build ran.
            let _guard = self.docs.lock().await;
            if let Some(mut t) = store.get_template(template_id).await? {
                for tag in &build.tags {
                    t.tags.insert(
                        tag.clone(),
                        TagRef {
                            build_id: build.id.clone(),
                            created_at: build.updated_at,
                        },
                    );
                }
                t.build_count += 1;
                t.updated_at = build.updated_at;
                store.put_template(&t).await?;
            }
        }
        Ok(())
    }

    /// A build's status and the log entries from `offset` on (at most [`MAX_LOG_PAGE`]).
    pub(crate) async fn build_status(
        &self,
        team: Option<&str>,
        template_id: &str,
        build_id: &str,
        offset: usize,
        limit: Option<usize>,
    ) -> Result<BuildPage, ControlError> {
        let t = self
            .find_template(template_id, team)
            .await?
            .ok_or_else(|| template_not_found(template_id))?;
        let build = self
            .store
            .get_build(build_id)
            .await?
            .filter(|b| b.template_id == t.id)
            .ok_or_else(|| ControlError::NotFound(format!("Build '{build_id}' not found")))?;
        let limit = limit.unwrap_or(MAX_LOG_PAGE).clamp(1, MAX_LOG_PAGE);
        let active = lock(&self.builds.active).get(build_id).cloned();
        let entries = match active {
            Some(log) => log.page(offset, limit),
            None => self.store.build_logs(build_id, offset, limit).await?,
        };
        let reason_entries = match &build.reason {
            Some(r) => self
                .store
                .build_logs(build_id, 0, usize::MAX)
                .await?
                .into_iter()
                .filter(|e| e.level >= LogLevel::Warn && e.step == r.step)
                .collect(),
            None => Vec::new(),
        };
        Ok(BuildPage {
            build,
            entries,
            reason_entries,
        })
    }

    /// Marks builds a previous run left unfinished as failed.
    pub(crate) async fn fail_interrupted_builds(&self) -> Result<(), ControlError> {
        for mut b in self.store.builds_in(BuildStatus::Building).await? {
            b.status = BuildStatus::Error;
            b.reason = Some(BuildReason {
                message: "the server stopped during the build; build again".into(),
                step: None,
            });
            b.updated_at = Utc::now();
            self.store.put_build(&b).await?;
        }
        Ok(())
    }

    /// Every template `team` may see (`None`: all).
    pub(crate) async fn list_templates(
        &self,
        team: Option<&str>,
    ) -> Result<Vec<Template>, ControlError> {
        let all = self.store.templates().await?;
        Ok(all
            .into_iter()
            .filter(|t| team.is_none_or(|team| t.team == team || t.public))
            .collect())
    }

    /// The newest build of a template (for listings).
    pub(crate) async fn latest_build(&self, t: &Template) -> Result<Option<Build>, ControlError> {
        let Some(tag) = t.tags.get(crate::templates::DEFAULT_TAG) else {
            return Ok(None);
        };
        Ok(self.store.get_build(&tag.build_id).await?)
    }

    /// Deletes a template of `team` and its images; refused while sandboxes use one of them.
    /// `Ok(false)` when there is no such template.
    pub(crate) async fn delete_template(
        &self,
        team: Option<&str>,
        id_or_name: &str,
        users: &dyn ImageUsers,
    ) -> Result<bool, ControlError> {
        let Some(t) = self
            .find_template(id_or_name, team)
            .await?
            .filter(|t| team.is_none_or(|team| t.team == team))
        else {
            return Ok(false);
        };
        let builds = self.store.builds_of(&t.id).await?;
        let images: Vec<String> = builds.iter().filter_map(|b| b.image.clone()).collect();
        let running = users.sandboxes_on(&images).await;
        if let Some(id) = running.first() {
            return Err(ControlError::FailedPrecondition(format!(
                "template '{id_or_name}' is used by {} sandbox(es) (e.g. {id}); kill them first",
                running.len()
            )));
        }
        if let Some(s) = users.snapshot_on(&images).await? {
            return Err(ControlError::FailedPrecondition(format!(
                "template '{id_or_name}' is the base of snapshot {s}; delete it first"
            )));
        }
        if builds.iter().any(|b| b.status == BuildStatus::Building) {
            return Err(ControlError::FailedPrecondition(format!(
                "template '{id_or_name}' is being built"
            )));
        }
        self.store.delete_template(&t.id).await?;
        for key in &images {
            self.runtime.forget_template(key).await;
        }
        if let Some(builder) = &self.builds.builder {
            for key in images {
                if let Err(e) = builder.remove_image(&key).await {
                    tracing::warn!(image = %key, error = %warren_runtime::chain(&e), "removing a deleted template's image");
                }
            }
        }
        Ok(true)
    }

    /// Changes whether other teams may use a template.
    pub(crate) async fn set_template_public(
        &self,
        team: Option<&str>,
        id_or_name: &str,
        public: bool,
    ) -> Result<Template, ControlError> {
        let _guard = self.docs.lock().await;
        let mut t = self
            .find_template(id_or_name, team)
            .await?
            .filter(|t| team.is_none_or(|team| t.team == team))
            .ok_or_else(|| template_not_found(id_or_name))?;
        t.public = public;
        t.updated_at = Utc::now();
        self.store.put_template(&t).await?;
        Ok(t)
    }
}

/// A random (version 4) UUID.
fn uuid_v4() -> Result<String, ControlError> {
    let mut b = crate::random::random_bytes::<16>()?;
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    Ok(format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upload_signatures_bind_every_part() {
        let key = [7u8; 32];
        let base = sign(&key, "t", "tpl", "h", 10);
        assert_eq!(base, sign(&key, "t", "tpl", "h", 10));
        for other in [
            sign(&key, "u", "tpl", "h", 10),
            sign(&key, "t", "tpm", "h", 10),
            sign(&key, "t", "tpl", "i", 10),
            sign(&key, "t", "tpl", "h", 11),
            sign(&[8u8; 32], "t", "tpl", "h", 10),
        ] {
            assert_ne!(base, other);
        }
    }

    #[test]
    fn uuids_have_the_v4_shape() {
        let u = uuid_v4().unwrap();
        assert_eq!(u.len(), 36);
        assert_eq!(&u[14..15], "4");
        assert!(matches!(&u[19..20], "8" | "9" | "a" | "b"));
    }
}
