//! Network namespaces for a test cluster: every service (and every client host) runs in a
//! namespace of its own with its own address on each of the cluster's networks (rails), each a
//! bridge on the host. A test can cut one host off a rail or off all of them, as a pulled
//! cable would, and every link can be rate-limited with `tc` so that the network, not this
//! machine's cores, is what limits bandwidth. The host — where the tests run and the mounts
//! are seen — reaches every rail.

use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// Names one cluster's namespaces and links apart from another's in the same run.
static NEXT: AtomicU32 = AtomicU32::new(0);

/// One host's namespace and its links, one per rail.
struct Link {
    namespace: String,
    /// The host ends of the veth pairs, on the rails' bridges, in rail order.
    host_ends: Vec<String>,
    /// The host's address on each rail, in rail order.
    addresses: Vec<String>,
}

/// One network: a bridge on the host with a /24 of its own.
struct Rail {
    prefix: String,
    bridge: String,
}

/// Bridges on the host (one per rail) and a namespace per service or client host; removed on
/// drop.
pub(crate) struct Network {
    tag: String,
    rails: Vec<Rail>,
    links: BTreeMap<String, Link>,
}

/// Runs an iproute2 `tool` (`ip`, `tc`) with `args`; its stderr in the error when it fails.
fn iproute2(tool: &str, args: &[&str]) -> Result<()> {
    let mut command = Command::new(tool);
    command.args(args);
    let output =
        crate::output_apart(command).with_context(|| format!("cannot run {tool} (iproute2)"))?;
    if !output.status.success() {
        bail!(
            "{tool} {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(())
}

fn ip(args: &[&str]) -> Result<()> {
    iproute2("ip", args)
}

fn tc(args: &[&str]) -> Result<()> {
    iproute2("tc", args)
}

/// The links' MTU: jumbo frames, as on cluster networks (headers are under 1 % of a frame).
const MTU: &str = "9000";

/// The token-bucket arguments that hold a link to `rate_mbit` with a queue of up to 100 ms.
fn shaping(rate_mbit: u32) -> Vec<String> {
    // A bucket of 10 ms worth (at least 64 KiB, one segmentation-offload packet), so a TCP
    // stream keeps the link busy without bursting far past the rate.
    let burst = (u64::from(rate_mbit) * 1_000_000 / 8 / 100).max(64 * 1024);
    [
        "root".to_string(),
        "tbf".to_string(),
        "rate".to_string(),
        format!("{rate_mbit}mbit"),
        "burst".to_string(),
        burst.to_string(),
        "latency".to_string(),
        "100ms".to_string(),
    ]
    .to_vec()
}

impl Network {
    /// `rails` bridges, each with the host at `.1` of a /24 of 10.0.0.0/8 no route uses yet.
    pub fn create(rails: usize) -> Result<Network> {
        let number = NEXT.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let tag = format!("{:04x}{:02x}", pid & 0xffff, number & 0xff);
        let mut command = Command::new("ip");
        command.args(["-4", "route", "show"]);
        let routes = String::from_utf8_lossy(
            &crate::output_apart(command)
                .context("cannot run ip (iproute2)")?
                .stdout,
        )
        .into_owned();
        let mut network = Network {
            tag,
            rails: Vec::new(),
            links: BTreeMap::new(),
        };
        for rail in 0..rails.max(1) {
            let taken: Vec<&str> = network.rails.iter().map(|r| r.prefix.as_str()).collect();
            let prefix = (0..200u32)
                .map(|step| {
                    let spot = (pid.wrapping_mul(31) + number * 7 + step) % 200;
                    format!("10.{}.{}", 100 + spot / 100, spot % 100 + 100)
                })
                .find(|prefix| {
                    !routes.contains(&format!("{prefix}.0/24")) && !taken.contains(&prefix.as_str())
                })
                .context("no free /24 for a test network")?;
            let bridge = format!("wb{}{rail}", network.tag);
            ip(&["link", "add", &bridge, "mtu", MTU, "type", "bridge"])?;
            network.rails.push(Rail { prefix, bridge });
            let rail = network.rails.last().expect("just pushed");
            ip(&["link", "set", &rail.bridge, "up"])?;
            ip(&[
                "addr",
                "add",
                &format!("{}.1/24", rail.prefix),
                "dev",
                &rail.bridge,
            ])?;
        }
        Ok(network)
    }

    /// Gives `host_name` (a service or a client host) a namespace with address `.host` on
    /// every rail, each link shaped to `rate_mbit` each way when given; returns the
    /// addresses, in rail order. Links carry jumbo frames, as cluster networks do.
    pub fn add(
        &mut self,
        host_name: &str,
        host: u8,
        rate_mbit: Option<u32>,
    ) -> Result<Vec<String>> {
        let namespace = format!("weft-{}-{host_name}", self.tag);
        ip(&["netns", "add", &namespace])?;
        self.links.insert(
            host_name.to_string(),
            Link {
                namespace: namespace.clone(),
                host_ends: Vec::new(),
                addresses: Vec::new(),
            },
        );
        ip(&["-n", &namespace, "link", "set", "lo", "up"])?;
        let mut addresses = Vec::new();
        for (index, rail) in self.rails.iter().enumerate() {
            let host_end = format!("wv{}{index}{host:02x}", self.tag);
            let inner_end = format!("wp{}{index}{host:02x}", self.tag);
            let address = format!("{}.{host}", rail.prefix);
            ip(&[
                "link", "add", &host_end, "mtu", MTU, "type", "veth", "peer", "name", &inner_end,
                "mtu", MTU,
            ])?;
            self.links
                .get_mut(host_name)
                .expect("just inserted")
                .host_ends
                .push(host_end.clone());
            ip(&["link", "set", &inner_end, "netns", &namespace])?;
            ip(&["link", "set", &host_end, "master", &rail.bridge])?;
            ip(&["link", "set", &host_end, "up"])?;
            ip(&[
                "-n",
                &namespace,
                "addr",
                "add",
                &format!("{address}/24"),
                "dev",
                &inner_end,
            ])?;
            ip(&["-n", &namespace, "link", "set", &inner_end, "up"])?;
            if let Some(rate) = rate_mbit {
                // Both ways: what the host sends (the bridge into the namespace) and what it
                // receives.
                let shape = shaping(rate);
                let shape: Vec<&str> = shape.iter().map(String::as_str).collect();
                tc(&[&["qdisc", "add", "dev", &host_end][..], &shape].concat())?;
                tc(&[
                    &["-n", &namespace, "qdisc", "add", "dev", &inner_end][..],
                    &shape,
                ]
                .concat())?;
            }
            addresses.push(address);
        }
        self.links
            .get_mut(host_name)
            .expect("added above")
            .addresses
            .clone_from(&addresses);
        Ok(addresses)
    }

    /// Cuts the path between hosts `a` and `b` on every rail (`up: false`), both ways, as a
    /// broken switch between them would: each still reaches every other host. Or mends it.
    pub fn set_path(&self, a: &str, b: &str, up: bool) -> Result<()> {
        let link = |name: &str| {
            self.links
                .get(name)
                .with_context(|| format!("{name} has no network namespace"))
        };
        let (a, b) = (link(a)?, link(b)?);
        for (from, to) in [(a, b), (b, a)] {
            for address in &to.addresses {
                ip(&[
                    "-n",
                    &from.namespace,
                    "route",
                    if up { "del" } else { "add" },
                    "blackhole",
                    &format!("{address}/32"),
                ])?;
            }
        }
        Ok(())
    }

    /// Bytes carried so far (both ways) by `host_name`'s link on `rail`.
    pub fn link_bytes(&self, host_name: &str, rail: usize) -> Result<u64> {
        let end = self
            .links
            .get(host_name)
            .and_then(|link| link.host_ends.get(rail))
            .with_context(|| format!("{host_name} has no link on rail {rail}"))?;
        let mut total = 0;
        for direction in ["rx_bytes", "tx_bytes"] {
            let path = format!("/sys/class/net/{end}/statistics/{direction}");
            let text =
                std::fs::read_to_string(&path).with_context(|| format!("cannot read {path}"))?;
            total += text
                .trim()
                .parse::<u64>()
                .with_context(|| format!("{path}: {text:?}"))?;
        }
        Ok(total)
    }

    /// Whether `host_name` has a namespace.
    pub fn has(&self, host_name: &str) -> bool {
        self.links.contains_key(host_name)
    }

    /// A command that runs `program` in `service`'s network namespace (or on the host if it
    /// has none). Only the network namespace is entered (`nsenter --net`): `ip netns exec`
    /// would also give the process a copy of the host's mounts, and a Weft mount copied into
    /// it could not be unmounted while the process lives.
    pub fn command(&self, service: &str, program: &std::path::Path) -> Command {
        match self.links.get(service) {
            Some(link) => {
                let mut command = Command::new("nsenter");
                command
                    .arg(format!("--net=/run/netns/{}", link.namespace))
                    .arg("--")
                    .arg(program);
                command
            }
            None => Command::new(program),
        }
    }

    /// Takes `host_name`'s link on `rail` (or on every rail, `None`) down (`up: false`) or
    /// brings it back.
    pub fn set_link(&self, host_name: &str, rail: Option<usize>, up: bool) -> Result<()> {
        let link = self
            .links
            .get(host_name)
            .with_context(|| format!("{host_name} has no network namespace"))?;
        let ends: Vec<&String> = match rail {
            None => link.host_ends.iter().collect(),
            Some(rail) => vec![link
                .host_ends
                .get(rail)
                .with_context(|| format!("the cluster has no rail {rail}"))?],
        };
        for end in ends {
            ip(&["link", "set", end, if up { "up" } else { "down" }])?;
        }
        Ok(())
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        for link in self.links.values() {
            let _ = ip(&["netns", "del", &link.namespace]);
            for end in &link.host_ends {
                let _ = ip(&["link", "del", end]);
            }
        }
        for rail in &self.rails {
            let _ = ip(&["link", "del", &rail.bridge]);
        }
    }
}
