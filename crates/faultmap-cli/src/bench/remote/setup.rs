//! What `faultmap bench --remote` stands on: the project's servers
//! (`scripts/remote-servers`), the benchmark object in both of them, a
//! proxy in front of each, and the FUSE peers (`scripts/fuse-peers`)
//! mounted through those proxies. Everything it starts it stops when
//! dropped, through the same scripts (which stop their processes by PID).

use std::collections::HashMap;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use faultmap_proxy::Proxy;

use crate::bench::note;

/// The scripts' folder in the source tree this binary was built from.
fn scripts() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts")
}

/// Runs `scripts/NAME ARG` with `env`, and returns the `export` lines it
/// printed as a map.
fn run_script(name: &str, arg: &str, env: &[(String, String)]) -> Result<HashMap<String, String>> {
    let path = scripts().join(name);
    if !path.exists() {
        bail!(
            "{} is missing: run faultmap bench --remote from its source tree",
            path.display()
        );
    }
    let out = Command::new(&path)
        .arg(arg)
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("running {} {arg}", path.display()))?;
    if !out.status.success() {
        bail!("{} {arg} failed ({})", path.display(), out.status);
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_prefix("export "))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| {
            (
                k.to_string(),
                v.trim_matches('\'').trim_matches('"').to_string(),
            )
        })
        .collect())
}

/// The running servers, the object, the proxies and the mounts.
pub struct Setup {
    state: PathBuf,
    pub vars: HashMap<String, String>,
    pub name: String,
    pub len: u64,
    pub http_proxy: Proxy,
    pub s3_proxy: Proxy,
    /// The FUSE peers that are up: engine name → the object's path.
    pub fuse: Vec<(
        &'static str,
        crate::bench::remote::engines::StoreKind,
        PathBuf,
    )>,
    fuse_mounted: bool,
}

impl Setup {
    /// Starts the servers under `state`, writes a `len`-byte object into
    /// both, starts the proxies, and mounts the FUSE peers unless `no_fuse`.
    pub fn start(state: &Path, len: u64, no_fuse: bool) -> Result<Setup> {
        std::fs::create_dir_all(state)?;
        let state = state.canonicalize()?;
        let base = [(
            "FAULTMAP_REMOTE_STATE".to_string(),
            state.join("servers").display().to_string(),
        )];
        note("starting the servers (scripts/remote-servers up)");
        let vars = run_script("remote-servers", "up", &base)?;
        let get = |k: &str| {
            vars.get(k)
                .cloned()
                .with_context(|| format!("remote-servers gave no {k}"))
        };
        let (http_root, s3_root) = (
            PathBuf::from(get("FAULTMAP_HTTP_ROOT")?),
            PathBuf::from(get("FAULTMAP_S3_ROOT")?),
        );
        let name = format!("bench-{len}");
        let down = || {
            let _ = run_script("remote-servers", "down", &base);
        };
        // A failed write leaves nothing behind: neither a partial object
        // (which could fill the disk) nor the servers.
        if let Err(e) = write_object(&http_root.join(&name), len) {
            let _ = std::fs::remove_file(http_root.join(&name));
            down();
            return Err(e);
        }
        let s3_path = s3_root.join(&name);
        let _ = std::fs::remove_file(&s3_path);
        std::fs::hard_link(http_root.join(&name), &s3_path)
            .or_else(|_| std::fs::copy(http_root.join(&name), &s3_path).map(|_| ()))?;
        let addr = |k: &str| -> Result<SocketAddr> {
            let url = get(k)?;
            url.trim_start_matches("http://")
                .trim_end_matches('/')
                .parse()
                .with_context(|| format!("{k}={url}"))
        };
        // The S3 client of every engine reads the AWS environment.
        for (k, v) in &vars {
            if k.starts_with("AWS_") {
                // SAFETY: this runs before the benchmark starts any thread
                // (proxies, pagers, runtimes), so no other thread reads the
                // environment meanwhile.
                unsafe { std::env::set_var(k, v) };
            }
        }
        let http_proxy = Proxy::start(addr("FAULTMAP_HTTP_URL")?)?;
        let s3_proxy = Proxy::start(addr("AWS_ENDPOINT_URL")?)?;
        let mut setup = Setup {
            state: state.clone(),
            vars,
            name,
            len,
            http_proxy,
            s3_proxy,
            fuse: Vec::new(),
            fuse_mounted: false,
        };
        if !no_fuse {
            setup.mount()?;
        }
        Ok(setup)
    }

