//! A Redis Cluster of six `redis-server` processes (three masters, a replica each) on free
//! loopback ports in a temporary directory, made by `redis-cli --cluster create`, stopped and
//! removed when dropped (a test that fails leaves no server behind).

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long the cluster may take to form, or to fail over.
const FORM_DEADLINE: Duration = Duration::from_secs(60);

pub struct TestCluster {
    dir: PathBuf,
    pub ports: Vec<u16>,
    servers: Vec<Option<Child>>,
    /// `requirepass` (and `masterauth`) of every node, if any.
    password: Option<String>,
}

/// Whether the cluster's programs are installed (CI installs them); says so if not.
pub fn have_redis() -> bool {
    super::have("redis-server") && super::have("redis-cli")
}

/// `n` ports free on 127.0.0.1 whose cluster bus ports (+10000) are free too. The listeners
/// are held until all are chosen, so no port is handed out twice.
fn free_ports(n: usize) -> Vec<u16> {
    let mut held = Vec::new();
    let mut ports = Vec::new();
    while ports.len() < n {
        let l = TcpListener::bind("127.0.0.1:0").expect("binding a loopback port");
        let p = l.local_addr().unwrap().port();
        held.push(l);
        if p > 55_000 {
            continue;
        }
        if let Ok(bus) = TcpListener::bind(("127.0.0.1", p + 10_000)) {
            held.push(bus);
            ports.push(p);
        }
    }
    ports
}

/// `redis-cli -p PORT ARGS...`'s output (empty if it failed to run).
pub fn cli(port: u16, args: &[&str]) -> String {
    cli_auth(port, None, args)
}

