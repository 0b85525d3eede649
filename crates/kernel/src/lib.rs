//! Runs hugelab workloads on the real Linux kernel. Not built yet (issue 3):
//! this crate exists so the workspace has the shape DESIGN.md describes, and
//! depends on the workload crate only.
