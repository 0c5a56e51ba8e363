//! A key's templates, volumes and secrets: every operation scoped to what the key may see
//! (its team's; every team's for an admin key). Handlers have no other way to them.

use std::collections::BTreeMap;

use super::Tenant;
use crate::error::ControlError;
use crate::networks::{Member, NetworkView, PrivateNetwork};
use crate::secrets::{SecretInfo, SecretPage};
use crate::templates::builds::{BuildPage, BuildRequest, Registered, UploadLink};
use crate::templates::disk::DiskUse;
use crate::templates::tags::{Assigned, TagInfo};
use crate::templates::{Build, Template, TemplateName, DEFAULT_TAG};
use crate::volumes::{QuotaRequest, Volume, VolumeSnapshot, VolumeUsage};
use warren_buildspec::BuildSpec;

/// What a template alias names for a key: its id, and whether other teams may use it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AliasTarget {
    pub template_id: String,
    pub public: bool,
}

impl Tenant {
    // Templates.

    /// Registers a build of template `req.name` for this key's team.
    pub async fn register_build(&self, req: BuildRequest) -> Result<Registered, ControlError> {
        self.control
            .templates()
            .register_build(&self.team, req)
            .await
    }

    /// Whether a COPY's files are already here, and if not where to upload them.
    pub async fn upload_link(
        &self,
        template_id: &str,
        hash: &str,
    ) -> Result<UploadLink, ControlError> {
        self.control
            .templates()
            .upload_link(self.team_filter(), template_id, hash)
            .await
    }

    /// Triggers a registered build; it runs in the background.
    pub async fn start_build(
        &self,
        template_id: &str,
        build_id: &str,
        spec: BuildSpec,
    ) -> Result<(), ControlError> {
        self.control
            .templates()
            .start_build(self.team_filter(), template_id, build_id, spec)
            .await
    }

    /// A build's status and its log entries from `offset` on.
    pub async fn build_status(
        &self,
        template_id: &str,
        build_id: &str,
        offset: usize,
        limit: Option<usize>,
    ) -> Result<BuildPage, ControlError> {
        self.control
            .templates()
            .build_status(self.team_filter(), template_id, build_id, offset, limit)
            .await
    }

    /// The templates this key sees, each with its latest build.
    pub async fn templates(&self) -> Result<Vec<(Template, Option<Build>)>, ControlError> {
        let mut out = Vec::new();
        for t in self
            .control
            .templates()
            .list_templates(self.team_filter())
            .await?
        {
            let latest = self.control.templates().latest_build(&t).await?;
            out.push((t, latest));
        }
        Ok(out)
    }

    /// What an alias (`name[:tag]`, a catalog template's name, or `namespace/alias`) names:
    /// 404 when nothing does (or the tag is not the template's), 403 when it is another
    /// team's private template.
    pub async fn template_alias(&self, alias: &str) -> Result<AliasTarget, ControlError> {
        let name = alias.trim();
        if self
            .control
            .config()
            .template_names
            .iter()
            .any(|n| n == name)
        {
            return Ok(AliasTarget {
                template_id: name.to_string(),
                public: true,
            });
        }
        match self.control.templates().find_template(name, None).await? {
            Some(t) if self.team_filter().is_none_or(|team| team == t.team) || t.public => {
                let tag = TemplateName::parse(name)
                    .ok()
                    .and_then(|n| n.tag)
                    .unwrap_or_else(|| DEFAULT_TAG.to_string());
                if !t.tags.contains_key(&tag) && tag != DEFAULT_TAG {
                    return Err(ControlError::NotFound(format!(
                        "template '{name}' has no tag '{tag}'"
                    )));
                }
                Ok(AliasTarget {
                    template_id: t.id,
                    public: t.public,
                })
            }
            Some(_) => Err(ControlError::PermissionDenied(format!(
                "template '{name}' belongs to another team"
            ))),
            None => Err(ControlError::NotFound(format!(
                "template '{name}' not found"
            ))),
        }
    }

    /// Changes whether other teams may use a template of this key's.
    pub async fn set_template_public(
        &self,
        id_or_name: &str,
        public: bool,
    ) -> Result<Template, ControlError> {
        self.control
            .templates()
            .set_template_public(self.team_filter(), id_or_name, public)
            .await
    }

    /// Deletes the snapshot `id` names (E2B's SDKs delete snapshots through the templates
    /// route), else the template it names, with its images (refused while sandboxes or
    /// snapshots use them); 404 when this key sees neither.
    pub async fn delete_snapshot_or_template(&self, id: &str) -> Result<(), ControlError> {
        match self.delete_snapshot(id).await {
            Err(ControlError::NotFound(_)) => {}
            done => return done,
        }
        if self
            .control
            .templates()
            .delete_template(self.team_filter(), id, self.sandboxes())
            .await?
        {
            Ok(())
        } else {
            Err(ControlError::NotFound(format!("template '{id}' not found")))
        }
    }

    /// Points `tags` at the build `target` names.
    pub async fn assign_tags(
        &self,
        target: &str,
        tags: &[String],
    ) -> Result<Assigned, ControlError> {
        self.control
            .templates()
            .assign_tags(self.team_filter(), target, tags)
            .await
    }

    /// Removes `tags` from the template `name`.
    pub async fn remove_tags(&self, name: &str, tags: &[String]) -> Result<(), ControlError> {
        self.control
            .templates()
            .remove_tags(self.team_filter(), name, tags)
            .await
    }

    /// The tags of a template, oldest first.
    pub async fn template_tags(&self, id_or_name: &str) -> Result<Vec<TagInfo>, ControlError> {
        self.control
            .templates()
            .template_tags(self.team_filter(), id_or_name)
            .await
    }

