//! The controllers kube-controller-manager would run: garbage collection of dependents
//! and Namespace termination.

pub mod gc;
