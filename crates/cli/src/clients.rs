//! `weft client set|list|remove`: the restrictions of client identities, which management
//! keeps and the metadata and storage servers enforce (docs/operations.md, "Security").

use crate::admin::{connect, ClusterArgs};
use anyhow::{anyhow, Result};
use clap::Subcommand;
use weft_proto::access::ClientRule;

#[derive(Subcommand)]
pub enum ClientCommand {
    /// Set the restrictions of the client NAME (its key made with `weft keygen --client
    /// NAME`), replacing any it had; without flags it has none.
    Set {
        /// The client's name.
        name: String,
        /// It may read but not change files, directories or attributes.
        #[arg(long)]
        read_only: bool,
        /// Its root (uid 0) acts as nobody, and the servers check its access themselves.
        #[arg(long)]
        root_squash: bool,
        /// Refuse every request of it.
        #[arg(long)]
        revoked: bool,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// List the clients with restrictions.
    List {
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Remove the restrictions of the client NAME.
    Remove {
        /// The client's name.
        name: String,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
}

fn restrictions(rule: &ClientRule) -> String {
    let flags: Vec<&str> = [
        (rule.read_only, "read-only"),
        (rule.root_squash, "root-squash"),
        (rule.revoked, "revoked"),
    ]
    .into_iter()
    .filter_map(|(set, name)| set.then_some(name))
    .collect();
    if flags.is_empty() {
        "none".to_string()
    } else {
        flags.join(", ")
    }
}

pub fn client(command: ClientCommand) -> Result<()> {
    let runtime = crate::runtime()?;
    runtime.block_on(async {
        match command {
            ClientCommand::Set {
                name,
                read_only,
                root_squash,
                revoked,
                cluster,
            } => {
                let rule = ClientRule {
                    name: name.clone(),
                    read_only,
                    root_squash,
                    revoked,
                };
                let (view, _) = connect(&cluster.mgmt()?).await?;
                view.mgmt()
                    .set_client_rule(rule.clone())
                    .await
                    .map_err(|error| anyhow!("cannot set the rule of client {name}: {error}"))?;
                println!(
                    "client {name}: {} (servers apply it from their next cluster map)",
                    restrictions(&rule)
                );
            }
            ClientCommand::List { cluster } => {
                let (_, map) = connect(&cluster.mgmt()?).await?;
                println!("{:<24} RESTRICTIONS", "CLIENT");
                for rule in &map.clients {
                    println!("{:<24} {}", rule.name, restrictions(rule));
                }
            }
            ClientCommand::Remove { name, cluster } => {
                let (view, _) = connect(&cluster.mgmt()?).await?;
                view.mgmt()
                    .remove_client_rule(&name)
                    .await
                    .map_err(|error| anyhow!("cannot remove the rule of client {name}: {error}"))?;
                println!("client {name}: no restrictions");
            }
        }
        Ok(())
    })
}
