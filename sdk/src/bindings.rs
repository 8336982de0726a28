//! Bindings generated from `wit/` once, here, so every guest shares them.
//!
//! The host capabilities are generated from one world (`banlieue:host/capabilities`)
//! and reused by the placement and provider worlds through `with`, so a
//! `log::Level` or an `Error` is the same Rust type everywhere. A component
//! only imports the capabilities it calls; unused ones are dropped when the
//! component is linked.

/// `banlieue:host@0.1.5`: the capability imports.
pub mod host {
    wit_bindgen::generate!({
        path: "../wit/host",
        world: "banlieue:host/capabilities",
        generate_all,
        additional_derives: [PartialEq, Eq],
    });
}

/// `banlieue:placement@0.2.0`: the placement world.
pub mod placement {
    wit_bindgen::generate!({
        path: ["../wit/host", "../wit/placement"],
        world: "banlieue:placement/placement",
        with: {
            "banlieue:host/types@0.1.5": crate::bindings::host::banlieue::host::types,
            "banlieue:host/log@0.1.5": crate::bindings::host::banlieue::host::log,
        },
        additional_derives: [PartialEq, Eq],
        pub_export_macro: true,
        export_macro_name: "export_placement_world",
        default_bindings_module: "banlieue_sdk::bindings::placement",
    });
}

/// `banlieue:provider@0.6.0`: the provider world.
pub mod provider {
    wit_bindgen::generate!({
        path: ["../wit/host", "../wit/provider"],
        world: "banlieue:provider/provider",
        with: {
            "banlieue:host/types@0.1.5": crate::bindings::host::banlieue::host::types,
            "banlieue:host/log@0.1.5": crate::bindings::host::banlieue::host::log,
            "banlieue:host/http@0.1.5": crate::bindings::host::banlieue::host::http,
            "banlieue:host/libvirt@0.1.5": crate::bindings::host::banlieue::host::libvirt,
            "banlieue:host/secrets@0.1.5": crate::bindings::host::banlieue::host::secrets,
            "banlieue:host/transfer@0.1.5": crate::bindings::host::banlieue::host::transfer,
        },
        additional_derives: [PartialEq, Eq],
        pub_export_macro: true,
        export_macro_name: "export_provider_world",
        default_bindings_module: "banlieue_sdk::bindings::provider",
    });
}
