//! Network namespaces for a test cluster: every service runs in a namespace of its own with its
//! own address on a bridge, so a test can cut one server off the network (its link down) as a
//! pulled cable would, while the host — where the tests and the mounts run — reaches all.

use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

/// Names one cluster's namespaces and links apart from another's in the same run.
static NEXT: AtomicU32 = AtomicU32::new(0);

/// One service's namespace and its link to the bridge.
struct Link {
    namespace: String,
    /// The host end of the veth pair, on the bridge.
    host_end: String,
}

/// A bridge on the host and a namespace per service; removed on drop.
pub(crate) struct Network {
    tag: String,
    prefix: String,
    bridge: String,
    links: BTreeMap<String, Link>,
}

fn ip(args: &[&str]) -> Result<()> {
    let output = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .context("cannot run ip (iproute2)")?;
    if !output.status.success() {
        bail!(
            "ip {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(())
}

impl Network {
    /// A bridge with the host at `.1` of a /24 of 10.0.0.0/8 no route uses yet.
    pub fn create() -> Result<Network> {
        let number = NEXT.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let tag = format!("{:04x}{:02x}", pid & 0xffff, number & 0xff);
        let routes = String::from_utf8_lossy(
            &Command::new("ip")
                .args(["-4", "route", "show"])
                .output()
                .context("cannot run ip (iproute2)")?
                .stdout,
        )
        .into_owned();
        let prefix = (0..200u32)
            .map(|step| {
                let spot = (pid.wrapping_mul(31) + number * 7 + step) % 200;
                format!("10.{}.{}", 100 + spot / 100, spot % 100 + 100)
            })
            .find(|prefix| !routes.contains(&format!("{prefix}.0/24")))
            .context("no free /24 for a test network")?;
        let bridge = format!("wb{tag}");
        ip(&["link", "add", &bridge, "type", "bridge"])?;
        let network = Network {
            tag,
            prefix,
            bridge,
            links: BTreeMap::new(),
        };
        ip(&["link", "set", &network.bridge, "up"])?;
        ip(&[
            "addr",
            "add",
            &format!("{}.1/24", network.prefix),
            "dev",
            &network.bridge,
        ])?;
        Ok(network)
    }

    /// Gives `service` a namespace with address `.host` on the bridge; returns the address.
    pub fn add(&mut self, service: &str, host: u8) -> Result<String> {
        let namespace = format!("weft-{}-{service}", self.tag);
        let host_end = format!("wv{}{host:02x}", self.tag);
        let inner_end = format!("wp{}{host:02x}", self.tag);
        let address = format!("{}.{host}", self.prefix);
        ip(&["netns", "add", &namespace])?;
        self.links.insert(
            service.to_string(),
            Link {
                namespace: namespace.clone(),
                host_end: host_end.clone(),
            },
        );
        ip(&[
            "link", "add", &host_end, "type", "veth", "peer", "name", &inner_end,
        ])?;
        ip(&["link", "set", &inner_end, "netns", &namespace])?;
        ip(&["link", "set", &host_end, "master", &self.bridge])?;
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
        ip(&["-n", &namespace, "link", "set", "lo", "up"])?;
        Ok(address)
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

    /// Takes `service`'s link down (`up: false`) or brings it back.
    pub fn set_link(&self, service: &str, up: bool) -> Result<()> {
        let link = self
            .links
            .get(service)
            .with_context(|| format!("{service} has no network namespace"))?;
        ip(&[
            "link",
            "set",
            &link.host_end,
            if up { "up" } else { "down" },
        ])
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        for link in self.links.values() {
            let _ = ip(&["netns", "del", &link.namespace]);
            let _ = ip(&["link", "del", &link.host_end]);
        }
        let _ = ip(&["link", "del", &self.bridge]);
    }
}
