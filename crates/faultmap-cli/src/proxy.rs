//! `faultmap proxy`: the benchmarks' counting proxy, as a process of its own.
//!
//! `faultmap bench --remote` puts a [`faultmap_proxy::Proxy`] in front of
//! each server, in-process, to add a cloud store's first-byte latency and to
//! count what every engine asked for. Engines that live in another process
//! (the Python benchmarks: faultmap's bindings, obstore, s3fs) need the
//! same proxy between them and the server; this command runs one:
//!
//! ```text
//!   client ──HTTP──▶ faultmap proxy (127.0.0.1:PORT) ──HTTP──▶ --upstream
//!                      sleeps --latency-ms before each response head,
//!                      counts requests and body bytes
//!
//!   stdout: http://127.0.0.1:PORT            (one line, as soon as it listens)
//!   stderr: faultmap proxy: requests=N body_bytes=N ranged_requests=N
//!           range_bytes=N upstream_errors=N (ended by ...)   (at exit)
//! ```
//!
//! # Lifetime
//!
//! 1. Resolve `--upstream` (`HOST:PORT`, or `http://HOST:PORT` as
//!    `AWS_ENDPOINT_URL` spells it) to one socket address, IPv4 first;
//!    anything else is an error naming the text, before anything starts.
//! 2. Block SIGINT and SIGTERM and open a `signalfd` for them, *before* the
//!    proxy's thread exists, so that the thread inherits the mask and a
//!    signal is always read here, never acted on by its default action.
//! 3. Start the proxy on a free port of 127.0.0.1, set its latency, print
//!    its URL on stdout and flush.
//! 4. Wait in `poll` on stdin and the signalfd until stdin reaches EOF (or
//!    is closed, or fails) or a signal comes. Stdin is the lease: a parent
//!    that runs the proxy with a pipe on its stdin ends it by closing the
//!    pipe, and ends it too by dying, however it dies. What arrives on
//!    stdin before EOF is read and thrown away.
//! 5. Take the counters, stop the proxy (closing its connections), print
//!    the counters as one line of `key=value` on stderr, exit 0.
//!
//! Known limits: the proxy forwards plain HTTP/1.1 only (no `https://`
//! upstream), and started with stdin at EOF (`< /dev/null`, or in the
//! background of a non-interactive shell, which gives it `/dev/null`) it
//! stops at once; give such a run a pipe or a FIFO on stdin.

use std::io::{self, Write};
use std::net::{SocketAddr, ToSocketAddrs};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use faultmap_proxy::{Proxy, Stats};

use crate::ProxyArgs;

/// Runs `faultmap proxy` (see the module documentation for the steps).
pub fn run(args: &ProxyArgs) -> Result<()> {
    // 1. The upstream, before anything starts.
    let upstream = upstream_addr(&args.upstream)?;
    // 2. The signals, before any thread starts.
    let signals =
        SignalFd::block(&[libc::SIGINT, libc::SIGTERM]).context("blocking SIGINT and SIGTERM")?;
    // 3. The proxy, announced.
    let proxy = Proxy::start(upstream)
        .with_context(|| format!("starting a proxy to {upstream} on 127.0.0.1"))?;
    proxy
        .faults()
        .set_latency(Duration::from_millis(args.latency_ms));
    let mut out = io::stdout().lock();
    writeln!(out, "{}", proxy.url())
        .and_then(|()| out.flush())
        .context("writing the proxy's URL to stdout")?;
    drop(out);
    // 4. Until stdin ends or a signal comes.
    let ended_by = wait_for_end(&signals)?;
    // 5. The counters.
    let stats = proxy.stats();
    proxy.stop();
    writeln!(
        io::stderr(),
        "faultmap proxy: {} (ended by {ended_by})",
        stats_line(&stats)
    )
    .context("writing the proxy's counters to stderr")?;
    Ok(())
}

/// `--upstream` as one socket address: `HOST:PORT` or `http://HOST:PORT`
/// (a trailing `/` allowed), the first IPv4 address the host resolves to,
/// else its first address.
fn upstream_addr(text: &str) -> Result<SocketAddr> {
    let what = || format!("--upstream {text:?}");
    if text.starts_with("https://") {
        bail!(
            "{}: the proxy forwards plain HTTP only; give http://HOST:PORT or HOST:PORT",
            what()
        );
    }
    let host_port = text.strip_prefix("http://").unwrap_or(text);
    let host_port = host_port.strip_suffix('/').unwrap_or(host_port);
    if host_port.is_empty() || host_port.contains('/') || host_port.contains("://") {
        bail!("{}: not HOST:PORT or http://HOST:PORT", what());
    }
    let addrs: Vec<SocketAddr> = host_port
        .to_socket_addrs()
        .with_context(|| format!("{}: not HOST:PORT, or the host does not resolve", what()))?
        .collect();
    let addr = addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or_else(|| addrs.first())
        .copied()
        .ok_or_else(|| anyhow!("{}: the host resolves to no address", what()))?;
    if addr.port() == 0 {
        bail!("{}: port 0 is no server's port", what());
    }
    Ok(addr)
}

