//! Links `pubsub-cgi` as a position-dependent executable on Linux.
//!
//! As a CGI, the program is started once per request, so its start-up is
//! part of every request's cost. A position-independent executable (the
//! default) makes the dynamic loader apply some 15,000 relative
//! relocations at each start, and each page of `.data.rel.ro` they touch
//! becomes a private copy: about 75 of the 190 page faults of one notify,
//! and half of its CPU time on this project's VMs (measured with
//! `perf stat`, see BENCHMARKS.md). Linked with `-no-pie`, the addresses are
//! fixed at link time and the loader has almost nothing to do. The code is
//! still compiled position-independent; only the final link changes, and
//! only for this binary (address-space layout randomisation then applies to
//! the stack, heap and libraries but not to the program's own code).
//! Build with `KN_CGI_PIE=1` to keep the default position-independent link.
//!
//! The binary to install as `pubsub.cgi` is linked statically as well:
//! `cargo build-cgi`, an alias in `.cargo/config.toml` for `cargo rustc`
//! with `-C target-feature=+crt-static -C relocation-model=static`, with
//! which rustc links `-static -no-pie` itself. Cargo cannot set those flags
//! for one binary from here. A `crt-static` build without the static
//! relocation model is linked `-static-pie`, and `-no-pie` must not be
//! added to that (the binary would crash at start).
//!
//! It also tells the code which git commit it is built from, for
//! `/metrics`' `kn_build_info` (src/metrics_http.rs): `KN_GIT_COMMIT` from
//! the environment (a package build from a tarball sets it), else `git
//! rev-parse` of the checkout, else nothing (the version alone is shown).
fn main() {
    git_commit();
    // `www/` is built into the binary (src/pages.rs): rebuild when it changes.
    println!("cargo:rerun-if-changed=../../www");
    println!("cargo:rerun-if-env-changed=KN_CGI_PIE");
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var_os("KN_CGI_PIE").is_some_and(|v| !v.is_empty() && v != "0") {
        return;
    }
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let env = std::env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    let features = std::env::var("CARGO_CFG_TARGET_FEATURE").unwrap_or_default();
    let static_crt = features.split(',').any(|f| f == "crt-static");
    if os == "linux" && env == "gnu" && !static_crt {
        println!("cargo:rustc-link-arg-bin=pubsub-cgi=-no-pie");
    }
}

/// Sets `KN_GIT_COMMIT` for the crate when the commit is known, and asks
/// to be run again when `HEAD` moves (a commit, a checkout).
fn git_commit() {
    println!("cargo:rerun-if-env-changed=KN_GIT_COMMIT");
    if let Some(commit) = std::env::var("KN_GIT_COMMIT").ok().filter(|c| !c.trim().is_empty()) {
        println!("cargo:rustc-env=KN_GIT_COMMIT={}", commit.trim());
        return;
    }
    let git = |args: &[&str]| -> Option<String> {
        let out = std::process::Command::new("git").args(args).output().ok()?;
        let text = String::from_utf8(out.stdout).ok()?.trim().to_string();
        (out.status.success() && !text.is_empty()).then_some(text)
    };
    let Some(commit) = git(&["rev-parse", "--short=12", "HEAD"]) else { return };
    // HEAD, and the branch it names (in a worktree, in the common git
    // directory: `--git-path` knows where).
    let mut watched = vec!["HEAD".to_string()];
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watched.push(branch);
    }
    watched.push("packed-refs".to_string());
    for name in watched {
        if let Some(path) = git(&["rev-parse", "--git-path", &name]) {
            if std::path::Path::new(&path).exists() {
                println!("cargo:rerun-if-changed={path}");
            }
        }
    }
    println!("cargo:rustc-env=KN_GIT_COMMIT={commit}");
}
