//! The image config blob (OCI `application/vnd.oci.image.config.v1+json` or Docker's
//! `application/vnd.docker.container.image.v1+json`, which agree on the fields read here).

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::{ImageConfig, PullError};

/// Config media types that describe a container image; anything else is an artifact.
pub(crate) const CONFIG_TYPES: &[&str] = &[
    "application/vnd.oci.image.config.v1+json",
    "application/vnd.docker.container.image.v1+json",
];

#[derive(Deserialize)]
struct File {
    #[serde(default)]
    architecture: Option<String>,
    #[serde(default)]
    os: Option<String>,
    #[serde(default)]
    config: Option<Exec>,
    #[serde(default)]
    rootfs: Option<RootFs>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Exec {
    #[serde(default)]
    env: Option<Vec<String>>,
    #[serde(default)]
    working_dir: Option<String>,
    #[serde(default)]
    user: Option<String>,
    #[serde(default)]
    entrypoint: Option<Vec<String>>,
    #[serde(default)]
    cmd: Option<Vec<String>>,
    #[serde(default)]
    exposed_ports: Option<BTreeMap<String, serde_json::Value>>,
}

#[derive(Deserialize)]
struct RootFs {
    #[serde(default)]
    diff_ids: Vec<String>,
}

/// Parses a config blob; `layers` is the manifest's layer count, which the config's
/// `rootfs.diff_ids` must match when it lists them.
pub(crate) fn parse(bytes: &[u8], layers: usize) -> Result<ImageConfig, PullError> {
    let file: File = serde_json::from_slice(bytes)
        .map_err(|e| PullError::bad(format!("the image config is not valid JSON: {e}")))?;
    if let Some(os) = file.os.as_deref().filter(|os| *os != "linux") {
        return Err(PullError::Unsupported {
            detail: format!("the image is for {os}, not linux"),
        });
    }
    if let Some(arch) = file
        .architecture
        .as_deref()
        .filter(|a| !matches!(*a, "amd64" | "x86_64" | ""))
    {
        return Err(PullError::Unsupported {
            detail: format!("the image is for {arch}, not amd64"),
        });
    }
    if let Some(rootfs) = &file.rootfs {
        if !rootfs.diff_ids.is_empty() && rootfs.diff_ids.len() != layers {
            return Err(PullError::bad(format!(
                "the config lists {} layers and the manifest {layers}",
                rootfs.diff_ids.len()
            )));
        }
    }
    let Some(exec) = file.config else {
        return Ok(ImageConfig::default());
    };
    let env = exec
        .env
        .unwrap_or_default()
        .into_iter()
        .map(|kv| match kv.split_once('=') {
            Some((k, v)) => (k.to_string(), v.to_string()),
            None => (kv, String::new()),
        })
        .collect();
    Ok(ImageConfig {
        env,
        working_dir: exec.working_dir.filter(|w| !w.is_empty()),
        user: exec.user.filter(|u| !u.is_empty()),
        entrypoint: exec.entrypoint.unwrap_or_default(),
        cmd: exec.cmd.unwrap_or_default(),
        exposed_ports: exec.exposed_ports.unwrap_or_default().into_keys().collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_exec_defaults() {
        let json = br#"{"architecture":"amd64","os":"linux","config":{
            "Env":["PATH=/usr/bin:/bin","EMPTY=","ODD"],"WorkingDir":"/srv","User":"1000:1000",
            "Entrypoint":["/bin/sh","-c"],"Cmd":["echo hi"],"ExposedPorts":{"80/tcp":{},"53/udp":{}}},
            "rootfs":{"type":"layers","diff_ids":["sha256:aa"]}}"#;
        let c = parse(json, 1).unwrap();
        assert_eq!(
            c.env,
            vec![
                ("PATH".into(), "/usr/bin:/bin".into()),
                ("EMPTY".into(), String::new()),
                ("ODD".into(), String::new())
            ]
        );
        assert_eq!(c.working_dir.as_deref(), Some("/srv"));
        assert_eq!(c.user.as_deref(), Some("1000:1000"));
        assert_eq!(c.entrypoint, ["/bin/sh", "-c"]);
        assert_eq!(c.cmd, ["echo hi"]);
        assert_eq!(c.exposed_ports, ["53/udp", "80/tcp"]);
    }

    #[test]
    fn refuses_other_platforms_and_mismatched_layers() {
        let arm = br#"{"architecture":"arm64","os":"linux"}"#;
        assert!(matches!(parse(arm, 0), Err(PullError::Unsupported { .. })));
        let win = br#"{"architecture":"amd64","os":"windows"}"#;
        assert!(matches!(parse(win, 0), Err(PullError::Unsupported { .. })));
        let two = br#"{"os":"linux","rootfs":{"diff_ids":["a","b"]}}"#;
        assert!(matches!(parse(two, 1), Err(PullError::BadImage { .. })));
        assert_eq!(parse(b"{}", 3).unwrap(), ImageConfig::default());
    }
}
