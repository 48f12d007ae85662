//! The handshake, from both sides: a server reading what a peer sends it (as a holder of the
//! cluster key, and without authentication), and a client reading what a server answers.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;
use weft_net::auth::{self, Auth, VERSIONS_SPOKEN};

struct Setup {
    runtime: tokio::runtime::Runtime,
    cluster: Auth,
}

fn setup() -> &'static Setup {
    static SETUP: OnceLock<Setup> = OnceLock::new();
    SETUP.get_or_init(|| {
        let file = std::env::temp_dir().join(format!("weft-fuzz-{}.key", std::process::id()));
        let _ = std::fs::remove_file(&file);
        auth::write_new_key(&file).expect("a key file");
        let cluster = Auth::from_key_file(&file).expect("the key");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime");
        Setup { runtime, cluster }
    })
}

fuzz_target!(|bytes: &[u8]| {
    let setup = setup();
    setup.runtime.block_on(async {
        for server in [&setup.cluster, &Auth::none()] {
            let mut peer = tokio::io::join(bytes, tokio::io::sink());
            let _ = auth::accept(&mut peer, server, &[]).await;
        }
        let mut server = tokio::io::join(bytes, tokio::io::sink());
        let _ = auth::connect(&mut server, (&setup.cluster, VERSIONS_SPOKEN), ("fuzz", &[])).await;
    });
});
