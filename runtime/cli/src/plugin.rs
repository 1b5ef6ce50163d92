//! `weft plugin …`: the admin API from the command line (list, load, activate, default,
//! rollback, policy, unload) against a running `weft serve`.

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use serde_json::{json, Value};
use std::path::PathBuf;

#[derive(Args)]
pub struct PluginArgs {
    /// The server's base URL.
    #[arg(long, default_value = "http://127.0.0.1:8000", global = true)]
    url: String,
    /// The admin bearer token.
    #[arg(long, env = "WEFT_ADMIN_TOKEN", hide_env_values = true, global = true)]
    admin_token: Option<String>,
    #[command(subcommand)]
    cmd: PluginCmd,
}

#[derive(Subcommand)]
enum PluginCmd {
    /// List plugins, versions, counters.
    List {
        /// Print the raw JSON.
        #[arg(long)]
        json: bool,
    },
    /// Upload a component (.wasm), check it and activate it.
    Load {
        file: PathBuf,
        /// Refuse unless the bytes hash to this (hex).
        #[arg(long)]
        sha256: Option<String>,
        /// An admission plugin's options, as JSON.
        #[arg(long)]
        options: Option<String>,
        /// Also make it the default of its kind.
        #[arg(long)]
        default: bool,
        /// FILE is a path on the server's machine; send the path, not the bytes.
        #[arg(long)]
        server_path: bool,
    },
    /// Activate an already loaded version.
    Activate { kind: String, name: String, version: String },
    /// Reactivate the previously active version.
    Rollback { kind: String, name: String },
    /// Make a plugin the default of its kind.
    Default { kind: String, name: String },
    /// Set what a slot does when its plugin faults: fallback, fail or reload.
    Policy { kind: String, name: String, policy: String },
    /// Forget a (non-active) version.
    Unload { kind: String, name: String, version: String },
}

struct Client {
    base: String,
    token: Option<String>,
    agent: ureq::Agent,
}

impl Client {
    fn req(&self, method: &str, path: &str) -> ureq::Request {
        let r = self.agent.request(method, &format!("{}{path}", self.base.trim_end_matches('/')));
        match &self.token {
            Some(t) => r.set("Authorization", &format!("Bearer {t}")),
            None => r,
        }
    }

    fn done(&self, res: Result<ureq::Response, ureq::Error>) -> Result<Value> {
        match res {
            Ok(r) => Ok(r.into_json().context("reading the server's answer")?),
            Err(ureq::Error::Status(code, r)) => {
                let body = r.into_string().unwrap_or_default();
                let msg = serde_json::from_str::<Value>(&body).ok().and_then(|v| v["error"]["message"].as_str().map(String::from)).unwrap_or(body);
                bail!("HTTP {code}: {msg}")
            }
            Err(e) => bail!("{}: {e}", self.base),
        }
    }
}

pub fn run(a: PluginArgs) -> Result<()> {
    let c = Client { base: a.url.clone(), token: a.admin_token.clone(), agent: ureq::AgentBuilder::new().build() };
    let out = match a.cmd {
        PluginCmd::List { json } => {
            let v = c.done(c.req("GET", "/admin/plugins").call())?;
            if json {
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                println!("{:<10} {:<24} {:<10} {:<7} {:<8} {:<9} {:>8} {:>7} {:>10}", "KIND", "NAME", "VERSION", "ACTIVE", "DEFAULT", "POLICY", "CALLS", "FAULTS", "MEAN_US");
                for p in v["plugins"].as_array().into_iter().flatten() {
                    for ver in p["versions"].as_array().into_iter().flatten() {
                        println!(
                            "{:<10} {:<24} {:<10} {:<7} {:<8} {:<9} {:>8} {:>7} {:>10.1}",
                            p["kind"].as_str().unwrap_or("?"),
                            p["name"].as_str().unwrap_or("?"),
                            ver["version"].as_str().unwrap_or("?"),
                            ver["active"].as_bool().unwrap_or(false),
                            p["default"].as_bool().unwrap_or(false),
                            p["failure_policy"].as_str().unwrap_or("?"),
                            ver["calls"].as_u64().unwrap_or(0),
                            ver["faults"].as_u64().unwrap_or(0),
                            ver["mean_call_us"].as_f64().unwrap_or(0.0)
                        );
                    }
                }
            }
            return Ok(());
        }
        PluginCmd::Load { file, sha256, options, default, server_path } => {
            if server_path {
                let mut body = json!({"path": file, "default": default});
                if let Some(s) = sha256 {
                    body["sha256"] = json!(s);
                }
                if let Some(o) = options {
                    body["options"] = serde_json::from_str(&o).context("--options must be JSON")?;
                }
                c.done(c.req("POST", "/admin/plugins").send_json(body))?
            } else {
                let bytes = std::fs::read(&file).with_context(|| format!("reading {}", file.display()))?;
                let mut r = c.req("POST", "/admin/plugins").set("Content-Type", "application/wasm").query("default", if default { "true" } else { "false" });
                if let Some(s) = &sha256 {
                    r = r.query("sha256", s);
                }
                if let Some(o) = &options {
                    r = r.query("options", o);
                }
                c.done(r.send_bytes(&bytes))?
            }
        }
        PluginCmd::Activate { kind, name, version } => c.done(c.req("POST", &format!("/admin/plugins/{kind}/{name}/activate")).send_json(json!({"version": version})))?,
        PluginCmd::Rollback { kind, name } => c.done(c.req("POST", &format!("/admin/plugins/{kind}/{name}/rollback")).call())?,
        PluginCmd::Default { kind, name } => c.done(c.req("POST", &format!("/admin/plugins/{kind}/{name}/default")).call())?,
        PluginCmd::Policy { kind, name, policy } => c.done(c.req("PUT", &format!("/admin/plugins/{kind}/{name}/policy")).send_json(json!({"policy": policy})))?,
        PluginCmd::Unload { kind, name, version } => c.done(c.req("DELETE", &format!("/admin/plugins/{kind}/{name}/{version}")).call())?,
    };
    println!("{}", serde_json::to_string(&out)?);
    Ok(())
}
