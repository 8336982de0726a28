pub mod bindings {
    pub mod host {
        wit_bindgen::generate!({
            path: "../wit/host",
            world: "banlieue:host/capabilities",
            generate_all,
        });
    }
    pub mod placement {
        wit_bindgen::generate!({
            path: ["../wit/host", "../wit/placement"],
            world: "banlieue:placement/placement",
            with: {
                "banlieue:host/types@0.1.0": crate::bindings::host::banlieue::host::types,
                "banlieue:host/log@0.1.0": crate::bindings::host::banlieue::host::log,
            },
            pub_export_macro: true,
            export_macro_name: "export_placement_world",
            default_bindings_module: "banlieue_sdk::bindings::placement",
        });
    }
    pub mod provider {
        wit_bindgen::generate!({
            path: ["../wit/host", "../wit/provider"],
            world: "banlieue:provider/provider",
            with: {
                "banlieue:host/types@0.1.0": crate::bindings::host::banlieue::host::types,
                "banlieue:host/log@0.1.0": crate::bindings::host::banlieue::host::log,
                "banlieue:host/http@0.1.0": crate::bindings::host::banlieue::host::http,
                "banlieue:host/libvirt@0.1.0": crate::bindings::host::banlieue::host::libvirt,
                "banlieue:host/secrets@0.1.0": crate::bindings::host::banlieue::host::secrets,
            },
            pub_export_macro: true,
            export_macro_name: "export_provider_world",
            default_bindings_module: "banlieue_sdk::bindings::provider",
        });
    }
}
