//! The Python package's checks: the wheel built with maturin (manylinux, abi3), then
//! installed into a fresh venv under `target/python/` with the suite's pinned
//! requirements, and the pytest suite and the doctests run against the installed wheel
//! (never the source tree), so what is tested is what `pip install` gives a user.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use crate::{RELEASE_DIR, RELEASE_RUSTFLAGS, cargo};

/// The most the installed extension may weigh: a user's wheel carries no debug info.
const EXTENSION_BYTES_MAX: u64 = 15 * 1024 * 1024;

/// Builds the release wheel a user installs in the release test target dir (its
/// dependencies are already built there), installs it into a new venv, checks the
/// installed extension's size, and runs the suite. The note is pytest's summary line
/// and the extension's size.
pub(crate) fn run(root: &Path) -> Result<String, String> {
    let target_dir = RELEASE_DIR;
    let wheel = wheel(root, target_dir, RELEASE_RUSTFLAGS)?;
    // The reference service the HTTP-downstream tests start, in its own process, and
    // the command line the doors' test drives: in release, as the wheel is.
    cargo(
        root,
        &[
            "build",
            "--locked",
            "-q",
            "--release",
            "-p",
            "toolledger-refundd",
            "-p",
            "toolledger-cli",
            "--target-dir",
            target_dir,
        ],
        &[("RUSTFLAGS", RELEASE_RUSTFLAGS)],
    )?;
    let binaries = root.join(target_dir).join("release");
    let (refundd, cli) = (binaries.join("toolledger-refundd"), binaries.join("toolledger"));
    let test = venv(root, &root.join("target/python/test-venv"), true)?;
    pip(root, &test, &["-r", "crates/python/tests/requirements.txt"])?;
    pip(root, &test, &[wheel.to_string_lossy().as_ref()])?;
    let extension = installed_extension(&test)?;
    if extension > EXTENSION_BYTES_MAX {
        return Err(format!(
            "the installed extension is {extension} bytes, over {EXTENSION_BYTES_MAX}: debug info in the wheel?"
        ));
    }
    let output = Command::new(test.join("bin/python"))
        .current_dir(root.join("crates/python/tests"))
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "--doctest-modules"])
        .args(["--pyargs", "toolledger", "."])
        .arg(root.join("docs/python.md"))
        .args(["--doctest-glob", "*.md"])
        .env("TOOLLEDGER_REFUNDD", &refundd)
        .env("TOOLLEDGER_CLI", &cli)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .map_err(|err| format!("could not start pytest: {err}"))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    print!("{stdout}");
    eprint!("{}", String::from_utf8_lossy(&output.stderr));
    let summary = stdout.lines().rev().find(|line| !line.trim().is_empty()).unwrap_or_default();
    let summary = summary.trim_matches(|c: char| c == '=' || c.is_whitespace()).to_owned();
    if !output.status.success() {
        return Err(format!("pytest: {summary}"));
    }
    source_install(root, target_dir)?;
    let megabytes = extension as f64 / (1024.0 * 1024.0);
    Ok(format!("{summary}; extension {megabytes:.1} MB; pip install crates/python ok"))
}

/// The size of the compiled extension the wheel installed into `venv`.
fn installed_extension(venv: &Path) -> Result<u64, String> {
    let lib = venv.join("lib");
    let python = std::fs::read_dir(&lib)
        .map_err(|err| format!("{}: {err}", lib.display()))?
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .find(|path| {
            path.file_name().is_some_and(|name| name.to_string_lossy().starts_with("python3"))
        })
        .ok_or_else(|| "the venv has no lib/python3.*".to_owned())?;
    let package = python.join("site-packages/toolledger");
    std::fs::read_dir(&package)
        .map_err(|err| format!("{}: {err}", package.display()))?
        .filter_map(Result::ok)
        .find(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            name.starts_with("_toolledger") && name.ends_with(".so")
        })
        .ok_or_else(|| "the wheel installed no extension".to_owned())?
        .metadata()
        .map(|metadata| metadata.len())
        .map_err(|err| format!("the extension: {err}"))
}

