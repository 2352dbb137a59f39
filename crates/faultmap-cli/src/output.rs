//! Writing a command's report on stdout, as JSON or as text.

use std::io::{StdoutLock, Write};

use anyhow::{Context, Result};
use serde::Serialize;

/// Writes the report on stdout and flushes it: with `json`, what
/// `write_json` writes; otherwise `text()`.
pub fn print(
    json: bool,
    write_json: impl FnOnce(&mut StdoutLock<'static>) -> Result<()>,
    text: impl FnOnce() -> String,
) -> Result<()> {
    let mut out = std::io::stdout().lock();
    if json {
        write_json(&mut out)?;
    } else {
        out.write_all(text().as_bytes())?;
    }
    out.flush().context("writing the report")
}

/// `value` as one line of compact JSON.
pub fn json_line(out: &mut impl Write, value: &impl Serialize) -> Result<()> {
    serde_json::to_writer(&mut *out, value)?;
    writeln!(out)?;
    Ok(())
}
