//! The reconcilers: small I/O shells over a pure decision core ([`core`]).

pub mod backend_ops;
pub mod core;
