//! What `faultmap bench --remote` stands on: the project's servers
//! (`scripts/remote-servers`, which starts all four), the benchmark object
//! in each store asked for, a proxy in front of each of those, and the
//! FUSE peers (`scripts/fuse-peers`) mounted through the HTTP and S3
//! proxies. Everything it starts it stops when dropped, through the same
//! scripts (which stop their processes by PID).
//!
//! The object is written once, beside the servers' folders, and reaches
//! each store the cheapest way it can ([`Server`]): a hard link (a copy
//! across file systems) into the folder of nginx, versitygw and the GCS
//! stub, each of which serves a file there as an object at once; an
//! upload into Azurite (`scripts/remote-servers put`: Azurite keeps blobs
//! in its memory; about 25 s a GiB), only when `az` is asked for.

use std::collections::HashMap;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use faultmap_proxy::Proxy;

use super::engines::StoreKind;
use crate::bench::note;

/// Where `scripts/remote-servers` says a store is: the variables it
/// exports for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Server {
    /// The server's URL (`http://127.0.0.1:PORT`), which its proxy
    /// forwards to.
    pub url: &'static str,
    /// The bucket or container; `None` for HTTP.
    pub bucket: Option<&'static str>,
    /// The folder whose files the server serves as objects; `None` for
    /// Azurite (its blobs are uploaded).
    pub root: Option<&'static str>,
}

/// The variables of `kind`'s server.
pub fn server(kind: StoreKind) -> Server {
    let (url, bucket, root) = match kind {
        StoreKind::Http => ("FAULTMAP_HTTP_URL", None, Some("FAULTMAP_HTTP_ROOT")),
        StoreKind::S3 => (
            "AWS_ENDPOINT_URL",
            Some("FAULTMAP_S3_BUCKET"),
            Some("FAULTMAP_S3_ROOT"),
        ),
        StoreKind::Gs => (
            "FAULTMAP_GCS_ENDPOINT",
            Some("FAULTMAP_GS_BUCKET"),
            Some("FAULTMAP_GS_ROOT"),
        ),
        StoreKind::Az => (
            "AZURITE_BLOB_STORAGE_URL",
            Some("FAULTMAP_AZ_CONTAINER"),
            None,
        ),
    };
    Server { url, bucket, root }
}

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
    /// A proxy in front of each store asked for, in the order asked.
    pub proxies: Vec<(StoreKind, Proxy)>,
    /// The GCS stub's service-account file (`GOOGLE_SERVICE_ACCOUNT`),
    /// read: the GCS clients' credentials (`gcs_base_url`,
    /// `disable_oauth`). Empty unless `gs` was asked for.
    pub gcs_account: String,
    /// The FUSE peers that are up: engine name → the object's path.
    pub fuse: Vec<(&'static str, StoreKind, PathBuf)>,
    fuse_mounted: bool,
    /// Whether peers with disk caches may be mounted
    /// ([`Setup::mount_cached`]).
    fuse_cached: std::cell::Cell<bool>,
}

/// The FUSE peers: `scripts/fuse-peers`' variable of each, the engine's
/// name, its store, the script's name of it.
const FUSE_PEERS: [(&str, &str, StoreKind, &str); 3] = [
    ("FAULTMAP_S3FS_DIR", "s3fs", StoreKind::S3, "s3fs"),
    (
        "FAULTMAP_RCLONE_S3_DIR",
        "rclone",
        StoreKind::S3,
        "rclone-s3",
    ),
    (
        "FAULTMAP_RCLONE_HTTP_DIR",
        "rclone",
        StoreKind::Http,
        "rclone-http",
    ),
];

