//! A throwaway PostgreSQL cluster for tests, with no dependency beyond std.
//!
//! [`PgCluster::start`] runs `initdb` into a temporary directory (trust authentication,
//! superuser `aplc`) and `pg_ctl start` on a free 127.0.0.1 port, with the Unix socket
//! inside that directory. As root, both run as the `postgres` user (PostgreSQL refuses
//! root). [`shared`] starts one cluster per test binary; [`PgCluster::database`] gives
//! each test a database of its own.
//!
//! A cluster stops on `Drop` (`pg_ctl stop -m immediate`, directory removed). A static
//! is never dropped, so each cluster also has a watchdog: a shell in its own process
//! group that waits for the end of a pipe this process holds open, then stops the
//! cluster. The pipe closes when the test process ends, however it ends.
//!
//! If the server cannot be started, [`shared`] panics with what is missing: Postgres
//! tests fail loudly, never skip.

use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The superuser `initdb` creates.
pub const SUPERUSER: &str = "aplc";

/// A running cluster.
pub struct PgCluster {
    dir: PathBuf,
    bin: PathBuf,
    port: u16,
    /// Run the server's tools as `postgres` (we are root).
    as_postgres: bool,
    /// Held open for the watchdog; dropping it (or exiting) stops the cluster.
    watchdog: Mutex<Option<(Child, ChildStdin)>>,
}

/// The cluster shared by the tests of this binary, started on first use.
pub fn shared() -> &'static PgCluster {
    static CLUSTER: OnceLock<PgCluster> = OnceLock::new();
    CLUSTER.get_or_init(|| match PgCluster::start() {
        Ok(cluster) => cluster,
        Err(e) => panic!("cannot start a PostgreSQL server for the tests: {e}"),
    })
}