    fn mount(&mut self) -> Result<()> {
        let mut env: Vec<(String, String)> = self.vars.clone().into_iter().collect();
        env.retain(|(k, _)| k != "FAULTMAP_HTTP_URL" && k != "AWS_ENDPOINT_URL");
        env.push(("FAULTMAP_HTTP_URL".into(), self.http_proxy.url()));
        env.push(("AWS_ENDPOINT_URL".into(), self.s3_proxy.url()));
        env.push((
            "FAULTMAP_FUSE_STATE".into(),
            self.state.join("fuse").display().to_string(),
        ));
        note("mounting the FUSE peers (scripts/fuse-peers mount)");
        let dirs = match run_script("fuse-peers", "mount", &env) {
            Ok(dirs) => dirs,
            Err(e) => {
                note(&format!("the FUSE peers are skipped: {e:#}"));
                return Ok(());
            }
        };
        self.fuse_mounted = true;
        use crate::bench::remote::engines::StoreKind;
        for (var, engine, kind) in [
            ("FAULTMAP_S3FS_DIR", "s3fs", StoreKind::S3),
            ("FAULTMAP_RCLONE_S3_DIR", "rclone", StoreKind::S3),
            ("FAULTMAP_RCLONE_HTTP_DIR", "rclone", StoreKind::Http),
        ] {
            if let Some(dir) = dirs.get(var) {
                self.fuse
                    .push((engine, kind, PathBuf::from(dir).join(&self.name)));
            }
        }
        Ok(())
    }

    /// The proxy in front of `kind`'s server.
    pub fn proxy(&self, kind: crate::bench::remote::engines::StoreKind) -> &Proxy {
        match kind {
            crate::bench::remote::engines::StoreKind::Http => &self.http_proxy,
            crate::bench::remote::engines::StoreKind::S3 => &self.s3_proxy,
        }
    }

    pub fn bucket(&self) -> &str {
        self.vars
            .get("FAULTMAP_S3_BUCKET")
            .map_or("", String::as_str)
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        // The object goes (the report says "removed after"); the FUSE
        // mounts first, which may hold it open.
        let env = [(
            "FAULTMAP_FUSE_STATE".to_string(),
            self.state.join("fuse").display().to_string(),
        )];
        if self.fuse_mounted {
            if let Err(e) = run_script("fuse-peers", "unmount", &env) {
                note(&format!("unmounting the FUSE peers: {e:#}"));
            }
        }
        for root in ["FAULTMAP_HTTP_ROOT", "FAULTMAP_S3_ROOT"] {
            if let Some(root) = self.vars.get(root) {
                let _ = std::fs::remove_file(Path::new(root).join(&self.name));
            }
        }
        let base = [(
            "FAULTMAP_REMOTE_STATE".to_string(),
            self.state.join("servers").display().to_string(),
        )];
        if let Err(e) = run_script("remote-servers", "down", &base) {
            note(&format!("stopping the servers: {e:#}"));
        }
    }
}

/// Writes `len` bytes of a fixed pseudo-random pattern to `path`.
fn write_object(path: &Path, len: u64) -> Result<()> {
    let parent = path.parent().unwrap_or(Path::new("."));
    let free = faultmap::sys::free_bytes(parent).unwrap_or(u64::MAX);
    // Room for the object and a margin of 1 GiB for everything else.
    if len.saturating_add(1 << 30) > free {
        anyhow::bail!(
            "the {} benchmark object does not fit in {}: {} free",
            crate::units::bytes(len),
            parent.display(),
            crate::units::bytes(free)
        );
    }
    note(&format!(
        "writing the {} benchmark object",
        crate::units::bytes(len)
    ));
    let mut out = std::io::BufWriter::with_capacity(8 << 20, std::fs::File::create(path)?);
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut block = vec![0u8; 1 << 20];
    let mut left = len;
    while left > 0 {
        for word in block.chunks_exact_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            word.copy_from_slice(&x.to_le_bytes());
        }
        let n = left.min(block.len() as u64) as usize;
        out.write_all(&block[..n])?;
        left -= n as u64;
    }
    out.flush()?;
    Ok(())
}