/// The counters as `key=value` pairs, the names of [`Stats`]' fields.
fn stats_line(s: &Stats) -> String {
    format!(
        "requests={} body_bytes={} ranged_requests={} range_bytes={} upstream_errors={}",
        s.requests, s.body_bytes, s.ranged_requests, s.range_bytes, s.upstream_errors
    )
}

/// Waits until stdin reaches EOF (or is closed, or fails) or one of
/// `signals` arrives; returns which, for the exit line.
fn wait_for_end(signals: &SignalFd) -> Result<String> {
    let stdin = libc::STDIN_FILENO;
    let mut fds = [
        libc::pollfd {
            fd: stdin,
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: signals.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    let mut sink = [0u8; 4096];
    loop {
        // SAFETY: `fds` is a live array of two pollfds, its length passed
        // with it; poll writes only their `revents`.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
        if n < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err).context("poll on stdin and the signalfd");
        }
        if fds[1].revents & libc::POLLIN != 0 {
            return signals.read();
        }
        let got = fds[0].revents;
        if got & libc::POLLNVAL != 0 {
            return Ok("stdin closed".into());
        }
        if got & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0 {
            // SAFETY: `sink` is a live buffer of `sink.len()` bytes that
            // read may fill; fd 0 is open (poll did not say POLLNVAL).
            let r = unsafe { libc::read(stdin, sink.as_mut_ptr().cast(), sink.len()) };
            match r {
                0 => return Ok("stdin EOF".into()),
                r if r > 0 => continue,
                _ => {
                    let err = io::Error::last_os_error();
                    if matches!(
                        err.kind(),
                        io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock
                    ) {
                        continue;
                    }
                    return Ok(format!("stdin error ({err})"));
                }
            }
        }
    }
}

/// A `signalfd` for signals this thread (and every thread it starts after)
/// has blocked.
struct SignalFd {
    fd: OwnedFd,
}

impl SignalFd {
    /// Blocks `signals` in the calling thread and opens a signalfd for
    /// them. Threads started afterwards inherit the mask, so the signals
    /// stay pending until [`SignalFd::read`] takes them.
    fn block(signals: &[libc::c_int]) -> Result<SignalFd> {
        // SAFETY: an all-zero sigset_t is a valid value to hand to
        // sigemptyset, which initialises it.
        let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: `set` is a live sigset_t; sigemptyset and sigaddset only
        // write it (a bad signal number is EINVAL, checked).
        unsafe {
            libc::sigemptyset(&mut set);
            for &sig in signals {
                if libc::sigaddset(&mut set, sig) != 0 {
                    bail!("sigaddset({sig}): {}", io::Error::last_os_error());
                }
            }
        }
        // SAFETY: `set` is initialised; the old mask is not asked for.
        let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
        if rc != 0 {
            bail!("pthread_sigmask: {}", io::Error::from_raw_os_error(rc));
        }
        // SAFETY: -1 asks for a new descriptor; `set` is initialised.
        let fd = unsafe { libc::signalfd(-1, &set, libc::SFD_CLOEXEC) };
        if fd < 0 {
            bail!("signalfd: {}", io::Error::last_os_error());
        }
        // SAFETY: signalfd just returned this descriptor, owned by no one
        // else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(SignalFd { fd })
    }

    /// Reads one pending signal (poll said one is there) and names it.
    fn read(&self) -> Result<String> {
        // SAFETY: signalfd_siginfo is plain integers; all-zero is valid.
        let mut info: libc::signalfd_siginfo = unsafe { std::mem::zeroed() };
        let size = std::mem::size_of::<libc::signalfd_siginfo>();
        // SAFETY: `info` is a live signalfd_siginfo of `size` bytes, the
        // unit a signalfd reads in.
        let r = unsafe {
            libc::read(
                self.fd.as_raw_fd(),
                (&mut info as *mut libc::signalfd_siginfo).cast(),
                size,
            )
        };
        if r != size as isize {
            bail!("reading the signalfd: {}", io::Error::last_os_error());
        }
        Ok(match info.ssi_signo as libc::c_int {
            libc::SIGINT => "SIGINT".into(),
            libc::SIGTERM => "SIGTERM".into(),
            other => format!("signal {other}"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_takes_host_port_and_http_urls() {
        let want: SocketAddr = "127.0.0.1:7070".parse().unwrap();
        for text in [
            "127.0.0.1:7070",
            "http://127.0.0.1:7070",
            "http://127.0.0.1:7070/",
        ] {
            assert_eq!(upstream_addr(text).unwrap(), want, "{text}");
        }
        assert_eq!(upstream_addr("localhost:7070").unwrap().port(), 7070);
    }

    #[test]
    fn a_bad_upstream_is_an_error_naming_it() {
        for text in [
            "",
            "127.0.0.1",
            "127.0.0.1:0",
            "127.0.0.1:99999",
            "https://127.0.0.1:7070",
            "http://127.0.0.1:7070/bucket",
            "ftp://127.0.0.1:7070",
            "not an address",
        ] {
            let err = upstream_addr(text).unwrap_err();
            assert!(format!("{err:#}").contains("--upstream"), "{text}: {err:#}");
        }
    }
}