    /// The data disk's use by this key's templates.
    pub async fn template_disk_use(&self) -> Result<DiskUse, ControlError> {
        self.control
            .templates()
            .template_disk_use(self.team_filter(), self.sandboxes())
            .await
    }

    /// Removes what no template of this key's needs any more; the disk's use after.
    pub async fn prune_templates(&self) -> Result<DiskUse, ControlError> {
        self.control
            .templates()
            .prune_templates(self.team_filter(), self.sandboxes())
            .await
    }

    // Volumes.

    /// Makes a volume for this key's team, empty or from one of its snapshots.
    pub async fn create_volume(
        &self,
        name: &str,
        quota: QuotaRequest,
        from_snapshot: Option<&str>,
    ) -> Result<Volume, ControlError> {
        self.control
            .volumes()
            .create(&self.team, name, quota, from_snapshot)
            .await
    }

    /// The volumes this key sees.
    pub async fn volumes(&self) -> Result<Vec<Volume>, ControlError> {
        self.control.volumes().list(self.team_filter()).await
    }

    /// A volume by id or name, with what it uses (`None` when the host cannot say).
    pub async fn volume(&self, r: &str) -> Result<(Volume, Option<VolumeUsage>), ControlError> {
        let v = self.control.volumes().get(self.team_filter(), r).await?;
        let usage = self.control.volumes().usage(&v).await.ok();
        Ok((v, usage))
    }

    /// Grows a volume to `bytes`, with what it uses after.
    pub async fn grow_volume(
        &self,
        r: &str,
        bytes: u64,
    ) -> Result<(Volume, Option<VolumeUsage>), ControlError> {
        let v = self
            .control
            .volumes()
            .grow(self.team_filter(), r, bytes)
            .await?;
        let usage = self.control.volumes().usage(&v).await.ok();
        Ok((v, usage))
    }

    /// Deletes a volume (refused while a sandbox mounts it).
    pub async fn delete_volume(&self, r: &str) -> Result<(), ControlError> {
        self.control
            .volumes()
            .delete(self.team_filter(), r, self.sandboxes())
            .await
    }

    /// Takes a snapshot of a volume.
    pub async fn snapshot_volume(&self, r: &str) -> Result<VolumeSnapshot, ControlError> {
        self.control.volumes().snapshot(self.team_filter(), r).await
    }

    /// The snapshots of volume `r`, oldest first.
    pub async fn volume_snapshots(&self, r: &str) -> Result<Vec<VolumeSnapshot>, ControlError> {
        let v = self.control.volumes().get(self.team_filter(), r).await?;
        self.control
            .volumes()
            .snapshots(self.team_filter(), Some(&v.id))
            .await
    }

    /// Deletes a volume snapshot.
    pub async fn delete_volume_snapshot(&self, id: &str) -> Result<(), ControlError> {
        self.control
            .volumes()
            .delete_snapshot(self.team_filter(), id)
            .await
    }

    // Secrets.

    /// Stores a new secret for this key's team.
    pub async fn create_secret(
        &self,
        name: &str,
        value: String,
        metadata: BTreeMap<String, String>,
    ) -> Result<SecretInfo, ControlError> {
        self.control
            .secrets()
            .create(&self.team, name, value, metadata)
            .await
    }

    /// A page of the secrets this key sees, oldest first.
    pub async fn secrets(
        &self,
        limit: Option<u32>,
        next_token: Option<&str>,
    ) -> Result<SecretPage, ControlError> {
        self.control
            .secrets()
            .list(self.team_filter(), limit, next_token)
            .await
    }

    /// A secret by id or name (never its value).
    pub async fn secret(&self, r: &str) -> Result<SecretInfo, ControlError> {
        self.control.secrets().get(self.team_filter(), r).await
    }

    /// Replaces a secret's value and, when given, its metadata.
    pub async fn update_secret(
        &self,
        r: &str,
        value: String,
        metadata: Option<BTreeMap<String, String>>,
    ) -> Result<SecretInfo, ControlError> {
        self.control
            .secrets()
            .update(self.team_filter(), r, value, metadata)
            .await
    }

    /// Deletes a secret.
    pub async fn delete_secret(&self, r: &str) -> Result<(), ControlError> {
        self.control.secrets().delete(self.team_filter(), r).await
    }
}

// Private networks.

impl Tenant {
    pub async fn create_network(
        &self,
        name: &str,
        ports: Vec<u16>,
    ) -> Result<PrivateNetwork, ControlError> {
        self.control()
            .networks()
            .create(self.team(), name, ports)
            .await
    }

    pub fn networks(&self) -> Vec<NetworkView> {
        self.control().networks().list(self.team_filter())
    }

    pub fn network(&self, r: &str) -> Result<NetworkView, ControlError> {
        self.control().networks().get(self.team_filter(), r)
    }

    pub async fn delete_network(&self, r: &str) -> Result<(), ControlError> {
        self.control()
            .networks()
            .delete(self.team_filter(), r)
            .await
    }

    pub async fn join_network(
        &self,
        r: &str,
        sandbox_id: &str,
        alias: Option<String>,
    ) -> Result<Member, ControlError> {
        self.control()
            .networks()
            .join(self.sandboxes(), self.team_filter(), r, sandbox_id, alias)
            .await
    }

    pub async fn leave_network(&self, r: &str, sandbox_id: &str) -> Result<(), ControlError> {
        self.control()
            .networks()
            .leave(self.sandboxes(), self.team_filter(), r, sandbox_id)
            .await
    }
}
