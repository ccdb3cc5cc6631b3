//! The reconcilers: small I/O shells over a pure decision core.
