pub mod bindings {
    pub mod placement {
        wit_bindgen::generate!({
            path: ["../wit/host", "../wit/placement"],
            world: "banlieue:placement/placement",
            pub_export_macro: true,
            export_macro_name: "export_placement_world",
            default_bindings_module: "banlieue_sdk::bindings::placement",
        });
    }
    pub mod provider {
        wit_bindgen::generate!({
            path: ["../wit/host", "../wit/provider"],
            world: "banlieue:provider/provider",
            pub_export_macro: true,
            export_macro_name: "export_provider_world",
            default_bindings_module: "banlieue_sdk::bindings::provider",
        });
    }
}
