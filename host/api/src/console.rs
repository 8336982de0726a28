//! The console subresources' wire protocol, shared by banlieue's console server and
//! `kubectl vm` (docs/console.md).

/// Where console paths start: `{PATH_PREFIX}NAMESPACE/virtualmachines/NAME/console` (or
/// `/vnc`) — the shape of an aggregated API's subresource, so that an `APIService` can route
/// to the console server unchanged.
pub const PATH_PREFIX: &str = "/apis/subresources.banlieue.io/v1alpha1/namespaces/";

/// The websocket close code of a session the VM's side ended (it stopped or restarted, or its
/// backend closed the console): a client may open it again. Every other close is final (the
/// user left, the VM was deleted or moved, a session bound was reached).
pub const CLOSE_VM_SIDE: u16 = 4001;