impl PgCluster {
    /// Starts a new cluster, or says what is missing.
    pub fn start() -> Result<PgCluster, String> {
        let bin = find_bin()?;
        let as_postgres = running_as_root();
        let stamp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let dir = std::env::temp_dir().join(format!("aplc-pg-{}-{stamp}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let data = dir.join("data");
        if as_postgres {
            run(Command::new("chown").arg("postgres:").arg(&dir), "chown")?;
        }
        let mut cluster = PgCluster {
            dir,
            bin,
            port: 0,
            as_postgres,
            watchdog: Mutex::new(None),
        };
        cluster.spawn_watchdog()?;
        cluster.tool(
            "initdb",
            &[
                "-D",
                path_str(&data)?,
                "-U",
                SUPERUSER,
                "--auth=trust",
                "--no-locale",
                "-E",
                "UTF8",
                "--no-sync",
            ],
        )?;
        // A free port can be taken between our probe and the server's bind: try again.
        let mut last = String::new();
        for _ in 0..5 {
            cluster.port = free_port()?;
            let options = format!(
                "-c listen_addresses=127.0.0.1 -p {} -k {} -c fsync=off",
                cluster.port,
                path_str(&cluster.dir)?
            );
            let log = cluster.dir.join("server.log");
            match cluster.tool(
                "pg_ctl",
                &[
                    "-D",
                    path_str(&data)?,
                    "-l",
                    path_str(&log)?,
                    "-o",
                    &options,
                    "-w",
                    "-t",
                    "60",
                    "start",
                ],
            ) {
                Ok(_) => return cluster.wait_ready().map(|()| cluster),
                Err(e) => {
                    let log = std::fs::read_to_string(&log).unwrap_or_default();
                    last = format!("{e}\nserver log:\n{log}");
                }
            }
        }
        Err(last)
    }

    /// The port the server listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The URL of database `db`.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://{SUPERUSER}@127.0.0.1:{}/{db}", self.port)
    }

    /// Creates a fresh database with a unique name starting with `prefix`; returns its URL.
    pub fn database(&self, prefix: &str) -> String {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let name: String = format!("{prefix}_{}", NEXT.fetch_add(1, Ordering::Relaxed))
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '_'
                }
            })
            .collect();
        let port = self.port.to_string();
        if let Err(e) = self.tool(
            "createdb",
            &["-h", "127.0.0.1", "-p", &port, "-U", SUPERUSER, &name],
        ) {
            panic!("cannot create database {name}: {e}");
        }
        self.url(&name)
    }

    /// Runs SQL in database `db` through `psql` (for tests that set up foreign tables or
    /// read what a server wrote); returns the rows unaligned, a line each (`-At`).
    pub fn psql(&self, db: &str, sql: &str) -> Result<String, String> {
        let port = self.port.to_string();
        self.tool(
            "psql",
            &[
                "-h",
                "127.0.0.1",
                "-p",
                &port,
                "-U",
                SUPERUSER,
                "-d",
                db,
                "-v",
                "ON_ERROR_STOP=1",
                "-At",
                "-c",
                sql,
            ],
        )
    }

    fn tool(&self, name: &str, args: &[&str]) -> Result<String, String> {
        let program = self.bin.join(name);
        let mut command = if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&program);
            c
        } else {
            Command::new(&program)
        };
        command.args(args).current_dir(&self.dir);
        run(&mut command, name)
    }

    fn wait_ready(&self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(format!(
            "the server did not accept connections on 127.0.0.1:{}",
            self.port
        ))
    }

    /// The watchdog: reads its stdin to the end (when this process is gone), then stops
    /// the server and removes the directory.
    fn spawn_watchdog(&mut self) -> Result<(), String> {
        let data = self.dir.join("data");
        let stop = format!(
            "{} -D '{}' stop -m immediate",
            self.bin.join("pg_ctl").display(),
            data.display()
        );
        let stop = if self.as_postgres {
            format!("runuser -u postgres -- {stop}")
        } else {
            stop
        };
        let script = format!(
            "cat >/dev/null; {stop} >/dev/null 2>&1; rm -rf '{}'",
            self.dir.display()
        );
        let mut child = Command::new("sh")
            .args(["-c", &script])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .map_err(|e| format!("cannot start the watchdog shell: {e}"))?;
        let stdin = child.stdin.take().ok_or("the watchdog has no stdin")?;
        *self.watchdog.lock().map_err(|_| "poisoned")? = Some((child, stdin));
        Ok(())
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        // Closing the pipe makes the watchdog stop the server; wait for it to finish.
        if let Ok(mut guard) = self.watchdog.lock()
            && let Some((mut child, mut stdin)) = guard.take()
        {
            let _ = stdin.flush();
            drop(stdin);
            let _ = child.wait();
        }
    }
}

/// The newest `/usr/lib/postgresql/*/bin` with `initdb` and `pg_ctl`, else the directory
/// of `initdb` on PATH.
fn find_bin() -> Result<PathBuf, String> {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            (bin.join("initdb").exists() && bin.join("pg_ctl").exists()).then_some((version, bin))
        })
        .collect();
    versions.sort();
    if let Some((_, bin)) = versions.pop() {
        return Ok(bin);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .find(|dir| dir.join("initdb").exists() && dir.join("pg_ctl").exists())
        .ok_or_else(|| {
            "no `initdb`/`pg_ctl` in /usr/lib/postgresql/*/bin or on PATH: install the \
             `postgresql` package (apt-get install -y postgresql)"
                .to_string()
        })
}

fn running_as_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == "0")
}

fn free_port() -> Result<u16, String> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("no free port: {e}"))?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| format!("no free port: {e}"))
}

fn path_str(path: &Path) -> Result<&str, String> {
    path.to_str()
        .ok_or_else(|| format!("not UTF-8: {}", path.display()))
}

fn run(command: &mut Command, name: &str) -> Result<String, String> {
    let out = command
        .output()
        .map_err(|e| format!("cannot run `{name}`: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "`{name}` failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}
