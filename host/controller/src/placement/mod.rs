//! Where a VM goes: the candidates a placement component may rank ([`scheduling`]), and a
//! VMClass and VMImage in the chosen Provider's terms ([`resolve`]).

pub mod resolve;
pub mod scheduling;