/// `pip install crates/python`, as the README says: pip builds it from source through
/// maturin (the target dir shared, so only the binding is compiled again), and the
/// installed package opens a ledger and answers a call.
fn source_install(root: &Path, target_dir: &str) -> Result<(), String> {
    let source = venv(root, &root.join("target/python/source-venv"), true)?;
    status(
        Command::new(source.join("bin/pip"))
            .current_dir(root)
            .args(["install", "-q", "--disable-pip-version-check", "crates/python"])
            .env("CARGO_TARGET_DIR", root.join(target_dir))
            .env("RUSTFLAGS", RELEASE_RUSTFLAGS),
        "pip install crates/python",
    )?;
    let smoke = "import os, tempfile, toolledger\n\
        ledger = toolledger.Ledger.open(os.path.join(tempfile.mkdtemp(), 'l.sqlite3'))\n\
        assert ledger.tools == ['refund_order'], ledger.tools\n\
        reply = ledger.dispatch(toolledger.Call('refund_order', {}, key='k', tenant='t', subject='s'))\n\
        assert reply.code == 'INPUT_INVALID', reply.code\n";
    status(
        Command::new(source.join("bin/python")).current_dir(root).args(["-c", smoke]),
        "the package installed from source",
    )
}

/// A venv with the release wheel (built in the default target dir, beside `cargo
/// bench`'s own build) and the pure-Python peers, for the Python bench: its interpreter.
pub(crate) fn bench_venv(root: &Path) -> Result<String, String> {
    let wheel = wheel(root, "target", "")?;
    let bench = venv(root, &root.join("target/python/bench-venv"), true)?;
    pip(root, &bench, &["-r", "crates/python/bench/requirements.txt"])?;
    pip(root, &bench, &[wheel.to_string_lossy().as_ref()])?;
    Ok(bench.join("bin/python").to_string_lossy().into_owned())
}

/// The release wheel, built with maturin in `target_dir` (with that dir's `rustflags`)
/// into `target/python/wheels`.
fn wheel(root: &Path, target_dir: &str, rustflags: &str) -> Result<PathBuf, String> {
    let work = root.join("target/python");
    std::fs::create_dir_all(&work).map_err(|err| format!("target/python: {err}"))?;
    let build = venv(root, &work.join("build-venv"), false)?;
    pip(root, &build, &["-r", "crates/python/requirements-build.txt"])?;
    let wheels = work.join("wheels");
    // Only this build's wheel is installed.
    let _ = std::fs::remove_dir_all(&wheels);
    let mut maturin = Command::new(build.join("bin/maturin"));
    maturin
        .current_dir(root)
        .args(["build", "--locked", "-m", "crates/python/Cargo.toml", "--target-dir", target_dir])
        .arg("-o")
        .arg(&wheels)
        .arg("--release")
        .env("RUSTFLAGS", rustflags);
    status(&mut maturin, "maturin")?;
    let wheel = std::fs::read_dir(&wheels)
        .map_err(|err| format!("no wheel was built: {err}"))?
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .find(|path| path.extension().is_some_and(|ext| ext == "whl"))
        .ok_or_else(|| "maturin built no wheel".to_owned())?;
    // One wheel for every CPython from 3.10 on, installable on any manylinux system:
    // maturin tags it from the glibc symbols it links (its own auditwheel check).
    let name = wheel.file_name().map(|name| name.to_string_lossy().into_owned());
    match name {
        Some(name) if name.contains("-cp310-abi3-manylinux") => Ok(wheel),
        _ => Err(format!("the wheel is not an abi3 manylinux wheel: {}", wheel.display())),
    }
}

/// A venv at `dir` (made anew when `fresh`), and its directory.
fn venv(root: &Path, dir: &Path, fresh: bool) -> Result<PathBuf, String> {
    if fresh {
        let _ = std::fs::remove_dir_all(dir);
    }
    if !dir.join("bin/python").exists() {
        status(
            Command::new("python3").current_dir(root).arg("-m").arg("venv").arg(dir),
            "python3 -m venv",
        )?;
    }
    Ok(dir.to_path_buf())
}

fn pip(root: &Path, venv: &Path, args: &[&str]) -> Result<(), String> {
    status(
        Command::new(venv.join("bin/pip"))
            .current_dir(root)
            .args(["install", "-q", "--disable-pip-version-check"])
            .args(args),
        "pip install",
    )
}

fn status(command: &mut Command, what: &str) -> Result<(), String> {
    let status = command.status().map_err(|err| format!("could not start {what}: {err}"))?;
    if status.success() { Ok(()) } else { Err(format!("{what} exited with {status}")) }
}
