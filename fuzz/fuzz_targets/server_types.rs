//! The REST API's request bodies, decoded as the server's JSON extractor does
//! (`serde_json::from_slice`), and the conversions the handlers apply to them.
#![no_main]

use libfuzzer_sys::fuzz_target;
use warren_server::types::{
    ConnectSandbox, ForkSandbox, NetworkConfig, NetworkUpdateBody, NewSandbox, NewSnapshot,
    PauseSandbox, SetTimeout,
};

fuzz_target!(|data: &[u8]| {
    if let Ok(body) = serde_json::from_slice::<NewSandbox>(data) {
        let _ = warren_server::types::lifecycle_of(&body);
        if let Some(network) = body.network {
            let _ = network.into_network(body.allow_internet_access);
        }
    }
    if let Ok(network) = serde_json::from_slice::<NetworkConfig>(data) {
        let _ = network.into_network(Some(false));
    }
    if let Ok(update) = serde_json::from_slice::<NetworkUpdateBody>(data) {
        let _ = update.into_update();
    }
    let _ = serde_json::from_slice::<PauseSandbox>(data);
    let _ = serde_json::from_slice::<NewSnapshot>(data);
    let _ = serde_json::from_slice::<ForkSandbox>(data);
    let _ = serde_json::from_slice::<ConnectSandbox>(data);
    let _ = serde_json::from_slice::<SetTimeout>(data);
});
