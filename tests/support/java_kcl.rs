//! The real Java KCL 3.x as a fleet member: the jars `localstack/install`
//! unpacks from the PyPI wheel `kclpy-ext`, and `tests/java/KclJavaWorker.java`
//! compiled with `javac` once per checkout and source version. A Java
//! worker process takes the same settings as an `e2e-worker` process and
//! writes the same batch log.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Context, bail};
use tokio::process::Command;

use crate::e2e::{WorkerProcess, WorkerProcessConfig};

/// The version the jars must be (`localstack/common.sh` pins the wheel).
const KCL_JAR: &str = "amazon-kinesis-client-3.1.3.jar";
const SOURCE: &str = include_str!("../java/KclJavaWorker.java");
const LOGBACK: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/java/logback.xml");

/// A compiled Java KCL worker, ready to start.
#[derive(Debug, Clone)]
pub struct JavaKcl {
    jars: PathBuf,
    classes: PathBuf,
}

impl JavaKcl {
    /// Finds the jars (`KCL_JAVA_KCL_JARS`, else the checkout's
    /// `localstack/.cache`), checks `java` and `javac`, and compiles the
    /// worker unless this source was compiled already. Every failure names
    /// what is missing and how to get it.
    pub fn prepare() -> anyhow::Result<JavaKcl> {
        let jars = jars_dir();
        if !jars.join(KCL_JAR).is_file() {
            bail!(
                "the Java KCL jars are missing ({} has no {KCL_JAR}); run localstack/install \
                 (make test does) or point KCL_JAVA_KCL_JARS at them",
                jars.display()
            );
        }
        for tool in ["java", "javac"] {
            let found = std::process::Command::new(tool)
                .arg("-version")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if !found {
                bail!("'{tool}' is not on PATH; the mixed-fleet tests need a JDK >= 17");
            }
        }
        let classes = std::env::temp_dir().join(format!("kcl-java-worker-{:016x}", fnv(SOURCE)));
        if !classes.join("KclJavaWorker.class").is_file() {
            compile(&jars, &classes)?;
        }
        Ok(JavaKcl { jars, classes })
    }

    /// Starts a Java worker `id` with `config`'s application, stream, log
    /// directory and checkpointing; its own log goes to `<id>.java.log`
    /// beside the batch log.
    pub fn spawn(&self, config: &WorkerProcessConfig, id: &str) -> anyhow::Result<WorkerProcess> {
        let log = std::fs::File::create(config.out_dir.join(format!("{id}.java.log")))
            .context("creating the Java worker's log")?;
        let classpath = format!("{}:{}/*", self.classes.display(), self.jars.display());
        let child = Command::new("java")
            .arg(format!("-Dlogback.configurationFile={LOGBACK}"))
            .args(["-Xmx512m", "-cp", &classpath, "KclJavaWorker"])
            .envs(config.env_for(id))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .context("starting the Java KCL worker")?;
        Ok(WorkerProcess {
            id: id.to_owned(),
            child,
        })
    }
}

/// Where the jars are: `KCL_JAVA_KCL_JARS`, else the checkout's
/// `localstack/.cache`.
fn jars_dir() -> PathBuf {
    match std::env::var_os("KCL_JAVA_KCL_JARS") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../localstack/.cache/kclpy-ext-3.1.3.post4/jars"),
    }
}

/// Compiles into a fresh directory, then renames it into place, so two
/// compiles at once (two test binaries, or two tests of one binary) never
/// see half a build.
fn compile(jars: &Path, classes: &Path) -> anyhow::Result<()> {
    // Named after the process and the call: tests of one binary compile
    // side by side, and one removed the other's directory under its javac.
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let call = CALLS.fetch_add(1, Ordering::Relaxed);
    let tmp = classes.with_extension(format!("tmp{}-{call}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp)?;
    let source = tmp.join("KclJavaWorker.java");
    std::fs::write(&source, SOURCE)?;
    let out = std::process::Command::new("javac")
        .arg("-nowarn")
        .arg("-cp")
        .arg(format!("{}/*", jars.display()))
        .arg("-d")
        .arg(&tmp)
        .arg(&source)
        .output()
        .context("running javac")?;
    if !out.status.success() {
        bail!(
            "javac failed on tests/java/KclJavaWorker.java:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    match std::fs::rename(&tmp, classes) {
        Ok(()) => Ok(()),
        // Another compile got there first.
        Err(_) if classes.join("KclJavaWorker.class").is_file() => {
            let _ = std::fs::remove_dir_all(&tmp);
            Ok(())
        }
        Err(e) => Err(e).context("moving the compiled Java worker into place"),
    }
}

/// FNV-1a: names the build after its source.
fn fnv(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}
