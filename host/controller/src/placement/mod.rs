//! Where a VM goes: the candidates a placement component may rank ([`scheduling`]), a
//! VMClass and VMImage in the chosen Provider's terms ([`resolve`]), and what a policy would
//! do now, without placing anything ([`explain`]).

pub mod explain;
pub mod resolve;
pub mod scheduling;