impl Setup {
    /// Starts the servers under `state`, writes a `len`-byte object into
    /// each of `stores`, starts a proxy in front of each, and mounts the
    /// FUSE peers unless `no_fuse`.
    pub fn start(state: &Path, len: u64, stores: &[StoreKind], no_fuse: bool) -> Result<Setup> {
        std::fs::create_dir_all(state)?;
        let state = state.canonicalize()?;
        // Each store once, in the order asked.
        let stores = &stores
            .iter()
            .enumerate()
            .filter(|&(i, k)| !stores[..i].contains(k))
            .map(|(_, &k)| k)
            .collect::<Vec<_>>();
        let base = [(
            "FAULTMAP_REMOTE_STATE".to_string(),
            state.join("servers").display().to_string(),
        )];
        note("starting the servers (scripts/remote-servers up)");
        let vars = run_script("remote-servers", "up", &base)?;
        let name = format!("bench-{len}");
        // A failed write leaves nothing behind: neither a partial object
        // (which could fill the disk) nor the servers.
        let placed = place_objects(&state, &vars, &name, len, stores, &base)
            .and_then(|()| gcs_account(&vars, stores));
        let gcs_account = match placed {
            Ok(account) => account,
            Err(e) => {
                remove_objects(&state, &vars, &name);
                let _ = run_script("remote-servers", "down", &base);
                return Err(e);
            }
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
        let mut proxies = Vec::new();
        for &kind in stores {
            let upstream = addr(&vars, server(kind).url)?;
            proxies.push((kind, Proxy::start(upstream)?));
        }
        let mut setup = Setup {
            state: state.clone(),
            vars,
            name,
            len,
            proxies,
            gcs_account,
            fuse: Vec::new(),
            fuse_mounted: false,
            fuse_cached: std::cell::Cell::new(false),
        };
        if !no_fuse && stores.iter().any(|k| k.has_fuse_peers()) {
            setup.mount()?;
        }
        Ok(setup)
    }

    /// The environment of `scripts/fuse-peers`: the servers' variables,
    /// with the proxies in place of the servers asked for (a peer of a
    /// store not asked for is mounted on its server, since the script
    /// mounts them all, and never used), and its state in `fuse_state`.
    fn fuse_env(&self, fuse_state: &str) -> Vec<(String, String)> {
        let mut env: Vec<(String, String)> = self.vars.clone().into_iter().collect();
        for (kind, proxy) in &self.proxies {
            let var = server(*kind).url;
            env.retain(|(k, _)| k != var);
            env.push((var.to_string(), proxy.url()));
        }
        env.push((
            "FAULTMAP_FUSE_STATE".into(),
            self.state.join(fuse_state).display().to_string(),
        ));
        env
    }

    /// The peers `scripts/fuse-peers mount` said are up, of the stores
    /// asked for: engine, store, the object's path.
    fn peers_up(&self, dirs: &HashMap<String, String>) -> Vec<(&'static str, StoreKind, PathBuf)> {
        FUSE_PEERS
            .iter()
            .filter(|(_, _, kind, _)| self.proxies.iter().any(|(k, _)| k == kind))
            .filter_map(|&(var, engine, kind, _)| {
                let dir = dirs.get(var)?;
                Some((engine, kind, PathBuf::from(dir).join(&self.name)))
            })
            .collect()
    }

    fn mount(&mut self) -> Result<()> {
        let env = self.fuse_env("fuse");
        note("mounting the FUSE peers (scripts/fuse-peers mount)");
        let dirs = match run_script("fuse-peers", "mount", &env) {
            Ok(dirs) => dirs,
            Err(e) => {
                note(&format!("the FUSE peers are skipped: {e:#}"));
                return Ok(());
            }
        };
        self.fuse_mounted = true;
        self.fuse = self.peers_up(&dirs);
        Ok(())
    }

    /// Mounts the FUSE peer `engine` of `kind` alone with its disk cache
    /// of file data in `cache` (`s3fs -o use_cache`, `rclone
    /// --vfs-cache-mode full`), or with `engine` `None` every peer of the
    /// stores asked for; returns those that came up (the script says why
    /// the others did not), each with the object's path through it.
    /// [`Setup::unmount_cached`] unmounts.
    pub fn mount_cached(
        &self,
        engine: Option<(&'static str, StoreKind)>,
        cache: &Path,
    ) -> Result<Vec<(&'static str, StoreKind, PathBuf)>> {
        let mut env = self.fuse_env("fuse-cached");
        env.push((
            "FAULTMAP_FUSE_CACHE_DIR".into(),
            cache.display().to_string(),
        ));
        if let Some((engine, kind)) = engine {
            let peer = FUSE_PEERS
                .iter()
                .find(|p| p.1 == engine && p.2 == kind)
                .map(|p| p.3)
                .with_context(|| format!("no FUSE peer {engine} of {}", kind.name()))?;
            env.push(("FAULTMAP_FUSE_PEERS".into(), peer.into()));
        }
        self.fuse_cached.set(true);
        let dirs = run_script("fuse-peers", "mount", &env)?;
        Ok(self.peers_up(&dirs))
    }

    /// Unmounts what [`Setup::mount_cached`] mounted (the peers' caches
    /// stay on disk).
    pub fn unmount_cached(&self) -> Result<()> {
        let env = self.fuse_env("fuse-cached");
        run_script("fuse-peers", "unmount", &env)?;
        self.fuse_cached.set(false);
        Ok(())
    }

    /// A folder of the benchmark's own, under its state.
    pub fn scratch(&self, name: &str) -> PathBuf {
        self.state.join(name)
    }

    /// The proxy in front of `kind`'s server, if `kind` was asked for.
    pub fn proxy(&self, kind: StoreKind) -> Option<&Proxy> {
        self.proxies
            .iter()
            .find(|(k, _)| *k == kind)
            .map(|(_, proxy)| proxy)
    }

    /// `kind`'s bucket or container (empty for HTTP).
    pub fn bucket(&self, kind: StoreKind) -> &str {
        server(kind)
            .bucket
            .and_then(|var| self.vars.get(var))
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
        if self.fuse_cached.get() {
            if let Err(e) = self.unmount_cached() {
                note(&format!("unmounting the FUSE peers with caches: {e:#}"));
            }
        }
        // Azurite's copy goes with Azurite (it is in its memory).
        remove_objects(&self.state, &self.vars, &self.name);
        let base = [(
            "FAULTMAP_REMOTE_STATE".to_string(),
            self.state.join("servers").display().to_string(),
        )];
        if let Err(e) = run_script("remote-servers", "down", &base) {
            note(&format!("stopping the servers: {e:#}"));
        }
    }
}

/// The URL `vars[var]` as a socket address (`http://127.0.0.1:PORT`).
fn addr(vars: &HashMap<String, String>, var: &str) -> Result<SocketAddr> {
    let url = vars
        .get(var)
        .with_context(|| format!("remote-servers gave no {var}"))?;
    url.trim_start_matches("http://")
        .trim_end_matches('/')
        .parse()
        .with_context(|| format!("{var}={url}"))
}

/// The GCS stub's service-account JSON, if `gs` is among `stores`
/// (empty otherwise).
fn gcs_account(vars: &HashMap<String, String>, stores: &[StoreKind]) -> Result<String> {
    if !stores.contains(&StoreKind::Gs) {
        return Ok(String::new());
    }
    let var = "GOOGLE_SERVICE_ACCOUNT";
    let path = vars
        .get(var)
        .with_context(|| format!("remote-servers gave no {var}"))?;
    std::fs::read_to_string(path).with_context(|| format!("reading {var}={path}"))
}

/// The object as written once: in the state folder, beside the servers'.
fn object_path(state: &Path, name: &str) -> PathBuf {
    state.join(name)
}

/// Writes the `len`-byte object `name` and puts it in each of `stores`:
/// linked (or copied) into the folder of a server that serves one,
/// uploaded with `scripts/remote-servers put` into one that does not.
/// Gives the object placed in versitygw's bucket folder the ETag an upload
/// would have: versitygw keeps it in the `user.etag` attribute, and
/// answers without one for a file it did not write, and a disk cache keys
/// by ETag (S3's always has one). 32 hex digits, new for every run.
fn give_s3_etag(path: &Path) -> Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let etag = format!(
        "{:016x}{:016x}",
        now.as_nanos() as u64,
        u64::from(std::process::id())
    );
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())?;
    // SAFETY: a NUL-terminated path, name and a value that live for the
    // call; setxattr only reads them.
    let rc = unsafe {
        libc::setxattr(
            c.as_ptr(),
            c"user.etag".as_ptr(),
            etag.as_ptr().cast(),
            etag.len(),
            0,
        )
    };
    if rc != 0 {
        bail!(
            "setting the ETag attribute of {}: {}",
            path.display(),
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

fn place_objects(
    state: &Path,
    vars: &HashMap<String, String>,
    name: &str,
    len: u64,
    stores: &[StoreKind],
    base: &[(String, String)],
) -> Result<()> {
    // A new file (a new inode): the links of an earlier run that was
    // killed keep their own bytes.
    let object = object_path(state, name);
    let _ = std::fs::remove_file(&object);
    write_object(&object, len)?;
    for &kind in stores {
        let server = server(kind);
        if let Some(var) = server.root {
            let root = vars
                .get(var)
                .with_context(|| format!("remote-servers gave no {var}"))?;
            let path = Path::new(root).join(name);
            let _ = std::fs::remove_file(&path);
            std::fs::hard_link(&object, &path)
                .or_else(|_| std::fs::copy(&object, &path).map(|_| ()))
                .with_context(|| format!("putting the object in {root}"))?;
            if kind == StoreKind::S3 {
                give_s3_etag(&path)?;
            }
            continue;
        }
        let var = server
            .bucket
            .context("a store without a folder has a bucket")?;
        let bucket = vars
            .get(var)
            .with_context(|| format!("remote-servers gave no {var}"))?;
        let url = format!("{}://{bucket}/{name}", kind.name());
        note(&format!(
            "uploading the object to {url} (scripts/remote-servers put)"
        ));
        let object = object.display().to_string();
        put(&url, &object, base)?;
    }
    Ok(())
}

/// `scripts/remote-servers put URL FILE`.
fn put(url: &str, file: &str, env: &[(String, String)]) -> Result<()> {
    let path = scripts().join("remote-servers");
    let status = Command::new(&path)
        .args(["put", url, file])
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdout(std::process::Stdio::null())
        .status()
        .with_context(|| format!("running {} put {url}", path.display()))?;
    if !status.success() {
        bail!("{} put {url} {file} failed ({status})", path.display());
    }
    Ok(())
}

/// Removes the object `name` from the state folder and from every
/// server's folder (whether or not it was put there).
fn remove_objects(state: &Path, vars: &HashMap<String, String>, name: &str) {
    let _ = std::fs::remove_file(object_path(state, name));
    let kinds = <StoreKind as clap::ValueEnum>::value_variants();
    for root in kinds.iter().filter_map(|&k| server(k).root) {
        if let Some(root) = vars.get(root) {
            let _ = std::fs::remove_file(Path::new(root).join(name));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_store_has_a_server_and_azurite_alone_takes_uploads() {
        for &kind in <StoreKind as clap::ValueEnum>::value_variants() {
            let s = server(kind);
            assert!(
                s.url.ends_with("_URL") || s.url.ends_with("_ENDPOINT"),
                "{s:?}"
            );
            assert_eq!(s.bucket.is_none(), kind == StoreKind::Http, "{s:?}");
            assert_eq!(s.root.is_none(), kind == StoreKind::Az, "{s:?}");
        }
    }

    #[test]
    fn a_server_url_is_an_address() {
        let vars = HashMap::from([("U".to_string(), "http://127.0.0.1:4443/".to_string())]);
        assert_eq!(addr(&vars, "U").unwrap().port(), 4443);
        assert!(addr(&vars, "V").is_err());
    }
}
