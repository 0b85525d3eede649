//! `hugelab sweep`'s core, shared by the CLI's engine and the Python
//! package's: every workload × machine shape × setting as a plan of cells,
//! a cell's run on the model, the rows it gives, their writers (Parquet,
//! CSV, JSON) and the journal that makes a sweep resumable.
//!
//! An engine (local worker processes, or a Ray cluster's tasks) only moves
//! cells and outcomes, as plain serde data:
//!
//! 1. [`plan`] checks the inputs (one sentence for a missing workload, an
//!    unknown tunable, a bad machine shape) and lists the cells in the
//!    plan's order, each with a stable [`Cell::key`];
//! 2. [`Sweep::start`] reads back what an earlier run left (the output
//!    file's cells, the journal `OUT.partial`) and says which cells are
//!    left to run ([`Sweep::todo`]);
//! 3. [`run_cells`] runs cells anywhere (a worker process, a remote task),
//!    one [`Outcome`] per cell, each carrying the cell's key
//!    ([`run_cells_shipped`] where the workloads' bytes were shipped and the
//!    files are not there);
//! 4. [`Sweep::record`] takes outcomes in any order (a cell's second
//!    outcome, from a retried batch, is dropped), journaling each finished
//!    cell as it comes;
//! 5. [`Sweep::finish`] writes the rows of every finished cell in the
//!    plan's order (so the same inputs give the same bytes whatever order
//!    the cells finished in) to a temporary file renamed over the output,
//!    then drops the journal.
//!
//! docs/sweep.md describes the columns and the engines.

pub mod cell;
pub mod format;
pub mod plan;
pub mod resume;
pub mod summary;

pub use cell::{
    run_cell, run_cell_shipped, run_cells, run_cells_shipped, CellRows, Outcome, Row, RowRef,
    SnapshotValues, Taken,
};
pub use format::Format;
pub use plan::{parse_shape, plan, Cell, OWN_MACHINE};
pub use resume::{Finished, Sweep};