fn cli_auth(port: u16, password: Option<&str>, args: &[&str]) -> String {
    let mut c = Command::new("redis-cli");
    c.args(["-h", "127.0.0.1", "-p", &port.to_string()]);
    if let Some(p) = password {
        c.env("REDISCLI_AUTH", p);
    }
    c.args(args)
        .stderr(Stdio::null())
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

fn wait_for(what: &str, deadline: Duration, mut ok: impl FnMut() -> bool) {
    let t = Instant::now();
    while !ok() {
        assert!(t.elapsed() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

impl TestCluster {
    /// Starts six nodes and makes them a cluster; waits until every node says
    /// `cluster_state:ok` and every master has its replica connected.
    pub fn start(name: &str) -> TestCluster {
        Self::start_with(name, None)
    }

    /// `start`, every node requiring `password` (`requirepass`, and `masterauth` for its
    /// replication).
    pub fn start_with(name: &str, password: Option<&str>) -> TestCluster {
        let dir = std::env::temp_dir().join(format!("uffd-cluster-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let ports = free_ports(6);
        let mut c = TestCluster {
            dir,
            ports: ports.clone(),
            servers: Vec::new(),
            password: password.map(str::to_string),
        };
        for &p in &ports {
            let s = c.spawn(p);
            c.servers.push(Some(s));
        }
        for &p in &ports {
            wait_for(&format!("node {p} to answer"), FORM_DEADLINE, || {
                c.cli(p, &["ping"]).trim() == "PONG"
            });
        }
        let addrs: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let mut create = Command::new("redis-cli");
        if let Some(p) = password {
            create.env("REDISCLI_AUTH", p);
        }
        let out = create
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .output()
            .expect("running redis-cli --cluster create");
        assert!(
            out.status.success(),
            "redis-cli --cluster create: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        c.wait_healthy(&[]);
        c
    }

    /// `redis-cli` against one node, with the cluster's password.
    pub fn cli(&self, port: u16, args: &[&str]) -> String {
        cli_auth(port, self.password.as_deref(), args)
    }

    fn spawn(&self, port: u16) -> Child {
        let d = self.dir.join(port.to_string());
        std::fs::create_dir_all(&d).unwrap();
        let mut cmd = Command::new("redis-server");
        if let Some(p) = &self.password {
            cmd.args(["--requirepass", p, "--masterauth", p]);
        }
        cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args([
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
            ])
            // Failover about two seconds after a master stops answering.
            .args(["--cluster-node-timeout", "1000"])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .arg("--dir")
            .arg(&d)
            .arg("--logfile")
            .arg(d.join("log"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting redis-server")
    }

    /// `HOST:PORT,...` of every node, for `--backend redis-cluster:...`.
    pub fn nodes_arg(&self) -> String {
        self.ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn alive(&self) -> Vec<u16> {
        self.ports
            .iter()
            .zip(&self.servers)
            .filter(|(_, s)| s.is_some())
            .map(|(&p, _)| p)
            .collect()
    }

    /// `(port, is master, port of its master)` of each node, as a live node sees them.
    pub fn roles(&self) -> Vec<(u16, bool, Option<u16>)> {
        let alive = self.alive();
        let text = self.cli(alive[0], &["cluster", "nodes"]);
        let mut ids = std::collections::HashMap::new();
        let mut rows = Vec::new();
        for line in text.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 8 {
                continue;
            }
            let port: u16 = f[1]
                .split(['@', ':'])
                .nth(1)
                .and_then(|p| p.parse().ok())
                .unwrap_or(0);
            ids.insert(f[0].to_string(), port);
            rows.push((port, f[2].to_string(), f[3].to_string()));
        }
        rows.into_iter()
            .filter(|(_, flags, _)| !flags.contains("fail") && !flags.contains("noaddr"))
            .map(|(port, flags, master)| {
                (port, flags.contains("master"), ids.get(&master).copied())
            })
            .collect()
    }

    /// The masters' ports (live ones).
    pub fn masters(&self) -> Vec<u16> {
        let alive = self.alive();
        self.roles()
            .into_iter()
            .filter(|&(p, m, _)| m && alive.contains(&p))
            .map(|(p, _, _)| p)
            .collect()
    }

    /// Waits until every live node but `except` says `cluster_state:ok`, three masters serve
    /// all slots, and each has as many replicas connected as live nodes allow.
    pub fn wait_healthy(&self, except: &[u16]) {
        let alive: Vec<u16> = self
            .alive()
            .into_iter()
            .filter(|p| !except.contains(p))
            .collect();
        wait_for("cluster_state:ok on every node", FORM_DEADLINE, || {
            alive.iter().all(|&p| {
                self.cli(p, &["cluster", "info"])
                    .contains("cluster_state:ok")
            })
        });
        let want_replicas = if alive.len() >= 6 { 1 } else { 0 };
        wait_for("three masters with their replicas", FORM_DEADLINE, || {
            let masters = self.masters();
            masters.len() == 3
                && masters.iter().all(|&m| {
                    // Replicas done with their first sync (WAIT counts only those).
                    let info = self.cli(m, &["info", "replication"]);
                    let n = info
                        .lines()
                        .filter(|l| l.starts_with("slave") && l.contains("state=online"))
                        .count();
                    n >= want_replicas
                })
        });
        // CLUSTER SLOTS lists a replica once the others have heard of its replication offset.
        wait_for("CLUSTER SLOTS to list the replicas", FORM_DEADLINE, || {
            let slots = self.cli(alive[0], &["cluster", "slots"]);
            // Per range: start, end, then 3 lines (host, port, id) per node, and possibly
            // a hostname map; counting node ids (40 hex digits) is enough.
            let ids = slots
                .lines()
                .filter(|l| l.len() == 40 && l.bytes().all(|b| b.is_ascii_hexdigit()))
                .count();
            ids >= 3 * (1 + want_replicas)
        });
    }

    /// SIGKILLs the node on `port`.
    pub fn kill(&mut self, port: u16) {
        let i = self.ports.iter().position(|&p| p == port).unwrap();
        if let Some(mut s) = self.servers[i].take() {
            let _ = s.kill();
            let _ = s.wait();
        }
    }

    /// Starts the node on `port` again (it rejoins from its nodes.conf, as a replica if it was
    /// failed over).
    pub fn restart(&mut self, port: u16) {
        let i = self.ports.iter().position(|&p| p == port).unwrap();
        assert!(self.servers[i].is_none(), "node {port} is running");
        self.servers[i] = Some(self.spawn(port));
        wait_for(&format!("node {port} to answer"), FORM_DEADLINE, || {
            self.cli(port, &["ping"]).trim() == "PONG"
        });
    }

    /// Waits until a master killed on `dead` has been replaced: three live masters serve every
    /// slot again.
    pub fn wait_failover(&self, dead: u16) {
        wait_for("a replica to take over", FORM_DEADLINE, || {
            let m = self.masters();
            m.len() == 3 && !m.contains(&dead)
        });
        wait_for("cluster_state:ok", FORM_DEADLINE, || {
            self.alive().iter().all(|&p| {
                self.cli(p, &["cluster", "info"])
                    .contains("cluster_state:ok")
            })
        });
    }

    /// Keys on all live masters.
    pub fn keys(&self) -> u64 {
        self.masters()
            .iter()
            .map(|&m| self.cli(m, &["dbsize"]).trim().parse::<u64>().unwrap_or(0))
            .sum()
    }

    /// The key names on all live masters (`SCAN`).
    pub fn key_names(&self) -> Vec<String> {
        let mut v = Vec::new();
        for m in self.masters() {
            let out = self.cli(m, &["--scan", "--pattern", "*"]);
            v.extend(out.lines().map(str::to_string));
        }
        v
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        for s in self.servers.iter_mut().flatten() {
            let _ = s.kill();
            let _ = s.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
